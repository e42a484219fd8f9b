//! The `switchyard` binary: parse the command line, load and validate the
//! configuration before any I/O, then run or report. Exit codes: 0 success,
//! 2 invalid configuration or usage, 1 any other failure; `trace` exits 3
//! when it finds nothing.
//!
//! `run` gives every thread a stack deep enough for the most deeply nested
//! header a broker can send ([`THREAD_STACK`]) before it starts any, so no
//! message can overflow one.

mod cli;

use clap::Parser;
use cli::{Cli, Command, LogFormat};
use std::process::ExitCode;
use switchyard::config::{self, Settings};
use switchyard::destination::DeadLetter;
use switchyard::journal::reader::{Request, TraceError};

const EXIT_FAILURE: u8 = 1;
const EXIT_USAGE: u8 = 2;
/// `trace` found no record in the window it read.
const EXIT_NOT_FOUND: u8 = 3;

/// Stack size of every thread `run` starts: the runtime's workers and
/// blocking threads, and (through [`STACK_ENV`]) lapin's I/O threads.
///
/// Parsing a header table or array (lapin's I/O thread) and serializing one
/// recurse once per nesting level, and so do cloning, dropping, comparing and
/// formatting the value on runtime threads. Measured per level with lapin
/// 4.12 / amq-protocol 10.6 (tables / arrays; debug build, release build):
/// parse 12.8 / 11.5 KB, 2.0 / 1.7 KB; serialize 2.3 / 1.9 KB, 0.4 / 0.3 KB;
/// clone 2.0 / 1.1 KB, 0.3 / 0.2 KB; drop 0.8 / 0.2 KB, 0.2 / 0.1 KB. A
/// header frame of RabbitMQ's frame_max (131072 bytes) holds at most 26,200
/// levels of arrays (5 bytes each) or 21,800 of tables (6 bytes), so parsing
/// the deepest header needs about 45 MB of stack in release and 300 MB in
/// debug. The reservation is address space, not memory: a thread's pages are
/// backed only once touched, so ordinary messages cost nothing; a deep one
/// leaves the pages it touched resident in that thread.
const THREAD_STACK: usize = if cfg!(debug_assertions) {
    512 << 20
} else {
    128 << 20
};

/// The standard library's default stack for threads spawned without an
/// explicit size; read once per process.
const STACK_ENV: &str = "RUST_MIN_STACK";

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match cli.command {
        Command::Check { config } => match load(config) {
            Ok((path, settings)) => {
                print!("{}", summary(&path, &settings));
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        Command::Run { config, fail_fast } => {
            init_tracing(cli.log_format);
            let path = config::config_path(config);
            match config::load(&path) {
                Ok(settings) => {
                    let options = switchyard::Options {
                        fail_fast,
                        config_file: Some(path),
                        ..Default::default()
                    };
                    run(settings, options, cli.log_format)
                }
                Err(e) => {
                    report(cli.log_format, &e.to_string());
                    ExitCode::from(EXIT_USAGE)
                }
            }
        }
        Command::Dlq(command) => match load(command.select().config.clone()) {
            Ok((path, settings)) => dlq(&path, settings, command),
            Err(code) => code,
        },
        Command::Trace {
            message_id,
            config,
            since,
            json,
        } => {
            let now = switchyard::journal::reader::now();
            let request = match Request::new(&message_id, Some(&since), json, now) {
                Ok(request) => request,
                Err(e) => {
                    eprintln!("switchyard: {e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            match load(config) {
                Ok((path, settings)) => trace(&path, settings, &request),
                Err(code) => code,
            }
        }
        Command::Ctl { target, command } => ctl(&target, &command),
    }
}

/// The environment variable `ctl` reads its token from.
const TOKEN_ENV: &str = "SWITCHYARD_ADMIN_TOKEN";

/// `switchyard ctl`: one command to the admin endpoint.
fn ctl(target: &cli::CtlTarget, command: &cli::CtlCommand) -> ExitCode {
    let ask = match command.ask() {
        Ok(ask) => ask,
        Err(e) => {
            eprintln!("switchyard: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let token = target
        .token
        .clone()
        .or_else(|| std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()));
    let given = target.admin.as_deref().map(admin_address);
    // The configuration is read only for what the flags leave out.
    let settings = match (&given, &token) {
        (Some(_), Some(_)) => None,
        _ => match load(target.config.clone()) {
            Ok((_, settings)) => Some(settings),
            Err(code) => return code,
        },
    };
    let addr = match given {
        Some(Ok(addr)) => addr,
        Some(Err(e)) => {
            eprintln!("switchyard: --admin {e}");
            return ExitCode::from(EXIT_USAGE);
        }
        None => match settings.as_ref().and_then(|s| s.admin_listen) {
            Some(listen) => loopback_if_any(listen),
            None => {
                eprintln!(
                    "switchyard: no admin endpoint: give --admin host:port, or set admin.listen"
                );
                return ExitCode::from(EXIT_USAGE);
            }
        },
    };
    let token = token.or_else(|| {
        let control = settings.as_ref()?.control.as_ref()?;
        control.tokens.first().cloned()
    });
    let Some(token) = token else {
        eprintln!(
            "switchyard: no token: give --token, set {TOKEN_ENV}, or set admin.tokens in the \
             configuration"
        );
        return ExitCode::from(EXIT_USAGE);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("switchyard: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    match runtime.block_on(switchyard::ctl::send(addr, &token, &ask)) {
        Ok(answer) => {
            if target.json {
                println!("{answer}");
            } else {
                let done = ask.done();
                if !done.is_empty() {
                    println!("{done}");
                }
                if ask == switchyard::ctl::Ask::Status {
                    print!("{}", switchyard::ctl::human_status(&answer));
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("switchyard: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// `host:port` or `http://host:port[/]`, as an address.
fn admin_address(text: &str) -> Result<std::net::SocketAddr, String> {
    let bare = text.strip_prefix("http://").unwrap_or(text);
    let bare = bare.trim_end_matches('/');
    use std::net::ToSocketAddrs;
    bare.to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| format!("\"{text}\" is not host:port or http://host:port"))
}

/// The loopback address for a listener on every interface.
fn loopback_if_any(listen: std::net::SocketAddr) -> std::net::SocketAddr {
    let mut addr = listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    addr
}

/// Says why `run` ends in failure: one line on stderr, or in JSON mode one
/// error event, so that every line stays a JSON object.
fn report(format: LogFormat, error: &str) {
    match format {
        LogFormat::Text => eprintln!("switchyard: {error}"),
        LogFormat::Json => tracing::error!(error, "switchyard stopped"),
    }
}

fn load(flag: Option<std::path::PathBuf>) -> Result<(std::path::PathBuf, Settings), ExitCode> {
    let path = config::config_path(flag);
    config::load(&path).map(|s| (path, s)).map_err(|e| {
        eprintln!("switchyard: {e}");
        ExitCode::from(EXIT_USAGE)
    })
}

fn summary(path: &std::path::Path, settings: &Settings) -> String {
    let brokers: Vec<String> = settings
        .brokers
        .values()
        .map(|b| format!("{} = {}", b.name, b.redacted_uri()))
        .collect();
    let admin = settings
        .admin_listen
        .map_or_else(|| "disabled".to_owned(), |a| a.to_string());
    let queue = match settings.queue() {
        Some((inbound, dl)) => format!(
            "inbound: {} on {} (prefetch {})\ndead letters: {} via exchange \"{}\" key \"{}\"{}",
            inbound.queue,
            inbound.broker,
            inbound.prefetch,
            dl.mode,
            dl.exchange,
            dl.routing_key,
            delivery_limit(settings, inbound, dl)
        ),
        None => "inbound: none (HTTP ingress only)\ndead letters: none".to_owned(),
    };
    format!(
        "{}: ok\n{queue}\nbrokers: {}\nadmin: {admin}\nsessions: {}\nhttp ingress: {}\njournal: {}\notlp: {}\ncontrol: {}\nfilter table:\n{}",
        path.display(),
        brokers.join(", "),
        config::Sessions::summary(settings.sessions.as_ref()),
        config::HttpIngress::summary(settings.http.as_ref()),
        config::Journal::summary(settings.journal.as_ref()),
        config::Otlp::summary(settings.otlp.as_ref()),
        config::Control::summary(settings.control.as_ref()),
        settings.routing.summary()
    )
}

/// The summary's line on a quorum inbound queue's delivery limit, which
/// `check` cannot see on the broker: what switchyard declares, and the
/// policy for a queue created without it. Empty for a classic queue.
fn delivery_limit(settings: &Settings, inbound: &config::Inbound, dl: &DeadLetter) -> String {
    let broker = settings.brokers.get(&inbound.broker);
    let policy = broker.and_then(|b| config::delivery_limit_policy(inbound, dl, &b.vhost()));
    match (inbound.delivery_limit(), policy) {
        (Some(limit), Some(policy)) => format!(
            "\ndelivery limit: {limit} (x-delivery-limit on the quorum queue when switchyard \
             creates it; a queue created without it needs a policy, or a message whose header \
             the client cannot read blocks it: {policy})"
        ),
        _ => String::new(),
    }
}

/// The runtime every command runs on: threads whose stacks hold any header
/// a frame can carry (re-executing the binary first if need be).
fn runtime(settings: &Settings) -> std::io::Result<tokio::runtime::Runtime> {
    ensure_thread_stack();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = settings.worker_threads {
        builder.worker_threads(threads);
    }
    builder.enable_all().thread_stack_size(THREAD_STACK).build()
}

fn run(settings: Settings, options: switchyard::Options, format: LogFormat) -> ExitCode {
    let runtime = match runtime(&settings) {
        Ok(rt) => rt,
        Err(e) => {
            report(format, &format!("cannot start the runtime: {e}"));
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    // On a worker, not on the main thread, whose stack is the system's.
    let forwarder = runtime.spawn(async move {
        let mut options = options;
        if let Some(path) = options.config_file.clone() {
            options.reloads = Some(switchyard::reload::sources(path, options.telemetry.clone()));
        }
        switchyard::run_with(settings, options, shutdown_signal()).await
    });
    let error = match runtime.block_on(forwarder) {
        Ok(Ok(())) => return ExitCode::SUCCESS,
        Ok(Err(e)) => switchyard::errors::one_line(&e),
        Err(e) => format!("the forwarder task failed: {e}"),
    };
    report(format, &error);
    ExitCode::from(EXIT_FAILURE)
}

/// `dlq inspect` / `dlq redrive`: the command line is checked before any
/// I/O, then the command runs on threads that can hold any header, as `run`.
fn dlq(path: &std::path::Path, settings: Settings, command: cli::Dlq) -> ExitCode {
    let failed = |e: &switchyard::dlq::DlqError| {
        match e {
            switchyard::dlq::DlqError::Config(key) => {
                eprintln!("switchyard: {}: {key}", path.display())
            }
            _ => eprintln!("switchyard: {}", switchyard::errors::one_line(e)),
        }
        ExitCode::from(if e.is_usage() {
            EXIT_USAGE
        } else {
            EXIT_FAILURE
        })
    };
    let request = match command.request() {
        Ok(request) => request,
        Err(e) => return failed(&e),
    };
    let runtime = match runtime(&settings) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("switchyard: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let work = runtime.spawn(switchyard::dlq::execute(settings, request));
    match runtime.block_on(work) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => failed(&e),
        Err(e) => {
            eprintln!("switchyard: the dlq task failed: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// `trace`: the records on stdout, then on stderr how many lines were
/// skipped and, when nothing was found, what was searched (exit 3).
fn trace(path: &std::path::Path, settings: Settings, request: &Request) -> ExitCode {
    let failed = |e: &TraceError| {
        match e {
            TraceError::Config(key) => eprintln!("switchyard: {}: {key}", path.display()),
            _ => eprintln!("switchyard: {}", switchyard::errors::one_line(e)),
        }
        ExitCode::from(if e.is_usage() {
            EXIT_USAGE
        } else {
            EXIT_FAILURE
        })
    };
    let runtime = match runtime(&settings) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("switchyard: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let request = request.clone();
    let work = runtime.spawn(async move {
        let mut out = std::io::stdout();
        switchyard::journal::reader::trace(&settings, &request, progress, &mut out).await
    });
    match runtime.block_on(work) {
        Ok(Ok(traced)) => {
            if traced.skipped > 0 {
                eprintln!(
                    "switchyard: skipped {} line(s) of the journal that name \"{}\" but are not records",
                    traced.skipped, traced.id
                );
            }
            if traced.ignored > 0 {
                eprintln!(
                    "switchyard: ignored {} line(s) naming \"{}\" that the group's forwarders did not \
                     write (published by another user than the journal broker's or inbound.trusted_users)",
                    traced.ignored, traced.id
                );
            }
            if traced.found == 0 {
                eprintln!("switchyard: {traced}");
                ExitCode::from(EXIT_NOT_FOUND)
            } else {
                ExitCode::SUCCESS
            }
        }
        Ok(Err(e)) => failed(&e),
        Err(e) => {
            eprintln!("switchyard: the trace task failed: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// lapin spawns its I/O threads with the default stack size, which only
/// [`STACK_ENV`] can raise. When it is unset or below [`THREAD_STACK`],
/// re-executes this binary with it set: `exec` keeps the pid, arguments and
/// open descriptors, so supervisors and signals see the same process. Runs
/// before any thread is spawned, as `exec` discards them. On failure, warns
/// and carries on.
fn ensure_thread_stack() {
    use std::os::unix::process::CommandExt;
    let current = std::env::var(STACK_ENV).ok();
    if current
        .as_deref()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .is_some_and(|n| n >= THREAD_STACK)
    {
        return;
    }
    let exe = running_binary();
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| "switchyard".into());
    let error = match exe {
        Ok(exe) => std::process::Command::new(exe)
            .arg0(arg0)
            .args(args)
            .env(STACK_ENV, THREAD_STACK.to_string())
            .exec(),
        Err(e) => e,
    };
    tracing::warn!(
        %error,
        current = current.as_deref().unwrap_or("unset"),
        needed = THREAD_STACK,
        "cannot re-execute with {STACK_ENV} raised; a message with deeply nested headers may overflow a thread's stack"
    );
}

/// The path to re-execute: the running binary's own path, so the process
/// keeps its name (the kernel names a process after the file it executes,
/// and `pgrep switchyard` looks for that name). When that path no longer
/// holds the running binary (it was moved, or replaced by an upgrade),
/// `/proc/self/exe`, which always does, at the cost of the name `exe`.
fn running_binary() -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let path = std::env::current_exe()?;
    if !cfg!(target_os = "linux") {
        return Ok(path);
    }
    let running = std::path::PathBuf::from("/proc/self/exe");
    let same_file = match (std::fs::metadata(&path), std::fs::metadata(&running)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    };
    Ok(if same_file { path } else { running })
}

/// Logs to stderr in `format`, at the levels `RUST_LOG` asks for (info by
/// default), without the AMQP library's own warnings and errors
/// ([`switchyard::telemetry::library_event_allowed`]).
fn init_tracing(format: LogFormat) {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let library =
        tracing_subscriber::filter::filter_fn(switchyard::telemetry::library_event_allowed);
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter).with(library);
    match format {
        LogFormat::Text => registry
            .with(
                lines
                    .fmt_fields(escaped_fields())
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
            .init(),
        LogFormat::Json => registry
            .with(
                lines
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_span_list(false),
            )
            .init(),
    }
}

/// The text format's fields as the default formatter writes them
/// (`name=value`, the message bare), with every control and bidirectional
/// formatting character escaped: a field may carry a producer's or a
/// broker's text (a broker's error echoes the names it was given), and no
/// such text may start a line of its own or rewrite the terminal. The JSON
/// format escapes by itself.
fn escaped_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + 'static {
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|writer, field, value| {
        let text = format!("{value:?}");
        let text = switchyard::errors::escaped(&text);
        match field.name() {
            "message" => write!(writer, "{text}"),
            name => write!(writer, "{}={text}", name.trim_start_matches("r#")),
        }
    })
    .delimited(" ")
}

/// Completes on SIGINT or SIGTERM. SIGHUP reloads the configuration
/// ([`switchyard::reload::sources`]).
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM; SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
    }
}
