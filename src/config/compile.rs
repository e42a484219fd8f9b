//! [`compile`]: raw configuration → [`Settings`], or the first invalid key.

use super::Compiled;
use super::error::InvalidKey;
use super::ingress::listen_address;
use super::raw::{
    RawBroker, RawConfig, RawDeadLetter, RawEndpoint, RawFilter, RawFilterEntry, RawInbound,
    RawSessions, RawXPathFilter, ScalarValue,
};
use super::{BrokerSpec, Inbound, Sessions, Settings, Tls};
use crate::config::{IdentityError, read_ca_file, read_client_identity};
use crate::destination::{DeadLetter, DeadLetterMode, Endpoint, QueueType};
use crate::routing::{
    Branch, Filter, JsonPointer, Outage, Property, RoutingTable, Strategy, TopicPattern, ValueTest,
    XPathTest,
};
use crate::uri::validate_uri;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

type Result<T> = std::result::Result<T, InvalidKey>;

/// Validates `raw` and resolves every name in it.
pub fn compile(raw: &RawConfig) -> Result<Settings> {
    if raw.name.trim().is_empty() {
        return Err(InvalidKey::new("name", "must not be empty"));
    }
    let brokers = compile_brokers(raw)?;
    let known_broker = |key: &str, name: &str| -> Result<()> {
        if brokers.contains_key(name) {
            Ok(())
        } else {
            Err(InvalidKey::new(
                key,
                format!("unknown broker \"{name}\" (defined: {})", names(&brokers)),
            ))
        }
    };

    let queue = match (&raw.inbound, &raw.dead_letter) {
        (Some(inbound), Some(dead_letter)) => Some(compile_queue(
            inbound,
            dead_letter,
            &brokers,
            &known_broker,
        )?),
        (Some(_), None) => {
            return Err(InvalidKey::new(
                "dead_letter",
                "missing; add a [dead_letter] table (where messages go when they cannot be \
                 forwarded)",
            ));
        }
        (None, Some(_)) => {
            return Err(InvalidKey::new(
                "dead_letter",
                "applies only with [inbound]; remove it, or add the [inbound] queue to consume",
            ));
        }
        (None, None) if raw.ingress.http.is_none() => {
            return Err(InvalidKey::new(
                "inbound",
                "missing; add an [inbound] queue to consume, an [ingress.http] listener, or both",
            ));
        }
        (None, None) => None,
    };
    let prefetch = queue.as_ref().map(|(inbound, _)| inbound.prefetch);

    let mut endpoints = BTreeMap::new();
    for (name, e) in &raw.endpoints {
        let key = |k: &str| format!("endpoints.{name}.{k}");
        known_broker(&key("broker"), &e.broker)?;
        if e.confirm_timeout_ms == 0 {
            return Err(InvalidKey::new(
                key("confirm_timeout_ms"),
                "must be greater than 0",
            ));
        }
        if e.exchange.is_empty() && e.routing_key.is_empty() {
            return Err(InvalidKey::new(
                key("routing_key"),
                "must name the destination queue when exchange is the default exchange (\"\")",
            ));
        }
        if e.probe_interval_ms == 0 {
            return Err(InvalidKey::new(
                key("probe_interval_ms"),
                "must be greater than 0",
            ));
        }
        check_endpoint_loop(name, e, raw, &brokers)?;
        let declare_queue_type = match (&e.declare_queue_type, &e.declare_queue) {
            (None, _) => QueueType::Classic,
            (Some(_), None) => {
                return Err(InvalidKey::new(
                    key("declare_queue_type"),
                    "applies only with declare_queue; set declare_queue or remove it",
                ));
            }
            (Some(t), Some(_)) => queue_type(&key("declare_queue_type"), t)?,
        };
        endpoints.insert(
            name.clone(),
            Arc::new(Endpoint {
                name: name.clone(),
                broker: e.broker.clone(),
                exchange: e.exchange.clone(),
                routing_key: e.routing_key.clone(),
                declare_queue: e.declare_queue.clone(),
                confirm_timeout: Duration::from_millis(e.confirm_timeout_ms),
                retries: e.retries,
                headers: e.headers.clone().into_iter().collect(),
                declare_queue_type,
                probe_interval: Duration::from_millis(e.probe_interval_ms),
            }),
        );
    }

    for (list, members) in &raw.backup_lists {
        if members.is_empty() {
            return Err(InvalidKey::new(
                format!("backup_lists.{list}"),
                "is empty; list at least one endpoint or remove it",
            ));
        }
        for (i, member) in members.iter().enumerate() {
            if !endpoints.contains_key(member) {
                return Err(InvalidKey::new(
                    format!("backup_lists.{list}[{i}]"),
                    format!(
                        "unknown endpoint \"{member}\" (defined: {})",
                        names(&endpoints)
                    ),
                ));
            }
        }
    }

    let mut filters = FilterCompiler::new(&raw.filters);
    for name in raw.filters.keys() {
        filters.compile(name)?;
    }

    if raw.filter_table.is_empty() {
        return Err(InvalidKey::new(
            "filter_table",
            "has no entries; add at least one [[filter_table]]",
        ));
    }
    let mut branches = Vec::new();
    let mut seen_names = HashSet::new();
    for (i, entry) in raw.filter_table.iter().enumerate() {
        let branch = compile_entry(i, entry, raw, &endpoints, &mut filters)?;
        if !seen_names.insert(branch.name().to_owned()) {
            return Err(InvalidKey::new(
                format!("filter_table[{i}].name"),
                format!(
                    "branch name \"{}\" is used twice; names must be unique",
                    branch.name()
                ),
            ));
        }
        branches.push(branch);
    }

    let sessions = compile_sessions(&raw.sessions, prefetch)?;
    let admin_listen = match &raw.admin.listen {
        None => None,
        Some(addr) => Some(listen_address(addr).ok_or_else(|| {
            InvalidKey::new(
                "admin.listen",
                format!("\"{addr}\" is not a host:port address (or a port, for loopback)"),
            )
        })?),
    };

    let http = match &raw.ingress.http {
        Some(http) => Some(super::ingress::compile_http(
            http,
            prefetch.unwrap_or(1000),
        )?),
        None => None,
    };

    Ok(Settings {
        name: raw.name.clone(),
        shutdown_timeout: Duration::from_millis(raw.shutdown_timeout_ms),
        worker_threads: (raw.worker_threads > 0).then_some(usize::from(raw.worker_threads)),
        inbound: queue.as_ref().map(|(inbound, _)| inbound.clone()),
        dead_letter: queue.map(|(_, dead_letter)| dead_letter),
        brokers,
        endpoints,
        routing: Arc::new(RoutingTable::new(branches)),
        admin_listen,
        sessions,
        http,
        compiled: Compiled::new(),
    })
}

/// `[sessions]`: `None` when disabled. Open sessions hold their messages'
/// prefetch slots until they end, so they must never be able to hold all of
/// them: something else has to be able to arrive (their next message).
fn compile_sessions(raw: &RawSessions, prefetch: Option<u16>) -> Result<Option<Sessions>> {
    if !raw.enabled {
        return Ok(None);
    }
    for (key, value) in [
        ("id_header", &raw.id_header),
        ("end_header", &raw.end_header),
    ] {
        if value.is_empty() {
            return Err(InvalidKey::new(
                format!("sessions.{key}"),
                "is empty; name the header",
            ));
        }
    }
    if raw.id_header == raw.end_header {
        return Err(InvalidKey::new(
            "sessions.end_header",
            "is the same header as sessions.id_header; use two headers",
        ));
    }
    for (key, value) in [
        ("idle_timeout_ms", raw.idle_timeout_ms),
        ("max_messages", u64::from(raw.max_messages)),
        ("max_bytes", raw.max_bytes),
        ("max_open", u64::from(raw.max_open)),
    ] {
        if value == 0 {
            return Err(InvalidKey::new(
                format!("sessions.{key}"),
                "must be at least 1",
            ));
        }
    }
    let held = u64::from(raw.max_open) * u64::from(raw.max_messages);
    if let Some(prefetch) = prefetch.filter(|p| held >= u64::from(*p)) {
        return Err(InvalidKey::new(
            "sessions.max_open",
            format!(
                "max_open ({}) x max_messages ({}) = {held} must stay below inbound.prefetch \
                 ({prefetch}), or open sessions could hold every prefetch slot and wait \
                 forever for messages that cannot arrive; lower them or raise the prefetch",
                raw.max_open, raw.max_messages
            ),
        ));
    }
    Ok(Some(Sessions {
        id_header: raw.id_header.clone(),
        end_header: raw.end_header.clone(),
        idle_timeout: Duration::from_millis(raw.idle_timeout_ms),
        max_messages: raw.max_messages,
        max_bytes: raw.max_bytes,
        max_open: raw.max_open,
        closed_ttl: Duration::from_millis(raw.closed_ttl_ms),
    }))
}

fn compile_brokers(raw: &RawConfig) -> Result<BTreeMap<String, Arc<BrokerSpec>>> {
    if raw.brokers.is_empty() {
        return Err(InvalidKey::new(
            "brokers",
            "no broker defined; add a [brokers.NAME] with a uri",
        ));
    }
    raw.brokers
        .iter()
        .map(|(name, b)| {
            let uris = broker_uris(name, b)?;
            let tls = compile_tls(name, b, uris[0].starts_with("amqps://"))?;
            let spec = BrokerSpec::cluster(name, uris).with_tls(tls);
            Ok((name.clone(), Arc::new(spec)))
        })
        .collect()
}

/// A broker's node URIs, preferred first: its `uri`, or its `uris`, which
/// must agree on scheme, vhost and user (one broker, several nodes).
fn broker_uris(name: &str, b: &RawBroker) -> Result<Vec<String>> {
    let key = |k: &str| format!("brokers.{name}.{k}");
    let uris = match (&b.uri, &b.uris) {
        (Some(uri), None) => {
            validate_uri(uri).map_err(|why| InvalidKey::new(key("uri"), why))?;
            return Ok(vec![uri.clone()]);
        }
        (Some(_), Some(_)) => {
            return Err(InvalidKey::new(
                key("uris"),
                "give either uri (one node) or uris (a cluster's nodes), not both",
            ));
        }
        (None, None) => {
            return Err(InvalidKey::new(
                key("uri"),
                "missing; give uri (one node) or uris (a cluster's nodes, preferred first)",
            ));
        }
        (None, Some(uris)) => uris,
    };
    let Some(first) = uris.first() else {
        return Err(InvalidKey::new(
            key("uris"),
            "is empty; list the cluster's nodes, preferred first",
        ));
    };
    let identity = |uri: &str| {
        let parsed = lapin::uri::AMQPUri::from_str(uri).ok()?;
        let scheme = uri.split_once("://").map(|(s, _)| s.to_owned())?;
        Some((scheme, parsed.vhost, parsed.authority.userinfo.username))
    };
    for (i, uri) in uris.iter().enumerate() {
        let at = format!("brokers.{name}.uris[{i}]");
        validate_uri(uri).map_err(|why| InvalidKey::new(at.clone(), why))?;
        let (Some(ours), Some(theirs)) = (identity(uri), identity(first)) else {
            continue;
        };
        let differs = |what: &str, a: &str, b: &str| {
            InvalidKey::new(
                at.clone(),
                format!(
                    "{what} \"{a}\" differs from uris[0]'s \"{b}\"; the nodes of one broker share \
                     {what}, list another cluster as another broker"
                ),
            )
        };
        if ours.0 != theirs.0 {
            return Err(differs("scheme", &ours.0, &theirs.0));
        }
        if ours.1 != theirs.1 {
            return Err(differs("vhost", &ours.1, &theirs.1));
        }
        if ours.2 != theirs.2 {
            return Err(differs("user", &ours.2, &theirs.2));
        }
    }
    Ok(uris.clone())
}

/// Reads and checks the PEM files of an `amqps://` broker.
fn compile_tls(name: &str, b: &RawBroker, amqps: bool) -> Result<Tls> {
    let key = |k: &str| format!("brokers.{name}.{k}");
    let files = [
        ("ca_file", &b.ca_file),
        ("client_cert_file", &b.client_cert_file),
        ("client_key_file", &b.client_key_file),
    ];
    if !amqps {
        if let Some((k, _)) = files.iter().find(|(_, f)| f.is_some()) {
            return Err(InvalidKey::new(
                key(k),
                "applies only to an amqps:// uri; use amqps:// or remove it",
            ));
        }
        return Ok(Tls::default());
    }
    let ca_pem = match &b.ca_file {
        None => None,
        Some(path) => Some(read_ca_file(path).map_err(|why| InvalidKey::new(key("ca_file"), why))?),
    };
    let client = match (&b.client_cert_file, &b.client_key_file) {
        (None, None) => None,
        (Some(_), None) => {
            return Err(InvalidKey::new(
                key("client_key_file"),
                "missing: client_cert_file needs its private key; set both or neither",
            ));
        }
        (None, Some(_)) => {
            return Err(InvalidKey::new(
                key("client_cert_file"),
                "missing: client_key_file needs its certificate; set both or neither",
            ));
        }
        (Some(cert), Some(private)) => {
            Some(read_client_identity(cert, private).map_err(|e| match e {
                IdentityError::Cert(why) => InvalidKey::new(key("client_cert_file"), why),
                IdentityError::Key(why) => InvalidKey::new(key("client_key_file"), why),
            })?)
        }
    };
    Ok(Tls { ca_pem, client })
}

fn compile_dead_letter(d: &RawDeadLetter, inbound_queue: &str) -> Result<DeadLetter> {
    let mode = match d.mode.as_str() {
        "nack" => DeadLetterMode::Nack,
        "republish" => DeadLetterMode::Republish,
        other => {
            return Err(InvalidKey::new(
                "dead_letter.mode",
                format!("unknown mode \"{other}\" (expected \"nack\" or \"republish\")"),
            ));
        }
    };
    if d.exchange.is_empty() && d.routing_key.is_empty() {
        return Err(InvalidKey::new(
            "dead_letter.routing_key",
            "must name the dead-letter queue when exchange is the default exchange (\"\")",
        ));
    }
    if d.queue.as_deref() == Some("") {
        return Err(InvalidKey::new(
            "dead_letter.queue",
            "must not be empty; omit it instead",
        ));
    }
    if d.queue.is_some() && d.exchange.is_empty() {
        return Err(InvalidKey::new(
            "dead_letter.queue",
            "cannot be bound to the default exchange; name a dead_letter.exchange",
        ));
    }
    if d.exchange.is_empty() && d.routing_key == inbound_queue {
        return Err(InvalidKey::new(
            "dead_letter.routing_key",
            format!(
                "publishing dead letters to \"{inbound_queue}\" through the default exchange \
                 would route every dead letter back into the inbound queue (a dead-letter loop); \
                 name the dead-letter queue"
            ),
        ));
    }
    if d.queue.as_deref() == Some(inbound_queue) {
        return Err(InvalidKey::new(
            "dead_letter.queue",
            format!(
                "\"{inbound_queue}\" is the inbound queue: binding it to dead_letter.exchange \
                 would route every dead letter back into the inbound queue (a dead-letter loop); \
                 name another queue"
            ),
        ));
    }
    let dlq_type = match (&d.queue_type, &d.queue) {
        (None, _) => QueueType::Classic,
        (Some(_), None) => {
            return Err(InvalidKey::new(
                "dead_letter.queue_type",
                "applies only with dead_letter.queue; set dead_letter.queue or remove it",
            ));
        }
        (Some(t), Some(_)) => queue_type("dead_letter.queue_type", t)?,
    };
    Ok(DeadLetter {
        mode,
        exchange: d.exchange.clone(),
        routing_key: d.routing_key.clone(),
        queue: d.queue.clone(),
        queue_type: dlq_type,
    })
}

/// Refuses an endpoint that publishes straight back into the inbound queue
/// (docs/configuration.md): on the inbound's broker (by name, or by host, port and vhost),
/// through the default exchange with the inbound queue as routing key, or
/// declaring the inbound queue as its destination.
fn check_endpoint_loop(
    name: &str,
    e: &RawEndpoint,
    raw: &RawConfig,
    brokers: &BTreeMap<String, Arc<BrokerSpec>>,
) -> Result<()> {
    let Some(inbound) = &raw.inbound else {
        return Ok(());
    };
    let broker = if e.broker == inbound.broker {
        format!("broker \"{}\", the inbound's broker", e.broker)
    } else {
        match (brokers.get(&e.broker), brokers.get(&inbound.broker)) {
            (Some(ours), Some(theirs)) if ours.same_vhost_as(theirs) => {
                format!(
                    "broker \"{}\", which has the host, port and vhost of the inbound's broker \"{}\"",
                    e.broker, inbound.broker
                )
            }
            _ => return Ok(()),
        }
    };
    let queue = &inbound.queue;
    let (key, what) = if e.exchange.is_empty() && e.routing_key == *queue {
        (
            "routing_key",
            format!("publishing to \"{queue}\" through the default exchange of {broker},"),
        )
    } else if e.declare_queue.as_ref() == Some(queue) {
        (
            "declare_queue",
            format!("\"{queue}\" is the inbound queue on {broker}: this endpoint"),
        )
    } else {
        return Ok(());
    };
    Err(InvalidKey::new(
        format!("endpoints.{name}.{key}"),
        format!(
            "{what} would route every copy back into the inbound queue (a forwarding loop); \
             name another queue"
        ),
    ))
}

fn queue_type(key: &str, value: &str) -> Result<QueueType> {
    match value {
        "classic" => Ok(QueueType::Classic),
        "quorum" => Ok(QueueType::Quorum),
        other => Err(InvalidKey::new(
            key,
            format!("unknown queue type \"{other}\" (expected \"classic\" or \"quorum\")"),
        )),
    }
}

fn compile_entry(
    i: usize,
    entry: &RawFilterEntry,
    raw: &RawConfig,
    endpoints: &BTreeMap<String, Arc<Endpoint>>,
    filters: &mut FilterCompiler<'_>,
) -> Result<Branch> {
    let key = |k: &str| format!("filter_table[{i}].{k}");
    if !raw.filters.contains_key(&entry.filter) {
        return Err(InvalidKey::new(
            key("filter"),
            format!(
                "unknown filter \"{}\" (defined: {})",
                entry.filter,
                names(&raw.filters)
            ),
        ));
    }
    let filter = filters.compile(&entry.filter)?;
    let first = endpoints.get(&entry.endpoint).ok_or_else(|| {
        InvalidKey::new(
            key("endpoint"),
            format!(
                "unknown endpoint \"{}\" (defined: {})",
                entry.endpoint,
                names(endpoints)
            ),
        )
    })?;
    let mut list = vec![first.clone()];
    if let Some(backup) = &entry.backup_list {
        let members = raw.backup_lists.get(backup).ok_or_else(|| {
            InvalidKey::new(
                key("backup_list"),
                format!(
                    "unknown backup list \"{backup}\" (defined: {})",
                    names(&raw.backup_lists)
                ),
            )
        })?;
        // Members were checked against `endpoints` above.
        list.extend(members.iter().filter_map(|m| endpoints.get(m).cloned()));
    }
    let mut seen = HashSet::new();
    if let Some(dup) = list.iter().find(|e| !seen.insert(e.name.clone())) {
        return Err(InvalidKey::new(
            key("backup_list"),
            format!(
                "endpoint \"{}\" appears twice in this branch's list",
                dup.name
            ),
        ));
    }
    let strategy = match entry.strategy.as_str() {
        "failover" => Strategy::Failover,
        "round_robin" => Strategy::RoundRobin,
        other => {
            return Err(InvalidKey::new(
                key("strategy"),
                format!("unknown strategy \"{other}\" (expected \"failover\" or \"round_robin\")"),
            ));
        }
    };
    let outage = match (entry.outage.as_str(), entry.outage_timeout_ms) {
        (_, Some(0)) => {
            return Err(InvalidKey::new(
                key("outage_timeout_ms"),
                "must be at least 1; omit it to dead-letter at once",
            ));
        }
        ("dead_letter", after) => Outage::DeadLetter {
            after: after.map(Duration::from_millis),
        },
        ("wait", Some(_)) => {
            return Err(InvalidKey::new(
                key("outage_timeout_ms"),
                "applies only with outage = \"dead_letter\" (\"wait\" holds for as long as \
                 the outage lasts)",
            ));
        }
        ("wait", None) => Outage::Wait,
        (other, _) => {
            return Err(InvalidKey::new(
                key("outage"),
                format!("unknown outage \"{other}\" (expected \"dead_letter\" or \"wait\")"),
            ));
        }
    };
    let name = match &entry.name {
        Some(n) if n.trim().is_empty() => {
            return Err(InvalidKey::new(
                key("name"),
                "must not be empty; omit it for the default",
            ));
        }
        Some(n) => n.clone(),
        None => format!("{}->{}", entry.filter, entry.endpoint),
    };
    Ok(Branch::new(
        name,
        entry.filter.clone(),
        filter,
        entry.priority,
        list,
        strategy,
    )
    .with_required(entry.required)
    .with_outage(outage))
}

/// Compiles named filters, resolving references and rejecting cycles.
struct FilterCompiler<'a> {
    raw: &'a BTreeMap<String, RawFilter>,
    done: HashMap<String, Arc<Filter>>,
    in_progress: Vec<String>,
}

impl<'a> FilterCompiler<'a> {
    fn new(raw: &'a BTreeMap<String, RawFilter>) -> Self {
        Self {
            raw,
            done: HashMap::new(),
            in_progress: Vec::new(),
        }
    }

    fn compile(&mut self, name: &str) -> Result<Arc<Filter>> {
        if let Some(f) = self.done.get(name) {
            return Ok(f.clone());
        }
        if self.in_progress.iter().any(|n| n == name) {
            let mut cycle = self.in_progress.clone();
            cycle.push(name.to_owned());
            return Err(InvalidKey::new(
                format!("filters.{name}"),
                format!(
                    "filters refer to each other in a cycle: {}",
                    cycle.join(" -> ")
                ),
            ));
        }
        let raw = self.raw.get(name).ok_or_else(|| {
            InvalidKey::new(
                format!("filters.{name}"),
                format!("unknown filter (defined: {})", names(self.raw)),
            )
        })?;
        self.in_progress.push(name.to_owned());
        let compiled = self.compile_one(name, raw);
        self.in_progress.pop();
        let compiled = Arc::new(compiled?);
        self.done.insert(name.to_owned(), compiled.clone());
        Ok(compiled)
    }

    fn compile_one(&mut self, name: &str, f: &RawFilter) -> Result<Filter> {
        let key = |k: &str| format!("filters.{name}.{k}");
        Ok(match f {
            RawFilter::Invalid { key: at, message } if at.is_empty() => {
                return Err(InvalidKey::new(format!("filters.{name}"), message.clone()));
            }
            RawFilter::Invalid { key: at, message } => {
                return Err(InvalidKey::new(key(at), message.clone()));
            }
            RawFilter::MatchAll => Filter::MatchAll,
            RawFilter::Header(h) => Filter::Header {
                name: h.header.clone(),
                test: value_test(
                    ValueKeys {
                        equals: h.equals.as_ref(),
                        exists: h.exists,
                        regex: h.regex.as_ref(),
                        one_of: h.one_of.as_ref(),
                    },
                    name,
                    true,
                )?,
            },
            RawFilter::Property(p) => {
                let property = Property::from_name(&p.property).ok_or_else(|| {
                    InvalidKey::new(
                        key("property"),
                        format!(
                            "unknown property \"{}\" (expected one of {})",
                            p.property,
                            Property::NAMES.join(", ")
                        ),
                    )
                })?;
                let keys = ValueKeys {
                    equals: p.equals.as_ref(),
                    exists: None,
                    regex: p.regex.as_ref(),
                    one_of: p.one_of.as_ref(),
                };
                Filter::Property {
                    property,
                    test: value_test(keys, name, false)?,
                }
            }
            RawFilter::RoutingKey(r) => Filter::RoutingKey(TopicPattern::parse(&r.pattern)),
            RawFilter::Json(j) => Filter::Json {
                pointer: JsonPointer::parse(&j.pointer)
                    .map_err(|e| InvalidKey::new(key("pointer"), e.to_string()))?,
                test: value_test(
                    ValueKeys {
                        equals: j.equals.as_ref(),
                        exists: j.exists,
                        regex: j.regex.as_ref(),
                        one_of: j.one_of.as_ref(),
                    },
                    name,
                    true,
                )?,
            },
            RawFilter::XPath(x) => Filter::XPath(xpath_test(x, name)?),
            RawFilter::Not(n) => Filter::Not(self.compile_ref(name, "filter", &n.filter)?),
            RawFilter::And(list) | RawFilter::Or(list) => {
                if list.filters.is_empty() {
                    return Err(InvalidKey::new(
                        key("filters"),
                        "must name at least one filter",
                    ));
                }
                let compiled = list
                    .filters
                    .iter()
                    .map(|m| self.compile_ref(name, "filters", m))
                    .collect::<Result<Vec<_>>>()?;
                if matches!(f, RawFilter::And(_)) {
                    Filter::And(compiled)
                } else {
                    Filter::Or(compiled)
                }
            }
        })
    }

    fn compile_ref(&mut self, from: &str, field: &str, to: &str) -> Result<Arc<Filter>> {
        if !self.raw.contains_key(to) {
            return Err(InvalidKey::new(
                format!("filters.{from}.{field}"),
                format!("unknown filter \"{to}\" (defined: {})", names(self.raw)),
            ));
        }
        self.compile(to)
    }
}

/// The keys that test a header, property or JSON value: exactly one is set.
struct ValueKeys<'a> {
    equals: Option<&'a ScalarValue>,
    exists: Option<bool>,
    regex: Option<&'a String>,
    one_of: Option<&'a Vec<ScalarValue>>,
}

fn value_test(f: ValueKeys<'_>, name: &str, exists_allowed: bool) -> Result<ValueTest> {
    let key = |k: &str| format!("filters.{name}.{k}");
    let mut tests = Vec::new();
    if let Some(v) = f.equals {
        tests.push(ValueTest::Equals(v.as_text()));
    }
    if let Some(exists) = f.exists {
        if !exists {
            return Err(InvalidKey::new(
                key("exists"),
                "only `exists = true` is supported; wrap the filter in a \"not\" filter",
            ));
        }
        if exists_allowed {
            tests.push(ValueTest::Exists);
        }
    }
    if let Some(pattern) = f.regex {
        let re = regex::Regex::new(pattern).map_err(|e| {
            InvalidKey::new(
                key("regex"),
                format!("invalid regular expression: {}", first_line(&e.to_string())),
            )
        })?;
        tests.push(ValueTest::Regex(re));
    }
    if let Some(options) = f.one_of {
        if options.is_empty() {
            return Err(InvalidKey::new(key("in"), "must list at least one value"));
        }
        tests.push(ValueTest::In(options.iter().map(|v| v.as_text()).collect()));
    }
    let expected = if exists_allowed {
        "one of equals, exists, regex, in"
    } else {
        "one of equals, regex, in"
    };
    match tests.len() {
        1 => Ok(tests.remove(0)),
        0 => Err(InvalidKey::new(
            format!("filters.{name}"),
            format!("needs {expected}"),
        )),
        _ => Err(InvalidKey::new(
            format!("filters.{name}"),
            format!("takes only {expected}, not several"),
        )),
    }
}

fn xpath_test(f: &RawXPathFilter, name: &str) -> Result<XPathTest> {
    let key = |k: &str| format!("filters.{name}.{k}");
    let expression = &f.expression;
    let namespaces = f.namespaces.clone().unwrap_or_default();
    for (prefix, uri) in &namespaces {
        if !is_ncname(prefix) {
            return Err(InvalidKey::new(
                key(&format!("namespaces.{prefix}")),
                "is not a namespace prefix (a name without \":\", starting with a letter or \"_\")",
            ));
        }
        if uri.is_empty() {
            return Err(InvalidKey::new(
                key(&format!("namespaces.{prefix}")),
                "must be a namespace URI, not empty",
            ));
        }
    }
    XPathTest::new(expression, namespaces).map_err(|e| {
        InvalidKey::new(
            key("expression"),
            format!(
                "invalid XPath 1.0 expression: {}",
                first_line(&e.to_string())
            ),
        )
    })
}

/// An XML name without a colon, as namespace prefixes are (ASCII letters,
/// digits, `_`, `-`, `.`, and any non-ASCII letter).
fn is_ncname(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
        && chars.all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fn names<V>(map: &BTreeMap<String, V>) -> String {
    if map.is_empty() {
        "none".to_owned()
    } else {
        map.keys()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn first_line(text: &str) -> String {
    text.lines().last().unwrap_or(text).trim().to_owned()
}

/// `[inbound]` and `[dead_letter]`: the queue side of the forwarder.
fn compile_queue(
    raw: &RawInbound,
    dead_letter: &RawDeadLetter,
    brokers: &BTreeMap<String, Arc<BrokerSpec>>,
    known_broker: &dyn Fn(&str, &str) -> Result<()>,
) -> Result<(Inbound, DeadLetter)> {
    known_broker("inbound.broker", &raw.broker)?;
    if raw.queue.is_empty() {
        return Err(InvalidKey::new("inbound.queue", "must not be empty"));
    }
    let prefetch = u16::try_from(raw.prefetch)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| InvalidKey::new("inbound.prefetch", "must be between 1 and 65535"))?;

    let inbound_queue_type = queue_type("inbound.queue_type", &raw.queue_type)?;
    if raw.max_redeliveries == 0 {
        return Err(InvalidKey::new(
            "inbound.max_redeliveries",
            "must be at least 1",
        ));
    }
    if raw.max_hops == 0 {
        return Err(InvalidKey::new("inbound.max_hops", "must be at least 1"));
    }
    // The forwarder's own user is always trusted: whoever holds its
    // credentials can consume and publish as the forwarder anyway.
    let mut trusted_users = raw.trusted_users.clone().unwrap_or_default();
    if let Some(i) = trusted_users.iter().position(String::is_empty) {
        return Err(InvalidKey::new(
            format!("inbound.trusted_users[{i}]"),
            "must not be empty; name a RabbitMQ user",
        ));
    }
    let own = brokers.get(&raw.broker).and_then(|b| b.user());
    if let Some(own) = own.filter(|own| !trusted_users.contains(own)) {
        trusted_users.insert(0, own);
    }

    let dead_letter = compile_dead_letter(dead_letter, &raw.queue)?;
    if raw.dead_letter_by_policy && dead_letter.mode != DeadLetterMode::Nack {
        return Err(InvalidKey::new(
            "inbound.dead_letter_by_policy",
            "applies only to dead_letter.mode = \"nack\"; remove it",
        ));
    }

    let inbound = Inbound {
        broker: raw.broker.clone(),
        queue: raw.queue.clone(),
        prefetch,
        declare: raw.declare,
        single_active_consumer: raw.single_active_consumer,
        queue_type: inbound_queue_type,
        max_redeliveries: raw.max_redeliveries,
        max_hops: raw.max_hops,
        dead_letter_by_policy: raw.dead_letter_by_policy,
        trusted_users,
    };
    Ok((inbound, dead_letter))
}
