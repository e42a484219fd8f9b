//! Configurations as typed values: a [`Forwarder`] builder whose parts
//! (endpoints, filters, branches, sessions) are built by name and key,
//! then written out as the TOML the binary and `load_str` read. Every
//! name a test gives is prefixed with nothing; queues are named by the
//! test (usually `<prefix>.<name>`).
//!
//! ```ignore
//! let toml = Forwarder::new(&p)
//!     .endpoint(Endpoint::queue("service", &format!("{p}.service")))
//!     .filter("all", Filter::match_all())
//!     .branch(Branch::new("service", "all", "service"))
//!     .toml();
//! ```

use super::amqp_url;
use std::fmt::{self, Write as _};

/// A TOML value: text, a number, a boolean, a list, or an inline table.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Text(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    List(Vec<Value>),
    Table(Vec<(String, Value)>),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Text(s) => write!(f, "{s:?}"),
            Self::Int(n) => write!(f, "{n}"),
            Self::Float(x) => write!(f, "{x:?}"),
            Self::Bool(b) => write!(f, "{b}"),
            Self::List(items) => {
                let items: Vec<String> = items.iter().map(Value::to_string).collect();
                write!(f, "[{}]", items.join(", "))
            }
            Self::Table(entries) => {
                let entries: Vec<String> = entries
                    .iter()
                    .map(|(k, v)| format!("{} = {v}", key(k)))
                    .collect();
                write!(f, "{{ {} }}", entries.join(", "))
            }
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Self::Text(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Self::Text(s)
    }
}

impl From<&String> for Value {
    fn from(s: &String) -> Self {
        Self::Text(s.clone())
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Self::Int(n)
    }
}

impl From<u32> for Value {
    fn from(n: u32) -> Self {
        Self::Int(i64::from(n))
    }
}

impl From<u64> for Value {
    fn from(n: u64) -> Self {
        Self::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

impl From<usize> for Value {
    fn from(n: usize) -> Self {
        Self::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

impl From<i32> for Value {
    fn from(n: i32) -> Self {
        Self::Int(i64::from(n))
    }
}

impl From<f64> for Value {
    fn from(x: f64) -> Self {
        Self::Float(x)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Self::Bool(b)
    }
}

impl<T: Into<Value> + Clone> From<&[T]> for Value {
    fn from(items: &[T]) -> Self {
        Self::List(items.iter().cloned().map(Into::into).collect())
    }
}

impl<T: Into<Value> + Clone, const N: usize> From<[T; N]> for Value {
    fn from(items: [T; N]) -> Self {
        Self::List(items.into_iter().map(Into::into).collect())
    }
}

/// A bare key when it can be one, quoted otherwise.
fn key(name: &str) -> String {
    let bare = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        name.to_owned()
    } else {
        format!("{name:?}")
    }
}

/// Keys of one table, in the order they were set; a key set again
/// replaces the earlier value.
#[derive(Debug, Clone, Default)]
struct Keys(Vec<(String, Value)>);

impl Keys {
    fn set(&mut self, name: &str, value: impl Into<Value>) {
        let value = value.into();
        match self.0.iter_mut().find(|(k, _)| k == name) {
            Some(entry) => entry.1 = value,
            None => self.0.push((name.to_owned(), value)),
        }
    }

    fn has(&self, name: &str) -> bool {
        self.0.iter().any(|(k, _)| k == name)
    }

    fn unset(&mut self, name: &str) {
        self.0.retain(|(k, _)| k != name);
    }

    fn write(&self, out: &mut String) {
        for (k, v) in &self.0 {
            let _ = writeln!(out, "{} = {v}", key(k));
        }
    }
}

/// `[endpoints.NAME]`.
#[derive(Debug, Clone)]
pub struct Endpoint {
    name: String,
    keys: Keys,
}

impl Endpoint {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Publishes through the default exchange to `queue` on broker
    /// `main`, declaring it at start.
    pub fn queue(name: &str, queue: &str) -> Self {
        let mut keys = Keys::default();
        keys.set("broker", "main");
        keys.set("routing_key", queue);
        keys.set("declare_queue", queue);
        Self {
            name: name.to_owned(),
            keys,
        }
    }

    /// Publishes to exchange `exchange` with routing key `routing_key` on
    /// broker `main`, declaring nothing.
    pub fn exchange(name: &str, exchange: &str, routing_key: &str) -> Self {
        let mut keys = Keys::default();
        keys.set("broker", "main");
        keys.set("exchange", exchange);
        keys.set("routing_key", routing_key);
        Self {
            name: name.to_owned(),
            keys,
        }
    }

    /// Does not declare its queue.
    pub fn undeclared(mut self) -> Self {
        self.keys.unset("declare_queue");
        self
    }

    /// On broker `broker` instead of `main`.
    pub fn on(self, broker: &str) -> Self {
        self.set("broker", broker)
    }

    /// Any other key (`retries`, `confirm_timeout_ms`, `exchange`, ...).
    pub fn set(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.keys.set(name, value);
        self
    }
}

/// `[filters.NAME]`: a kind and its keys.
#[derive(Debug, Clone)]
pub struct Filter {
    keys: Keys,
}

impl Filter {
    fn of(kind: &str) -> Self {
        let mut keys = Keys::default();
        keys.set("type", kind);
        Self { keys }
    }

    pub fn match_all() -> Self {
        Self::of("match_all")
    }

    /// `header` on header `name`; add its test with [`Self::set`].
    pub fn header(name: &str) -> Self {
        Self::of("header").set("header", name)
    }

    /// `property` on property `name`.
    pub fn property(name: &str) -> Self {
        Self::of("property").set("property", name)
    }

    /// `routing_key` with topic `pattern`.
    pub fn routing_key(pattern: &str) -> Self {
        Self::of("routing_key").set("pattern", pattern)
    }

    /// `json` at `pointer`.
    pub fn json(pointer: &str) -> Self {
        Self::of("json").set("pointer", pointer)
    }

    /// `xpath` with `expression`.
    pub fn xpath(expression: &str) -> Self {
        Self::of("xpath").set("expression", expression)
    }

    /// `and` / `or` over the named filters.
    pub fn all_of(filters: &[&str]) -> Self {
        Self::of("and").set("filters", filters)
    }

    pub fn any_of(filters: &[&str]) -> Self {
        Self::of("or").set("filters", filters)
    }

    /// `not` of the named filter.
    pub fn not(filter: &str) -> Self {
        Self::of("not").set("filter", filter)
    }

    /// A key: `equals`, `exists`, `regex`, `in`, `namespaces`, ...
    pub fn set(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.keys.set(name, value);
        self
    }

    /// Namespace `prefix` for `uri` in the `namespaces` table of an
    /// `xpath` filter, after any given before.
    pub fn namespace(mut self, prefix: &str, uri: &str) -> Self {
        let mut entries = match self.keys.0.iter().find(|(k, _)| k == "namespaces") {
            Some((_, Value::Table(entries))) => entries.clone(),
            _ => Vec::new(),
        };
        entries.retain(|(k, _)| k != prefix);
        entries.push((prefix.to_owned(), Value::from(uri)));
        self.keys.set("namespaces", Value::Table(entries));
        self
    }
}

/// One `[[filter_table]]` entry.
#[derive(Debug, Clone)]
pub struct Branch {
    keys: Keys,
}

impl Branch {
    /// Branch `name`: `filter` routes to `endpoint`.
    pub fn new(name: &str, filter: &str, endpoint: &str) -> Self {
        let mut keys = Keys::default();
        keys.set("name", name);
        keys.set("filter", filter);
        keys.set("endpoint", endpoint);
        Self { keys }
    }

    /// Branch `name`: `filter` routes to whatever services register
    /// (`registrable = true`, no endpoint of its own).
    pub fn registrable(name: &str, filter: &str) -> Self {
        let mut keys = Keys::default();
        keys.set("name", name);
        keys.set("filter", filter);
        keys.set("registrable", true);
        Self { keys }
    }

    /// With the backup list `list` (a key of `[backup_lists]`).
    pub fn backups(self, list: &str) -> Self {
        self.set("backup_list", list)
    }

    /// Any other key (`priority`, `strategy`, `required`, `outage`, ...).
    pub fn set(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.keys.set(name, value);
        self
    }
}

/// A whole configuration.
#[derive(Debug, Clone)]
pub struct Forwarder {
    top: Keys,
    inbound: Keys,
    dead_letter: Keys,
    brokers: Vec<(String, Keys)>,
    endpoints: Vec<Endpoint>,
    backup_lists: Keys,
    filters: Vec<(String, Filter)>,
    branches: Vec<Branch>,
    sessions: Option<Keys>,
    admin: Option<Keys>,
    http: Option<Keys>,
    /// `[journal]`: by default the stream `<prefix>.journal`, so a test's
    /// records go with its other queues.
    journal: Option<Keys>,
    /// `[telemetry.otlp]`, when set.
    otlp: Option<Keys>,
    /// `[control]`: by default the stream `<prefix>.control`, so a test's
    /// commands go with its other queues.
    control: Option<Keys>,
    /// Whether `[inbound]` and `[dead_letter]` are written.
    queue: bool,
}

impl Forwarder {
    /// Instance `prefix` on the shared broker as `main`: inbound queue
    /// `<prefix>.in` (prefetch 500), dead letters by `nack` through
    /// exchange `<prefix>.dlx` to queue `<prefix>.dlq`, a 5 s shutdown
    /// bound. No endpoint, filter or branch yet.
    pub fn new(prefix: &str) -> Self {
        Self::at(&amqp_url(), prefix)
    }

    /// [`Self::new`] with broker `main` at `url` (a private node, say).
    pub fn at(url: &str, prefix: &str) -> Self {
        let mut top = Keys::default();
        top.set("name", prefix);
        top.set("shutdown_timeout_ms", 5000);
        let mut inbound = Keys::default();
        inbound.set("broker", "main");
        inbound.set("queue", format!("{prefix}.in"));
        inbound.set("prefetch", 500);
        let mut dead_letter = Keys::default();
        dead_letter.set("mode", "nack");
        dead_letter.set("exchange", format!("{prefix}.dlx"));
        dead_letter.set("routing_key", format!("{prefix}.dlq"));
        dead_letter.set("queue", format!("{prefix}.dlq"));
        let mut main = Keys::default();
        main.set("uri", url);
        let mut journal = Keys::default();
        journal.set("stream", format!("{prefix}.journal"));
        let mut control = Keys::default();
        control.set("stream", format!("{prefix}.control"));
        Self {
            top,
            inbound,
            dead_letter,
            brokers: vec![("main".to_owned(), main)],
            endpoints: Vec::new(),
            backup_lists: Keys::default(),
            filters: Vec::new(),
            branches: Vec::new(),
            sessions: None,
            admin: None,
            http: None,
            journal: Some(journal),
            otlp: None,
            control: Some(control),
            queue: true,
        }
    }

    /// `[journal]`: `key` set to `value` (the stream stays `<prefix>.journal`
    /// unless set here).
    pub fn journal(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.journal
            .get_or_insert_with(Keys::default)
            .set(key, value);
        self
    }

    /// `[control]`: `key` set to `value` (the stream stays `<prefix>.control`
    /// unless set here).
    pub fn control(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.control
            .get_or_insert_with(Keys::default)
            .set(key, value);
        self
    }

    /// No `[control]` table: the shipped default (the stream
    /// `switchyard.control`), in a file a build from before `[control]`
    /// reads too.
    pub fn default_control(mut self) -> Self {
        self.control = None;
        self
    }

    /// `[telemetry.otlp]` exporting to `endpoint`.
    pub fn otlp(mut self, endpoint: &str) -> Self {
        let mut table = Keys::default();
        table.set("endpoint", endpoint);
        self.otlp = Some(table);
        self
    }

    /// A top-level key (`shutdown_timeout_ms`, `worker_threads`, ...).
    pub fn top(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.top.set(name, value);
        self
    }

    /// An `[inbound]` key.
    pub fn inbound(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.inbound.set(name, value);
        self
    }

    /// A `[dead_letter]` key; `mode` most often.
    pub fn dead_letter(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.dead_letter.set(name, value);
        self
    }

    /// `dead_letter.mode`.
    pub fn mode(self, mode: &str) -> Self {
        self.dead_letter("mode", mode)
    }

    /// No `dead_letter.queue`: the forwarder declares and binds no
    /// dead-letter queue (and `dlq` has none to read).
    pub fn no_dead_letter_queue(mut self) -> Self {
        self.dead_letter.unset("queue");
        self
    }

    /// Another broker, or `main` at another URI.
    pub fn broker(mut self, name: &str, uri: &str) -> Self {
        self.brokers.retain(|(n, _)| n != name);
        let mut keys = Keys::default();
        keys.set("uri", uri);
        self.brokers.push((name.to_owned(), keys));
        self
    }

    /// Broker `name` (`main`, say) as a cluster: `uris`, the nodes in
    /// order of preference, instead of one `uri`.
    pub fn broker_nodes(mut self, name: &str, uris: &[String]) -> Self {
        self.brokers.retain(|(n, _)| n != name);
        let mut keys = Keys::default();
        keys.set("uris", uris);
        self.brokers.push((name.to_owned(), keys));
        self
    }

    pub fn endpoint(mut self, endpoint: Endpoint) -> Self {
        self.endpoints.retain(|e| e.name != endpoint.name);
        self.endpoints.push(endpoint);
        self
    }

    /// `[backup_lists]` entry `name`.
    pub fn backup_list(mut self, name: &str, endpoints: &[&str]) -> Self {
        self.backup_lists.set(name, endpoints);
        self
    }

    pub fn filter(mut self, name: &str, filter: Filter) -> Self {
        self.filters.retain(|(n, _)| n != name);
        self.filters.push((name.to_owned(), filter));
        self
    }

    pub fn branch(mut self, branch: Branch) -> Self {
        self.branches.push(branch);
        self
    }

    /// `[sessions]`, enabled, with `keys` set.
    pub fn sessions(mut self, keys: &[(&str, Value)]) -> Self {
        let mut table = Keys::default();
        table.set("enabled", true);
        for (k, v) in keys {
            table.set(k, v.clone());
        }
        self.sessions = Some(table);
        self
    }

    /// `[admin] listen`.
    pub fn admin(mut self, listen: &str) -> Self {
        self.admin
            .get_or_insert_with(Keys::default)
            .set("listen", listen);
        self
    }

    /// An `[admin]` key (`tokens`, `max_registrations`).
    pub fn admin_key(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.admin.get_or_insert_with(Keys::default).set(key, value);
        self
    }

    /// `[ingress.http]` with `keys` set; `listen` defaults to a loopback
    /// port that tests replace with a listener of their own.
    pub fn http(mut self, keys: &[(&str, Value)]) -> Self {
        let mut table = self.http.take().unwrap_or_default();
        if !table.has("listen") {
            table.set("listen", "127.0.0.1:0");
        }
        for (k, v) in keys {
            table.set(k, v.clone());
        }
        self.http = Some(table);
        self
    }

    /// Neither `[inbound]` nor `[dead_letter]`: a forwarder fed by its HTTP
    /// ingress alone.
    pub fn without_queue(mut self) -> Self {
        self.queue = false;
        self
    }

    /// The seed scenario's shape: branches "service" and "logging" over
    /// every message, each with a one-endpoint backup list; queues
    /// `<p>.service`, `<p>.service.backup`, `<p>.logging`,
    /// `<p>.logging.backup`.
    pub fn seed(self, p: &str) -> Self {
        self.seed_with(p, |endpoint| endpoint)
    }

    /// [`Self::seed`] with each endpoint passed through `adapt` (made
    /// [`Endpoint::undeclared`], say, for queues the test declares itself).
    pub fn seed_with(self, p: &str, adapt: impl Fn(Endpoint) -> Endpoint) -> Self {
        let mut this = self;
        for (name, queue) in [
            ("service", "service"),
            ("service_backup", "service.backup"),
            ("logging", "logging"),
            ("logging_backup", "logging.backup"),
        ] {
            this = this.endpoint(adapt(Endpoint::queue(name, &format!("{p}.{queue}"))));
        }
        this.backup_list("service_backups", &["service_backup"])
            .backup_list("logging_backups", &["logging_backup"])
            .filter("all", Filter::match_all())
            .branch(Branch::new("service", "all", "service").backups("service_backups"))
            .branch(Branch::new("logging", "all", "logging").backups("logging_backups"))
    }

    /// The smallest forwarding shape: one branch "service" over every
    /// message to queue `<p>.service`, no backup list.
    pub fn match_all(self, p: &str) -> Self {
        self.endpoint(Endpoint::queue("service", &format!("{p}.service")))
            .filter("all", Filter::match_all())
            .branch(Branch::new("service", "all", "service"))
    }

    /// Every queue it declares a quorum queue: the inbound queue, the
    /// dead-letter queue if it has one, and the `declare_queue` of every
    /// endpoint added so far.
    pub fn quorum(mut self) -> Self {
        self.inbound.set("queue_type", "quorum");
        if self.dead_letter.has("queue") {
            self.dead_letter.set("queue_type", "quorum");
        }
        for endpoint in &mut self.endpoints {
            if endpoint.keys.has("declare_queue") {
                endpoint.keys.set("declare_queue_type", "quorum");
            }
        }
        self
    }

    /// The TOML text.
    pub fn toml(&self) -> String {
        let mut out = String::new();
        self.top.write(&mut out);
        for (title, table) in [
            ("inbound", &self.inbound),
            ("dead_letter", &self.dead_letter),
        ] {
            if !self.queue {
                continue;
            }
            let _ = writeln!(out, "\n[{title}]");
            table.write(&mut out);
        }
        for (name, keys) in &self.brokers {
            let _ = writeln!(out, "\n[brokers.{}]", key(name));
            keys.write(&mut out);
        }
        out.push_str(&self.routing_toml());
        // In the whole file only: a routing part is appended to a top
        // written by `toml` too, and a table may be written once.
        for (title, table) in [
            ("journal", &self.journal),
            ("telemetry.otlp", &self.otlp),
            ("control", &self.control),
        ] {
            if let Some(table) = table {
                let _ = writeln!(out, "\n[{title}]");
                table.write(&mut out);
            }
        }
        out
    }

    /// Only the endpoints, backup lists, filters, branches, sessions and
    /// admin: what follows a top written otherwise.
    pub fn routing_toml(&self) -> String {
        let mut out = String::new();
        for endpoint in &self.endpoints {
            let _ = writeln!(out, "\n[endpoints.{}]", key(&endpoint.name));
            endpoint.keys.write(&mut out);
        }
        if !self.backup_lists.0.is_empty() {
            out.push_str("\n[backup_lists]\n");
            self.backup_lists.write(&mut out);
        }
        for (name, filter) in &self.filters {
            let _ = writeln!(out, "\n[filters.{}]", key(name));
            filter.keys.write(&mut out);
        }
        for branch in &self.branches {
            out.push_str("\n[[filter_table]]\n");
            branch.keys.write(&mut out);
        }
        for (title, table) in [
            ("sessions", &self.sessions),
            ("admin", &self.admin),
            ("ingress.http", &self.http),
        ] {
            if let Some(table) = table {
                let _ = writeln!(out, "\n[{title}]");
                table.write(&mut out);
            }
        }
        out
    }
}
