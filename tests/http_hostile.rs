//! Hostile clients against the real binary's HTTP ingress and admin
//! endpoint: bodies trickled a byte per segment cost memory by the bytes
//! received, slow bodies hold no delivery slot and give their connection
//! to waiting requests, floods of idle connections
//! are shed so probes and requests answer within a second, authentication
//! cannot be switched off by an override or talked around by an odd
//! request, and refusals cannot flood the log.
//!
//! The tests that time answers or read a process's memory take turns
//! ([`SERIAL`]), so that one's load is not another's latency.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use support::config::{Forwarder, Value};
use support::harness::{Process, clean_command, wait_consumers};
use support::ingress::{Client, start_ingress, stop_clean};
use support::procfs;
use support::{
    DEFAULT_TIMEOUT, Metrics, TestBroker, delete_all_with_prefix, free_admin_addr, http_get,
    unique_prefix, wait_for, wait_until,
};
use switchyard::Options;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// One timing- or memory-sensitive test at a time in this binary.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The seed forwarder as a process of its own, its ingress and admin
/// endpoint on fresh loopback ports, consuming `<p>.in`.
async fn spawn_forwarder(
    broker: &TestBroker,
    p: &str,
    http: &[(&str, Value)],
) -> (Process, SocketAddr, SocketAddr) {
    let (ingress, admin) = (free_admin_addr(), free_admin_addr());
    let mut keys = vec![("listen", Value::from(ingress.to_string().as_str()))];
    keys.extend_from_slice(http);
    let toml = Forwarder::new(p)
        .seed(p)
        .admin(&admin.to_string())
        .http(&keys)
        .toml();
    let process = Process::spawn(p, &toml);
    wait_consumers(broker, &format!("{p}.in"), 1).await;
    wait_until("the ingress listens", DEFAULT_TIMEOUT, || async {
        TcpStream::connect(ingress).await.is_ok()
    })
    .await;
    (process, ingress, admin)
}

/// Stops `process` with SIGTERM (exit 0), checks nothing was dead-lettered
/// and removes prefix `p`'s queues.
async fn stop_process(mut process: Process, broker: &TestBroker, p: &str) {
    let dead = broker.try_queue_len(&format!("{p}.dlq")).await;
    assert!(matches!(dead, None | Some(0)), "dead-lettered: {dead:?}");
    process.signal("TERM");
    assert_eq!(process.wait_exit(DEFAULT_TIMEOUT).await, Some(0));
    delete_all_with_prefix(p).await;
}

/// Waits until the service and logging queues of prefix `p` hold `n`
/// copies each, and checks they hold no more.
async fn both_hold_exactly(broker: &TestBroker, p: &str, n: u32) {
    for queue in ["service", "logging"] {
        let queue = format!("{p}.{queue}");
        broker.await_count(&queue, n, DEFAULT_TIMEOUT).await;
        assert_eq!(broker.queue_len(&queue).await, n, "{queue}");
    }
}

async fn metrics(admin: SocketAddr) -> Metrics {
    let page = http_get(admin, "/metrics")
        .await
        .unwrap_or_else(|e| panic!("/metrics: {e}"));
    Metrics::parse(&page.body)
}

/// A connection that has sent the head of a `POST /messages/k` whose body
/// is `length` bytes long, and nothing of the body yet.
async fn open_body(addr: SocketAddr, length: usize) -> TcpStream {
    let mut stream = TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    stream
        .set_nodelay(true)
        .unwrap_or_else(|e| panic!("nodelay: {e}"));
    let head = format!(
        "POST /messages/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {length}\r\n\r\n"
    );
    stream
        .write_all(head.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("write head: {e}"));
    stream
}

/// Sends `raw` as it is and reads the answer until the server closes.
async fn raw_exchange(addr: SocketAddr, raw: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    stream
        .write_all(raw)
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    read_answer(&mut stream).await
}

async fn read_answer(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let read = tokio::time::timeout(DEFAULT_TIMEOUT, stream.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "no answer within {DEFAULT_TIMEOUT:?}");
    String::from_utf8_lossy(&out).into_owned()
}

fn status_of(answer: &str) -> u16 {
    answer
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"))
}

/// Item 1. Twenty bodies trickled one byte per TCP segment, held open
/// mid-body, cost the forwarder less than 16 MiB together; a full 1 MiB body
/// sent in one-byte writes costs at most twice its size; every one is then
/// delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickled_bodies_cost_memory_by_the_bytes_received_not_the_segments() {
    const CONNECTIONS: usize = 20;
    const TRICKLED: usize = 5_000;
    const FULL: usize = 1024 * 1024;
    let _turn = SERIAL.lock().await;
    let p = unique_prefix("http-trickle-memory");
    let broker = TestBroker::connect(&p).await;
    let slow = Value::from(300_000u32);
    let (process, ingress, _) = spawn_forwarder(
        &broker,
        &p,
        &[
            ("body_timeout_ms", slow.clone()),
            ("request_timeout_ms", slow),
        ],
    )
    .await;
    // Warm: the first requests allocate what every later one reuses.
    let client = Client::new(ingress);
    for _ in 0..20 {
        assert_eq!(client.post("/messages/k", &[], b"warm").await.status, 202);
    }
    let before = process.rss_kib();

    let mut streams = Vec::new();
    for _ in 0..CONNECTIONS {
        streams.push(open_body(ingress, TRICKLED + 1).await);
    }
    // One byte per write, each write its own segment (no delay) and the
    // server's own read, paced so that reads do not coalesce.
    for _ in 0..TRICKLED {
        for stream in &mut streams {
            stream
                .write_all(b"x")
                .await
                .unwrap_or_else(|e| panic!("trickle: {e}"));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let trickled = process.rss_kib().saturating_sub(before);
    assert!(
        trickled < 16 * 1024,
        "{CONNECTIONS} bodies of {TRICKLED} trickled bytes grew the forwarder by {trickled} KiB"
    );
    for stream in &mut streams {
        stream
            .write_all(b"x")
            .await
            .unwrap_or_else(|e| panic!("last byte: {e}"));
        let answer = read_answer(stream).await;
        assert_eq!(status_of(&answer), 202, "{answer}");
    }

    let before = process.rss_kib();
    let mut stream = open_body(ingress, FULL).await;
    for _ in 0..FULL - 1 {
        stream
            .write_all(b"y")
            .await
            .unwrap_or_else(|e| panic!("write: {e}"));
    }
    // The body is all there but its last byte, read off the socket by
    // the forwarder: measured while it holds it.
    let (server, mine) = (
        ingress,
        stream.local_addr().unwrap_or_else(|e| panic!("{e}")),
    );
    wait_until(
        "the forwarder has read the body",
        DEFAULT_TIMEOUT,
        || async { procfs::unread_bytes(server, mine) == Some(0) },
    )
    .await;
    let full = process.rss_kib().saturating_sub(before);
    assert!(
        full <= 2 * FULL as u64 / 1024,
        "a {FULL}-byte body in one-byte writes grew the forwarder by {full} KiB"
    );
    stream
        .write_all(b"y")
        .await
        .unwrap_or_else(|e| panic!("last byte: {e}"));
    let answer = read_answer(&mut stream).await;
    assert_eq!(status_of(&answer), 202, "{answer}");
    eprintln!(
        "resident memory: {CONNECTIONS} trickled bodies of {TRICKLED} bytes +{trickled} KiB; \
         one {FULL}-byte body in one-byte writes +{full} KiB"
    );

    let copies = 20 + CONNECTIONS as u32 + 1;
    both_hold_exactly(&broker, &p, copies).await;
    stop_process(process, &broker, &p).await;
}

/// Item 2. Three hundred bodies trickling a byte a second hold no delivery
/// slot (`max_in_flight` is 50): complete requests sent every half second
/// for ten seconds are each answered 202 within a second. The trickled
/// bodies are then cut off by `body_timeout_ms` with a 408 that names it,
/// and nothing of them is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_hold_no_slot_and_finished_requests_are_served_at_once() {
    const TRICKLES: usize = 300;
    let _turn = SERIAL.lock().await;
    let p = unique_prefix("http-slow-bodies");
    let broker = TestBroker::connect(&p).await;
    let config = Forwarder::new(&p).seed(&p).http(&[
        ("max_in_flight", Value::from(50u32)),
        ("body_timeout_ms", Value::from(12_000u32)),
    ]);
    let (running, client) = start_ingress(
        &config,
        Options::default(),
        Some((&broker, &format!("{p}.in"))),
    )
    .await;

    let mut trickles = Vec::new();
    for _ in 0..TRICKLES {
        let stream = open_body(client.addr(), 100).await;
        trickles.push(tokio::spawn(trickle_until_answered(stream)));
    }

    let mut slowest = Duration::ZERO;
    let started = Instant::now();
    let mut sent = 0u32;
    while started.elapsed() < Duration::from_secs(10) {
        let due = started + Duration::from_millis(500) * sent;
        tokio::time::sleep_until(due).await;
        let asked = Instant::now();
        let reply = client.post("/messages/k", &[], b"complete").await;
        let took = asked.elapsed();
        slowest = slowest.max(took);
        assert_eq!(reply.status, 202, "{}", reply.text);
        assert!(
            took < Duration::from_secs(1),
            "a complete request took {took:?} beside {TRICKLES} slow bodies"
        );
        sent += 1;
    }
    eprintln!("{sent} complete requests beside {TRICKLES} slow bodies, slowest {slowest:?}");

    for trickle in trickles {
        let answer = trickle.await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(status_of(&answer), 408, "{answer}");
        assert!(answer.contains("body_timeout_ms"), "{answer}");
    }
    // Only the complete requests: nothing of the cut-off bodies.
    both_hold_exactly(&broker, &p, sent).await;
    stop_clean(running, &broker, &p).await;
}

/// Item 3. More slow bodies than connection slots: 300 bodies trickling a
/// byte every two seconds against `max_connections = 200`. The bodies past
/// their first second below 1 KiB/s give way, slowest first, to clients
/// waiting for a slot (each answered 408 naming why): once the hundred
/// waiting trickles have been let in that way, complete requests sent every
/// half second for ten seconds are each answered 202 within a second, and
/// a 200 KiB body sent at 100 KiB/s in 1 KiB pieces meanwhile is never cut
/// and is forwarded whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_give_their_connection_to_waiting_requests() {
    const TRICKLES: usize = 300;
    const SLOTS: u32 = 200;
    let _turn = SERIAL.lock().await;
    let p = unique_prefix("http-slow-slots");
    let broker = TestBroker::connect(&p).await;
    let config = Forwarder::new(&p).seed(&p).http(&[
        ("max_connections", Value::from(SLOTS)),
        ("max_in_flight", Value::from(50u32)),
        ("body_timeout_ms", Value::from(20_000u32)),
    ]);
    let (running, client) = start_ingress(
        &config,
        Options::default(),
        Some((&broker, &format!("{p}.in"))),
    )
    .await;
    let mut trickles = Vec::new();
    for _ in 0..TRICKLES {
        let stream = open_body(client.addr(), 100).await;
        trickles.push(tokio::spawn(trickle_every(stream, Duration::from_secs(2))));
    }
    let shed = |running: &switchyard::Telemetry| {
        Metrics::parse(&running.render()).value(
            "switchyard_connections_shed_total",
            &[("listener", "ingress")],
        )
    };
    let extra = (TRICKLES - SLOTS as usize) as f64;
    wait_until(
        "the waiting trickles are let in, slow bodies cut for them",
        DEFAULT_TIMEOUT,
        || async { shed(running.telemetry()) >= extra },
    )
    .await;

    // A body at 100 KiB/s, in 1 KiB pieces, beside them.
    let steady = {
        let addr = client.addr();
        tokio::spawn(async move {
            let mut stream = open_body(addr, 200 * 1024).await;
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            for _ in 0..200 {
                tick.tick().await;
                stream
                    .write_all(&[b's'; 1024])
                    .await
                    .unwrap_or_else(|e| panic!("steady body: {e}"));
            }
            read_answer(&mut stream).await
        })
    };
    let mut slowest = Duration::ZERO;
    let started = Instant::now();
    let mut sent = 0u32;
    while started.elapsed() < Duration::from_secs(10) {
        let due = started + Duration::from_millis(500) * sent;
        tokio::time::sleep_until(due).await;
        let asked = Instant::now();
        let reply = client.post("/messages/k", &[], b"complete").await;
        let took = asked.elapsed();
        slowest = slowest.max(took);
        assert_eq!(reply.status, 202, "{}", reply.text);
        assert!(
            took < Duration::from_secs(1),
            "a complete request took {took:?} beside {TRICKLES} slow bodies and {SLOTS} slots"
        );
        sent += 1;
    }
    let steady = steady.await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status_of(&steady), 202, "the steady body: {steady}");
    eprintln!(
        "{sent} complete requests and a 100 KiB/s body beside {TRICKLES} slow bodies on \
         {SLOTS} slots: slowest answer {slowest:?}, {} connections cut or shed",
        shed(running.telemetry())
    );
    let mut cut = 0;
    for trickle in trickles {
        let answer = trickle.await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(status_of(&answer), 408, "{answer}");
        if answer.contains("slower than 1024 bytes a second") {
            cut += 1;
        } else {
            assert!(answer.contains("body_timeout_ms"), "{answer}");
        }
    }
    assert!(cut >= extra as usize, "{cut} bodies cut for room");
    // The complete requests and the steady body; nothing of the cut ones.
    both_hold_exactly(&broker, &p, sent + 1).await;
    stop_clean(running, &broker, &p).await;
}

/// Writes a byte of the body on `stream` every `every` until the server
/// answers, and returns the answer.
async fn trickle_every(mut stream: TcpStream, every: Duration) -> String {
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            read = stream.read(&mut chunk) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
            },
            _ = tick.tick(), if answer.is_empty() => {
                let _ = stream.write_all(b"z").await;
            }
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// Writes a byte of the body on `stream` every second until the server
/// answers, and returns the answer. Reading while writing: the answer of a
/// request whose body is cut off comes before the body ends.
async fn trickle_until_answered(mut stream: TcpStream) -> String {
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            read = stream.read(&mut chunk) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
            },
            _ = tick.tick(), if answer.is_empty() => {
                let _ = stream.write_all(b"z").await;
            }
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// Clients that connect, send nothing, and reconnect as soon as the
/// server closes them (after a pause), until ended.
struct Flood {
    stop: Arc<AtomicBool>,
    /// Connections opened so far, by every client.
    opened: Arc<AtomicUsize>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Flood {
    fn start(addr: SocketAddr, clients: usize, pause: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicUsize::new(0));
        let clients = (0..clients)
            .map(|_| tokio::spawn(idle_client(addr, pause, stop.clone(), opened.clone())))
            .collect();
        Self {
            stop,
            opened,
            clients,
        }
    }

    /// Waits until the clients have opened `n` connections in all.
    async fn opened(&self, n: usize) {
        wait_until(
            &format!("{n} idle connections"),
            DEFAULT_TIMEOUT,
            || async { self.opened.load(Ordering::Relaxed) >= n },
        )
        .await;
    }

    /// Ends the flood; how many connections it opened.
    async fn end(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        for client in self.clients {
            client.await.unwrap_or_else(|e| panic!("{e}"));
        }
        self.opened.load(Ordering::Relaxed)
    }
}

async fn idle_client(
    addr: SocketAddr,
    pause: Duration,
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicUsize>,
) {
    while !stop.load(Ordering::Relaxed) {
        let connected =
            tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr)).await;
        let Ok(Ok(mut stream)) = connected else {
            continue;
        };
        opened.fetch_add(1, Ordering::Relaxed);
        let mut byte = [0u8; 1];
        // Held until the server closes it, or the flood ends.
        while !stop.load(Ordering::Relaxed) {
            let read =
                tokio::time::timeout(Duration::from_millis(200), stream.read(&mut byte)).await;
            if matches!(read, Ok(Ok(0) | Err(_))) {
                break;
            }
        }
        tokio::time::sleep(pause).await;
    }
}

/// Item 3. Clients that connect, say nothing and reconnect when closed.
/// Against the admin port (32 connections), 1,500 of them, past its lobby
/// of 1,024, so the longest waiting are closed to make room: `/healthz`
/// and `/readyz` each answer within a second. Against the ingress (64
/// connections here, a 1 s header timeout so they keep reconnecting), 500:
/// a complete request is answered 202 within a second, the idle holding
/// none of the 64 slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_idle_connections_hold_no_slot_so_probes_and_requests_answer_in_a_second() {
    const FLOOD: usize = 500;
    const PAST_THE_LOBBY: usize = 1_500;
    const PAUSE: Duration = Duration::from_millis(50);
    let _turn = SERIAL.lock().await;
    let p = unique_prefix("http-idle-flood");
    let broker = TestBroker::connect(&p).await;
    let (process, ingress, admin) = spawn_forwarder(
        &broker,
        &p,
        &[
            ("max_connections", Value::from(64u32)),
            ("header_timeout_ms", Value::from(1_000u32)),
        ],
    )
    .await;

    let flood = Flood::start(admin, PAST_THE_LOBBY, PAUSE);
    flood.opened(100).await;
    let probes = ["/healthz", "/readyz"].iter().cycle();
    let during = probe_for(PROBING, probes, |path| async move {
        let answer = tokio::time::timeout(Duration::from_secs(1), http_get(admin, path)).await;
        matches!(&answer, Ok(Ok(r)) if r.status == 200)
            .then_some(())
            .ok_or(format!("{path}: {answer:?}"))
    })
    .await;
    let opened = flood.end().await;
    assert!(
        opened > PAST_THE_LOBBY,
        "the flood reconnected: {opened} connections"
    );
    eprintln!(
        "admin: {} probes, the slowest {:?}, under {opened} idle connections",
        during.0, during.1
    );
    let page = metrics(admin).await;
    let made_room = page.value(
        "switchyard_connections_shed_total",
        &[("listener", "admin")],
    );
    let lobby = switchyard::listen::gate::LOBBY_MIN;
    assert!(
        made_room >= (PAST_THE_LOBBY - lobby) as f64,
        "the admin port closed {made_room} idle connections for newer ones"
    );

    let flood = Flood::start(ingress, FLOOD, PAUSE);
    flood.opened(100).await;
    let client = Client::new(ingress);
    let requests = std::iter::repeat(&client);
    let during = probe_for(PROBING, requests, |client| async move {
        let reply = tokio::time::timeout(
            Duration::from_secs(1),
            client.post("/messages/k", &[], b"through the flood"),
        )
        .await;
        matches!(&reply, Ok(r) if r.status == 202)
            .then_some(())
            .ok_or(format!("{reply:?}"))
    })
    .await;
    let opened = flood.end().await;
    assert!(
        opened > 2 * FLOOD,
        "the flood reconnected: {opened} connections"
    );
    eprintln!(
        "ingress: {} requests, the slowest {:?}, under {opened} idle connections",
        during.0, during.1
    );
    let during = during.0 as u32;
    both_hold_exactly(&broker, &p, during).await;
    stop_process(process, &broker, &p).await;
}

/// How long probes run under a flood.
const PROBING: Duration = Duration::from_secs(3);

/// Runs `probe` on each item of `items` in turn, ten times a second for
/// `within`; each must answer within its own bound (`Ok`), and the
/// first that does not fails the test. How many ran, and the slowest.
async fn probe_for<I, F, Fut>(
    within: Duration,
    items: impl Iterator<Item = I>,
    probe: F,
) -> (usize, Duration)
where
    F: Fn(I) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    let (mut ran, mut slowest) = (0, Duration::ZERO);
    for item in items {
        if started.elapsed() >= within {
            break;
        }
        let asked = Instant::now();
        if let Err(why) = probe(item).await {
            panic!("under the flood, after {:?}: {why}", asked.elapsed());
        }
        ran += 1;
        slowest = slowest.max(asked.elapsed());
        tokio::time::sleep_until(asked + Duration::from_millis(100)).await;
    }
    (ran, slowest)
}

/// Item 4, configuration. With a token in the file, an override of the
/// tokens that is empty, only commas or blank, or holds an empty entry is
/// refused by `check` (exit 2) naming the variable, never taken as "no
/// tokens"; a good override is taken.
#[test]
fn an_override_cannot_switch_authentication_off() {
    let p = unique_prefix("http-auth-override");
    let toml = Forwarder::new(&p)
        .seed(&p)
        .http(&[
            ("listen", Value::from("127.0.0.1:18099")),
            ("tokens", Value::from(["s3cret"])),
        ])
        .toml();
    let path = std::env::temp_dir().join(format!("{p}.toml"));
    std::fs::write(&path, toml).unwrap_or_else(|e| panic!("{e}"));
    let check = |tokens: &str| {
        let out = clean_command()
            .args(["check", "--config"])
            .arg(&path)
            .env("SWITCHYARD__INGRESS__HTTP__TOKENS", tokens)
            .output()
            .unwrap_or_else(|e| panic!("run check: {e}"));
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    for tokens in ["", ",", " ", "a,,b", "a,"] {
        let (code, text) = check(tokens);
        assert_eq!(code, Some(2), "tokens {tokens:?}: {text}");
        assert!(
            text.contains("SWITCHYARD__INGRESS__HTTP__TOKENS") && text.contains("is empty"),
            "tokens {tokens:?}: {text}"
        );
        assert!(!text.contains("anonymous"), "tokens {tokens:?}: {text}");
    }
    let (code, text) = check("a, b");
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("2 bearer token(s)"), "{text}");
    let _ = std::fs::remove_file(&path);
}

/// Item 4, requests. The bearer scheme in any case is the same token; two
/// `Authorization` or two `Idempotency-Key` headers are 400; a wrong
/// token's 401 closes the connection; a transfer coding other than chunked
/// is 501; a forwarded header that is not visible
/// ASCII is 400. Only the three accepted requests are published.
#[tokio::test]
async fn odd_requests_are_refused_and_the_scheme_is_matched_in_any_case() {
    let p = unique_prefix("http-odd");
    let broker = TestBroker::connect(&p).await;
    let config = Forwarder::new(&p).seed(&p).http(&[
        ("tokens", Value::from(["s3cret"])),
        ("forward_headers", Value::from(["x-tenant"])),
    ]);
    let (running, client) = start_ingress(
        &config,
        Options::default(),
        Some((&broker, &format!("{p}.in"))),
    )
    .await;
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let token = format!("{scheme} s3cret");
        let reply = client
            .post("/messages/k", &[("authorization", &token)], b"ok")
            .await;
        assert_eq!(reply.status, 202, "{scheme}: {}", reply.text);
    }
    let addr = client.addr();
    let request = |extra: &str, body: &str| {
        format!(
            "POST /messages/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
             Authorization: Bearer s3cret\r\n{extra}Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    for (what, raw, status) in [
        (
            "two Authorization headers",
            request("Authorization: Bearer other\r\n", "b"),
            400,
        ),
        (
            "two Idempotency-Key headers",
            request("Idempotency-Key: one\r\nIdempotency-Key: two\r\n", "b"),
            400,
        ),
    ] {
        let answer = raw_exchange(addr, raw.as_bytes()).await;
        assert_eq!(status_of(&answer), status, "{what}: {answer}");
        assert!(answer.contains("more than once"), "{what}: {answer}");
    }
    // A wrong token on a keep-alive connection: the 401 closes it at once,
    // not after the header timeout (5 s here).
    let mut stream = TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    let wrong = "POST /messages/k HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n\
                 Content-Length: 1\r\n\r\nb";
    assert!(stream.write_all(wrong.as_bytes()).await.is_ok());
    let mut answer = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut answer));
    assert!(
        matches!(closed.await, Ok(Ok(_))),
        "a 401 closes its connection"
    );
    let answer = String::from_utf8_lossy(&answer);
    assert_eq!(status_of(&answer), 401, "{answer}");
    let gzip = "POST /messages/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
                Authorization: Bearer s3cret\r\nTransfer-Encoding: gzip, chunked\r\n\r\n\
                1\r\nb\r\n0\r\n\r\n";
    let answer = raw_exchange(addr, gzip.as_bytes()).await;
    assert_eq!(status_of(&answer), 501, "{answer}");
    let mut non_ascii = request("X-Tenant: caf", "b").into_bytes();
    let at = non_ascii
        .windows(3)
        .position(|w| w == b"caf")
        .unwrap_or_else(|| panic!("the header is there"))
        + 3;
    for (i, byte) in b"\xc3\xa9\r\n".iter().enumerate() {
        non_ascii.insert(at + i, *byte);
    }
    let answer = raw_exchange(addr, &non_ascii).await;
    assert_eq!(status_of(&answer), 400, "{answer}");
    assert!(answer.contains("x-tenant is not visible ASCII"), "{answer}");

    // Only the three accepted.
    both_hold_exactly(&broker, &p, 3).await;
    stop_clean(running, &broker, &p).await;
}

/// Item 5. A thousand requests without the token are each counted, but
/// logged a handful of times at most, each line with how many it stands
/// for; a head too large for the HTTP layer, refused by it, is counted too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_refusals_are_counted_one_by_one_and_logged_a_handful_of_times() {
    const REFUSED: usize = 1_000;
    let _turn = SERIAL.lock().await;
    let p = unique_prefix("http-refusal-log");
    let broker = TestBroker::connect(&p).await;
    let (process, ingress, admin) =
        spawn_forwarder(&broker, &p, &[("tokens", Value::from(["s3cret"]))]).await;
    let sent = Arc::new(AtomicUsize::new(0));
    let senders: Vec<_> = (0..10)
        .map(|_| {
            let sent = sent.clone();
            tokio::spawn(async move {
                let client = Client::new(ingress);
                while sent.fetch_add(1, Ordering::Relaxed) < REFUSED {
                    let reply = client.post("/messages/k", &[], b"no token").await;
                    assert_eq!(reply.status, 401, "{}", reply.text);
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await.unwrap_or_else(|e| panic!("{e}"));
    }
    let counted = wait_for("every refusal counted", DEFAULT_TIMEOUT, || async {
        let n = metrics(admin)
            .await
            .get("switchyard_http_requests_total", &[("code", "401")]);
        n.filter(|n| *n >= REFUSED as f64)
    })
    .await;
    assert_eq!(counted, REFUSED as f64);
    let log = process.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("HTTP request refused"))
        .collect();
    assert!(
        !lines.is_empty() && lines.len() <= 10,
        "{} lines for {REFUSED} refusals:\n{}",
        lines.len(),
        lines.join("\n")
    );
    assert!(!log.contains("s3cret"), "the token is never logged");

    // The HTTP layer's own refusal of a head over 64 KiB is counted too.
    let big = format!(
        "POST /messages/k HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(100 * 1024)
    );
    let answer = raw_exchange(ingress, big.as_bytes()).await;
    assert_eq!(status_of(&answer), 431, "{answer}");
    wait_for("the 431 counted", DEFAULT_TIMEOUT, || async {
        let n = metrics(admin)
            .await
            .get("switchyard_http_requests_total", &[("code", "431")]);
        (n == Some(1.0)).then_some(())
    })
    .await;
    stop_process(process, &broker, &p).await;
}
