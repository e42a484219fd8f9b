//! The container files agree with the binary and with each other, since no
//! container engine runs where the tests do: the configuration
//! `docker/compose.yaml` mounts passes validation with the environment
//! compose gives it and points at the compose RabbitMQ with its
//! credentials; its admin port is the one compose publishes, Prometheus
//! scrapes, the image exposes and its `HEALTHCHECK` probes on `/healthz`;
//! its HTTP ingress listens on every interface on a port compose publishes
//! and the image exposes, with a token from compose's environment and none
//! in the file; and every command line in the files uses subcommands and
//! flags the real binary's `--help` lists. No broker needed.

use crate::support;

use serde_norway::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use support::repo::root;
use switchyard::config::{Settings, load_str};

const BIN: &str = env!("CARGO_BIN_EXE_switchyard");
/// The variable that gives the HTTP ingress its bearer tokens.
const TOKENS_VAR: &str = "SWITCHYARD__INGRESS__HTTP__TOKENS";
/// The environment variable the compose file gives the admin tokens in.
const ADMIN_TOKENS_VAR: &str = "SWITCHYARD__ADMIN__TOKENS";

fn docker() -> PathBuf {
    root().join("docker")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn yaml(path: &Path) -> Value {
    serde_norway::from_str(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => panic!("expected a scalar, found {other:?}"),
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_sequence()
        .unwrap_or_else(|| panic!("expected a list, found {value:?}"))
        .iter()
        .map(text)
        .collect()
}

/// Compose's variable substitution as a run without those variables set
/// sees it: `${NAME:-default}` is the default, `$$` a dollar sign.
fn interpolate(raw: &str) -> String {
    let mut out = String::new();
    let mut rest = raw;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at + 1..];
        if let Some(after) = tail.strip_prefix('$') {
            out.push('$');
            rest = after;
        } else if let Some(body) = tail.strip_prefix('{') {
            let end = body
                .find('}')
                .unwrap_or_else(|| panic!("unclosed ${{ in {raw}"));
            let expression = &body[..end];
            let default = expression.split_once(":-").map_or("", |(_, d)| d);
            out.push_str(default);
            rest = &body[end + 1..];
        } else {
            panic!("use ${{NAME:-default}} in compose.yaml, not a bare $: {raw}");
        }
    }
    out.push_str(rest);
    out
}

/// A service's `environment`, as a map or a `KEY=value` list, interpolated.
fn environment(service: &Value) -> BTreeMap<String, String> {
    match service.get("environment") {
        None => BTreeMap::new(),
        Some(Value::Mapping(map)) => map
            .iter()
            .map(|(k, v)| (text(k), interpolate(&text(v))))
            .collect(),
        Some(list) => strings(list)
            .iter()
            .map(|item| {
                let (k, v) = item.split_once('=').unwrap_or((item, ""));
                (k.to_owned(), interpolate(v))
            })
            .collect(),
    }
}

/// A service's bind mounts: container path -> host path.
fn mounts(service: &Value) -> BTreeMap<String, PathBuf> {
    service
        .get("volumes")
        .map(strings)
        .unwrap_or_default()
        .iter()
        .filter_map(|v| {
            let mut parts = v.split(':');
            let host = parts.next()?;
            let container = parts.next()?;
            let relative = host.strip_prefix("./")?;
            Some((container.to_owned(), docker().join(relative)))
        })
        .collect()
}

/// A service's published ports: (host, container).
fn ports(service: &Value) -> Vec<(u16, u16)> {
    service
        .get("ports")
        .map(strings)
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let p = p.split('/').next().unwrap_or(p);
            let parts: Vec<&str> = p.split(':').collect();
            let port = |s: &str| s.parse::<u16>().unwrap_or_else(|e| panic!("port {p}: {e}"));
            match parts.as_slice() {
                [container] => (port(container), port(container)),
                [.., host, container] => (port(host), port(container)),
                [] => unreachable!(),
            }
        })
        .collect()
}

/// The Dockerfile's instructions, continuation lines joined, comments and
/// parser directives dropped: (INSTRUCTION, arguments).
fn dockerfile() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in read(&docker().join("Dockerfile")).lines() {
        let trimmed = line.trim();
        if pending.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if let Some(continued) = trimmed.strip_suffix('\\') {
            pending.push_str(continued);
            pending.push(' ');
            continue;
        }
        pending.push_str(trimmed);
        let (instruction, args) = pending.split_once(' ').unwrap_or((&pending, ""));
        out.push((instruction.to_ascii_uppercase(), args.trim().to_owned()));
        pending.clear();
    }
    out
}

fn instructions<'a>(file: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    file.iter()
        .filter(|(i, _)| i == name)
        .map(|(_, a)| a.as_str())
        .collect()
}

/// The exec form of ENTRYPOINT or CMD: a JSON array of strings.
fn exec_form(file: &[(String, String)], name: &str) -> Vec<String> {
    let all = instructions(file, name);
    let last = all
        .last()
        .unwrap_or_else(|| panic!("the Dockerfile has no {name}"));
    let value: Value = serde_norway::from_str(last)
        .unwrap_or_else(|e| panic!("{name} {last}: use the exec form [\"...\"]: {e}"));
    strings(&value)
}

/// The last stage's `ENV` settings.
fn image_env(file: &[(String, String)]) -> BTreeMap<String, String> {
    let last_stage = file.iter().rposition(|(i, _)| i == "FROM").unwrap_or(0);
    let mut env = BTreeMap::new();
    for (instruction, args) in &file[last_stage..] {
        if instruction != "ENV" {
            continue;
        }
        for pair in args.split_whitespace() {
            if let Some((k, v)) = pair.split_once('=') {
                env.insert(k.to_owned(), v.trim_matches('"').to_owned());
            }
        }
    }
    env
}

fn help(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("{BIN}: {e}"));
    assert!(
        out.status.success(),
        "switchyard {} --help failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Checks that `argv` (the arguments after `switchyard`) names real
/// subcommands and only flags their help lists; returns the subcommands.
fn assert_real_command_line(argv: &[String], origin: &str) -> Vec<String> {
    let mut path: Vec<String> = Vec::new();
    let mut iter = argv.iter().peekable();
    while let Some(word) = iter.next_if(|w| !w.starts_with('-')) {
        let listing = help(&path.iter().map(String::as_str).collect::<Vec<_>>());
        let listed = listing
            .lines()
            .any(|l| l.split_whitespace().next() == Some(word.as_str()));
        assert!(
            listed,
            "{origin}: `{word}` is not a subcommand of `switchyard {}`:\n{listing}",
            path.join(" ")
        );
        path.push(word.clone());
    }
    assert!(!path.is_empty(), "{origin}: no subcommand in {argv:?}");
    let usage = help(&path.iter().map(String::as_str).collect::<Vec<_>>());
    for flag in iter.filter(|a| a.starts_with("--")) {
        let name = flag.split('=').next().unwrap_or(flag);
        assert!(
            usage.contains(&format!("{name} ")) || usage.contains(&format!("{name}\n")),
            "{origin}: `switchyard {}` has no flag {name}:\n{usage}",
            path.join(" ")
        );
    }
    path
}

/// The value after `--config`, if any.
fn config_flag(argv: &[String]) -> Option<String> {
    argv.iter().enumerate().find_map(|(i, a)| match a.as_str() {
        "--config" => argv.get(i + 1).cloned(),
        other => other.strip_prefix("--config=").map(str::to_owned),
    })
}

/// Runs the real `switchyard check` on `config` with exactly `env`.
fn check(config: &Path, env: &BTreeMap<String, String>) -> String {
    let out = Command::new(BIN)
        .arg("check")
        .arg("--config")
        .arg(config)
        .env_clear()
        .envs(env)
        .output()
        .unwrap_or_else(|e| panic!("{BIN}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "switchyard check --config {} with {env:?} failed: {}{stdout}",
        config.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs the real `switchyard check` on `config` with exactly `env`, which
/// must refuse it (exit 2); returns its stderr.
fn check_refused(config: &Path, env: &BTreeMap<String, String>) -> String {
    let out = Command::new(BIN)
        .arg("check")
        .arg("--config")
        .arg(config)
        .env_clear()
        .envs(env)
        .output()
        .unwrap_or_else(|e| panic!("{BIN}: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(2),
        "switchyard check --config {} with {env:?} must refuse it: {stderr}",
        config.display()
    );
    stderr
}

/// The configuration text with the tokens `env` gives the HTTP ingress
/// written into its table, as the override does at run time (the tests
/// load the file without the process environment).
fn with_tokens(toml: &str, env: &BTreeMap<String, String>) -> String {
    let mut toml = toml.to_owned();
    for (var, table) in [(TOKENS_VAR, "ingress.http"), (ADMIN_TOKENS_VAR, "admin")] {
        let header = format!("\n[{table}]\n");
        if let Some(tokens) = env.get(var)
            && toml.contains(&header)
        {
            toml = toml.replace(&header, &format!("{header}tokens = {tokens:?}\n"));
        }
    }
    toml
}

/// (user, password, host, port) of an `amqp://` URI.
fn uri_parts(uri: &str) -> (String, String, String, u16) {
    let rest = uri
        .strip_prefix("amqp://")
        .unwrap_or_else(|| panic!("expected an amqp:// URI in compose, found {uri}"));
    let authority = rest.split('/').next().unwrap_or(rest);
    let (userinfo, hostport) = authority
        .rsplit_once('@')
        .unwrap_or_else(|| panic!("{uri}: give the credentials explicitly"));
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let (host, port) = hostport.split_once(':').unwrap_or((hostport, "5672"));
    let port = port.parse().unwrap_or_else(|e| panic!("{uri}: port: {e}"));
    (user.to_owned(), password.to_owned(), host.to_owned(), port)
}

struct Stack {
    services: BTreeMap<String, Value>,
}

impl Stack {
    fn load() -> Self {
        let compose = yaml(&docker().join("compose.yaml"));
        let services = compose
            .get("services")
            .and_then(Value::as_mapping)
            .expect("compose.yaml has services")
            .iter()
            .map(|(k, v)| (text(k), v.clone()))
            .collect();
        Self { services }
    }

    fn service(&self, name: &str) -> &Value {
        self.services
            .get(name)
            .unwrap_or_else(|| panic!("compose.yaml has no service {name}"))
    }
}

/// The switchyard service's command line and the configuration it runs:
/// (argv after `switchyard`, host path of the mounted file, environment,
/// settings from the file alone).
fn switchyard_service(
    stack: &Stack,
    image: &[(String, String)],
) -> (Vec<String>, PathBuf, BTreeMap<String, String>, Settings) {
    let service = stack.service("switchyard");
    let argv = match service.get("command") {
        Some(command) => strings(command),
        None => exec_form(image, "CMD"),
    };
    let env = environment(service);
    let in_container = config_flag(&argv)
        .or_else(|| env.get("SWITCHYARD_CONFIG").cloned())
        .or_else(|| image_env(image).get("SWITCHYARD_CONFIG").cloned())
        .expect("the switchyard service names its configuration");
    let host = mounts(service)
        .get(&in_container)
        .cloned()
        .unwrap_or_else(|| panic!("compose.yaml mounts nothing at {in_container}"));
    let settings = load_str(
        &with_tokens(&read(&host), &env),
        &host.display().to_string(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    (argv, host, env, settings)
}

/// The admin address, the environment's override first.
fn admin_listen(settings: &Settings, env: &BTreeMap<String, String>) -> SocketAddr {
    match env.get("SWITCHYARD__ADMIN__LISTEN") {
        Some(addr) => addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}")),
        None => settings
            .admin_listen
            .expect("the compose configuration sets [admin] listen"),
    }
}

#[test]
fn the_mounted_configuration_is_valid_and_reaches_the_compose_broker() {
    let stack = Stack::load();
    let image = dockerfile();
    let (_, host_config, env, settings) = switchyard_service(&stack, &image);
    let summary = check(&host_config, &env);
    assert!(summary.contains(": ok"), "{summary}");

    let rabbit = stack.service("rabbitmq");
    let rabbit_image = text(rabbit.get("image").expect("rabbitmq has an image"));
    assert!(
        rabbit_image.starts_with("rabbitmq:3.10") && rabbit_image.contains("management"),
        "RabbitMQ 3.10 with the management plugin, not {rabbit_image}"
    );
    let rabbit_env = environment(rabbit);
    let user = rabbit_env
        .get("RABBITMQ_DEFAULT_USER")
        .map_or("guest", String::as_str);
    let password = rabbit_env
        .get("RABBITMQ_DEFAULT_PASS")
        .map_or("guest", String::as_str);
    let amqp_ports: Vec<u16> = ports(rabbit).iter().map(|(_, c)| *c).collect();
    assert!(
        amqp_ports.contains(&5672),
        "rabbitmq publishes AMQP: {amqp_ports:?}"
    );
    assert!(
        amqp_ports.contains(&15672),
        "rabbitmq publishes the management UI: {amqp_ports:?}"
    );

    for broker in settings.brokers.values() {
        let variable = format!("SWITCHYARD__BROKERS__{}__URI", broker.name.to_uppercase());
        let uri = env
            .get(&variable)
            .cloned()
            .unwrap_or_else(|| broker.secret_uri().to_owned());
        let (u, p, host, port) = uri_parts(&uri);
        assert!(
            stack.services.contains_key(&host),
            "broker {} points at {host}, which is no compose service",
            broker.name
        );
        assert_eq!(host, "rabbitmq", "broker {}", broker.name);
        assert_eq!(port, 5672, "broker {}", broker.name);
        assert_eq!(
            (u.as_str(), p.as_str()),
            (user, password),
            "broker {} uses the credentials RabbitMQ is given",
            broker.name
        );
        assert!(
            summary.contains(&format!("{} = amqp://{u}:***@{host}:{port}/", broker.name)),
            "check applied the environment's URI: {summary}"
        );
    }

    // The image's own default configuration is the same file, and valid.
    let copied = instructions(&image, "COPY")
        .into_iter()
        .find(|a| a.contains("switchyard.toml"))
        .expect("the image carries a default configuration");
    let target = copied.split_whitespace().last().unwrap_or_default();
    assert_eq!(
        image_env(&image)
            .get("SWITCHYARD_CONFIG")
            .map(String::as_str),
        Some(target),
        "SWITCHYARD_CONFIG names the configuration the image carries"
    );
    assert!(
        mounts(stack.service("switchyard")).contains_key(target),
        "compose mounts its configuration over the image's {target}"
    );
    // Valid once given its tokens, as `docker run -e` gives them.
    let token = BTreeMap::from([
        (TOKENS_VAR.to_owned(), "t0ken".to_owned()),
        (ADMIN_TOKENS_VAR.to_owned(), "adm1n".to_owned()),
    ]);
    check(&root().join("docker/switchyard.toml"), &token);
}

#[test]
fn the_ingress_is_published_exposed_and_takes_its_token_from_the_environment() {
    let stack = Stack::load();
    let image = dockerfile();
    let (_, host_config, env, settings) = switchyard_service(&stack, &image);
    let http = settings
        .http
        .as_ref()
        .expect("the compose configuration has an [ingress.http]");
    let listen = match env.get("SWITCHYARD__INGRESS__HTTP__LISTEN") {
        Some(addr) => addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}")),
        None => http.listen,
    };
    assert!(
        listen.ip().is_unspecified(),
        "in a container the ingress must accept other containers and the host: {listen}"
    );
    let port = listen.port();
    let published = ports(stack.service("switchyard"));
    assert!(
        published.iter().any(|(_, container)| *container == port),
        "compose publishes the ingress port {port}: {published:?}"
    );
    let exposed = instructions(&image, "EXPOSE");
    assert!(
        exposed
            .iter()
            .any(|e| e.split_whitespace().any(|p| p == port.to_string())),
        "the Dockerfile exposes {port}: {exposed:?}"
    );

    // The token comes from compose, through a variable the user can set,
    // and the file holds none: without the variable it is refused.
    let raw = stack
        .service("switchyard")
        .get("environment")
        .and_then(|e| e.get(TOKENS_VAR))
        .map(text)
        .unwrap_or_else(|| panic!("compose sets {TOKENS_VAR}"));
    assert!(
        raw.starts_with("${") && raw.contains(":-"),
        "{TOKENS_VAR} comes from a variable with a default: {raw}"
    );
    assert!(
        !http.tokens.is_empty(),
        "compose gives the ingress a token: {env:?}"
    );
    let mut without = env.clone();
    without.remove(TOKENS_VAR);
    for config in [host_config, root().join("docker/switchyard.toml")] {
        let refused = check_refused(&config, &without);
        assert!(
            refused.contains("ingress.http.listen") && refused.contains(TOKENS_VAR),
            "without a token an open ingress is refused, naming the variable: {refused}"
        );
    }
}

#[test]
fn the_admin_port_is_published_scraped_exposed_and_health_checked() {
    let stack = Stack::load();
    let image = dockerfile();
    let (_, _, env, settings) = switchyard_service(&stack, &image);
    let admin = admin_listen(&settings, &env);
    assert!(
        admin.ip().is_unspecified(),
        "in a container the admin listener must accept other containers: {admin}"
    );
    let port = admin.port();

    let published = ports(stack.service("switchyard"));
    assert!(
        published.iter().any(|(_, container)| *container == port),
        "compose publishes switchyard's admin port {port}: {published:?}"
    );

    let prometheus = stack.service("prometheus");
    let prometheus_config = strings(prometheus.get("command").expect("prometheus command"))
        .iter()
        .find_map(|a| a.strip_prefix("--config.file=").map(str::to_owned))
        .unwrap_or_else(|| "/etc/prometheus/prometheus.yml".to_owned());
    let scrape_file = mounts(prometheus)
        .get(&prometheus_config)
        .cloned()
        .unwrap_or_else(|| panic!("compose mounts nothing at {prometheus_config}"));
    let scrape = yaml(&scrape_file);
    let jobs = scrape
        .get("scrape_configs")
        .and_then(Value::as_sequence)
        .expect("prometheus.yml has scrape_configs");
    let wanted = format!("switchyard:{port}");
    let scraped = jobs.iter().any(|job| {
        let path = job.get("metrics_path").map_or("/metrics".to_owned(), text);
        let targets = job
            .get("static_configs")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("targets"))
            .flat_map(strings);
        path == "/metrics" && targets.into_iter().any(|t| t == wanted)
    });
    assert!(scraped, "prometheus.yml scrapes {wanted}/metrics");

    let exposed = instructions(&image, "EXPOSE");
    assert!(
        exposed
            .iter()
            .any(|e| e.split_whitespace().any(|p| p == port.to_string())),
        "the Dockerfile exposes {port}: {exposed:?}"
    );
    let health = instructions(&image, "HEALTHCHECK");
    let [health] = health.as_slice() else {
        panic!("one HEALTHCHECK, found {health:?}");
    };
    let url_ok = [
        format!("http://127.0.0.1:{port}/healthz"),
        format!("http://localhost:{port}/healthz"),
    ];
    assert!(
        url_ok.iter().any(|u| health.contains(u.as_str())),
        "the HEALTHCHECK probes /healthz on {port}: {health}"
    );
    let tool = health
        .split_once("CMD")
        .map(|(_, cmd)| cmd.split_whitespace().next().unwrap_or_default())
        .expect("HEALTHCHECK ... CMD ...");
    let installs = instructions(&image, "RUN")
        .into_iter()
        .any(|r| r.contains("apt-get install") && r.split_whitespace().any(|w| w == tool));
    assert!(
        installs,
        "the HEALTHCHECK's {tool} is installed in the image"
    );
}

#[test]
fn the_command_lines_use_real_subcommands_and_flags() {
    let stack = Stack::load();
    let image = dockerfile();
    let entrypoint = exec_form(&image, "ENTRYPOINT");
    assert_eq!(
        entrypoint.first().map(String::as_str),
        Some("switchyard"),
        "the entry point is the binary"
    );
    let with_entrypoint = |args: Vec<String>| -> Vec<String> {
        entrypoint[1..].iter().cloned().chain(args).collect()
    };
    let cmd = with_entrypoint(exec_form(&image, "CMD"));
    assert_eq!(
        assert_real_command_line(&cmd, "Dockerfile CMD"),
        ["run"],
        "the image runs the forwarder by default"
    );
    let (argv, _, _, _) = switchyard_service(&stack, &image);
    assert_eq!(
        assert_real_command_line(&with_entrypoint(argv), "compose switchyard command"),
        ["run"]
    );
}

#[test]
fn the_image_builds_with_the_declared_toolchain_and_runs_unprivileged() {
    let image = dockerfile();
    let stages = instructions(&image, "FROM");
    assert!(stages.len() >= 2, "a multi-stage build: {stages:?}");
    let manifest = read(&root().join("Cargo.toml"));
    let rust_version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .map(|v| v.trim_matches('"'))
        .expect("Cargo.toml declares rust-version");
    assert!(
        stages[0].starts_with(&format!("rust:{rust_version}")),
        "the build stage uses Rust {rust_version}: {}",
        stages[0]
    );
    let runtime = stages.last().copied().unwrap_or_default();
    assert!(
        runtime.starts_with("debian:") && runtime.contains("slim"),
        "a slim runtime: {runtime}"
    );
    let debian = |stage: &str| {
        ["bookworm", "trixie"]
            .into_iter()
            .find(|r| stage.contains(r))
    };
    assert_eq!(
        debian(stages[0]),
        debian(runtime),
        "build and runtime share a Debian release (and so a glibc)"
    );
    // The build context is the repository root: what the image copies must
    // exist and must not be excluded by .dockerignore.
    let ignored: Vec<String> = read(&root().join(".dockerignore"))
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_matches('/').to_owned())
        .collect();
    for copy in instructions(&image, "COPY") {
        if copy.starts_with("--from") {
            continue;
        }
        let words: Vec<&str> = copy.split_whitespace().collect();
        for source in &words[..words.len() - 1] {
            assert!(
                root().join(source).exists(),
                "COPY {source}: not in the repository"
            );
            assert!(
                !ignored
                    .iter()
                    .any(|i| *source == i || source.starts_with(&format!("{i}/"))),
                "COPY {source}: excluded by .dockerignore"
            );
        }
    }
    let users = instructions(&image, "USER");
    let user = users.last().copied().unwrap_or("root");
    assert!(
        !["root", "0", "0:0"].contains(&user),
        "the image runs as a non-root user, not {user}"
    );
}

#[test]
fn the_dashboard_shows_only_documented_metrics() {
    let dashboard = read(&docker().join("grafana-dashboard.json"));
    let parsed: Value = serde_norway::from_str(&dashboard).expect("the dashboard is JSON");
    assert!(parsed.get("panels").and_then(Value::as_sequence).is_some());
    let operations = read(&root().join("docs/operations.md"));
    let metric = regex::Regex::new(r"switchyard_[a-z_]+").unwrap();
    let mut seen = 0;
    for m in metric.find_iter(&dashboard) {
        let name = m.as_str();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        assert!(
            operations.contains(&format!("| `{family}` |")),
            "the dashboard uses {family}, which docs/operations.md does not list"
        );
        seen += 1;
    }
    assert!(seen > 0, "the dashboard shows switchyard's metrics");
}

#[test]
fn the_trace_backend_takes_the_forwarders_spans_and_shows_them() {
    let stack = Stack::load();
    let image = dockerfile();
    let (_, _, _, settings) = switchyard_service(&stack, &image);
    let jaeger = stack.service("jaeger");
    let image_name = jaeger.get("image").map(text).unwrap_or_default();
    assert!(
        image_name.starts_with("jaegertracing/all-in-one:"),
        "the trace backend is Jaeger's all-in-one image: {image_name}"
    );
    assert_eq!(
        environment(jaeger)
            .get("COLLECTOR_OTLP_ENABLED")
            .map(String::as_str),
        Some("true"),
        "Jaeger takes OTLP"
    );
    assert!(
        ports(jaeger)
            .iter()
            .any(|(_, container)| *container == 16686),
        "Jaeger's UI is published: {:?}",
        ports(jaeger)
    );
    let otlp = settings
        .otlp
        .as_ref()
        .expect("the compose configuration exports spans ([telemetry.otlp])");
    assert_eq!(
        otlp.endpoint.trim_end_matches('/'),
        "http://jaeger:4318",
        "spans go to the jaeger service's OTLP/HTTP port"
    );
    let depends = stack
        .service("switchyard")
        .get("depends_on")
        .and_then(|d| d.get("jaeger"));
    assert!(depends.is_some(), "switchyard starts after jaeger");
    assert!(settings.journal.is_some(), "the journal is on in the stack");
}
