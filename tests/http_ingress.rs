//! The HTTP ingress against the real broker, with hyper's HTTP client: a
//! request becomes one confirmed copy per branch, byte for byte, and every
//! other answer says what happened, with nothing published when the
//! request is refused. Retries with the same `Idempotency-Key` send only
//! what is missing.

use crate::support;

use support::config::{Branch, Endpoint, Filter, Forwarder, Value};
use support::harness::InProcess;
use support::ingress::{Client, Reply, start_ingress, stop_clean};
use support::{DEFAULT_TIMEOUT, TestBroker, unique_prefix, wait_until};
use switchyard::Options;

/// Starts `config` with an ingress on a fresh loopback port and waits
/// until it consumes (its topology is prepared).
async fn start(config: &Forwarder, broker: &TestBroker, p: &str) -> (InProcess, Client) {
    let inbound = format!("{p}.in");
    start_ingress(config, Options::default(), Some((broker, &inbound))).await
}

/// A path, its request headers, the status expected and the branches delivered.
type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], u16, &'a [&'a str]);
/// A method, path, headers and body, and the status expected.
type Refusal<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, &'a [u8], u16);

fn seed(p: &str) -> Forwarder {
    Forwarder::new(p).seed(p).http(&[])
}

async fn queue_bodies(broker: &TestBroker, queue: &str) -> Vec<Vec<u8>> {
    broker
        .get_all(queue)
        .await
        .into_iter()
        .map(|m| m.body)
        .collect()
}

/// One branch, `service`, for routing key `k`, published through
/// `proxy` with a confirm timeout of `confirm_timeout_ms`: a broker the
/// test can stall under a request.
fn service_behind(p: &str, proxy: &support::FaultProxy, confirm_timeout_ms: u32) -> Forwarder {
    Forwarder::new(p)
        .broker("via", &proxy.amqp_url())
        .endpoint(
            Endpoint::queue("service", &format!("{p}.service"))
                .on("via")
                .set("confirm_timeout_ms", confirm_timeout_ms),
        )
        .filter("k", Filter::routing_key("k"))
        .branch(Branch::new("service", "k", "service"))
}

/// Waits until a request is refused with `429`: with `max_in_flight = 1`,
/// until the one slot is held. A request for no route is answered at once
/// (404) when it gets the slot, so it never holds it from another.
async fn slot_held(client: &Client) -> Reply {
    support::wait_for("a 429 while the slot is held", DEFAULT_TIMEOUT, || {
        let client = client.clone();
        async move {
            let reply = client.post("/messages/nowhere", &[], b"extra").await;
            (reply.status == 429).then_some(reply)
        }
    })
    .await
}

#[tokio::test]
async fn a_request_is_one_confirmed_copy_per_branch_byte_for_byte() {
    let p = unique_prefix("http-happy");
    let broker = TestBroker::connect(&p).await;
    let config = seed(&p).http(&[("forward_headers", Value::from(["X-Tenant"]))]);
    let (running, client) = start(&config, &broker, &p).await;

    let body: Vec<u8> = (0..=255u8).chain([0, 0, 13, 10]).collect();
    let reply = client
        .post(
            "/messages/orders.eu",
            &[
                ("content-type", "application/octet-stream"),
                ("idempotency-key", "order-1"),
                ("x-correlation-id", "corr-1"),
                ("x-tenant", "acme"),
                ("x-not-forwarded", "no"),
            ],
            &body,
        )
        .await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    assert_eq!(reply.json["message_id"], "order-1");
    assert_eq!(reply.names("delivered"), ["logging", "service"]);
    assert!(reply.names("failed").is_empty());

    for queue in ["service", "logging"] {
        let got = broker.get_all(&format!("{p}.{queue}")).await;
        assert_eq!(got.len(), 1, "{queue}");
        let m = &got[0];
        assert_eq!(m.body, body, "{queue}: the body byte for byte");
        let props = &m.properties;
        assert_eq!(
            props.message_id().as_ref().map(|s| s.as_str()),
            Some("order-1")
        );
        assert_eq!(
            props.correlation_id().as_ref().map(|s| s.as_str()),
            Some("corr-1")
        );
        assert_eq!(
            props.content_type().as_ref().map(|s| s.as_str()),
            Some("application/octet-stream")
        );
        assert_eq!(*props.delivery_mode(), Some(2));
        assert!(props.timestamp().is_some_and(|t| t > 1_700_000_000));
        assert_eq!(m.header_str("x-tenant").as_deref(), Some("acme"));
        assert_eq!(m.header("x-not-forwarded"), None);
        assert_eq!(
            m.header_str("x-switchyard-copy-id"),
            Some(format!("{queue}:order-1"))
        );
    }
    // Without a key, a new UUID names the message; an empty body is a message too.
    let reply = client.post("/messages/x", &[], b"").await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    let id = reply.json["message_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(uuid::Uuid::parse_str(&id).is_ok(), "{id}");
    let got = broker.get_all(&format!("{p}.service")).await;
    assert_eq!(got.len(), 1);
    assert!(got[0].body.is_empty());
    assert_eq!(
        got[0]
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.to_string()),
        Some(id)
    );

    let metrics = running.telemetry().render();
    assert!(
        metrics.contains("switchyard_http_requests_total{code=\"202\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("switchyard_http_request_seconds_count 2"),
        "{metrics}"
    );
    stop_clean(running, &broker, &p).await;
}

#[tokio::test]
async fn the_path_and_forwarded_headers_route_and_no_route_is_404() {
    let p = unique_prefix("http-route");
    let broker = TestBroker::connect(&p).await;
    let config = Forwarder::new(&p)
        .endpoint(Endpoint::queue("orders", &format!("{p}.orders")))
        .endpoint(Endpoint::queue("audit", &format!("{p}.audit")))
        .filter("orders", Filter::routing_key("orders.#"))
        .filter("acme", Filter::header("x-tenant").set("equals", "acme"))
        .branch(Branch::new("orders", "orders", "orders"))
        .branch(Branch::new("audit", "acme", "audit"))
        .http(&[("forward_headers", Value::from(["x-tenant"]))]);
    let (running, client) = start(&config, &broker, &p).await;

    let tenant = [("x-tenant", "acme")];
    let cases: [Case; 4] = [
        ("/messages/orders.eu.new", &[], 202, &["orders"]),
        ("/messages/orders.eu", &tenant, 202, &["audit", "orders"]),
        ("/messages/billing", &tenant, 202, &["audit"]),
        ("/messages/billing", &[], 404, &[]),
    ];
    for (path, headers, status, branches) in cases {
        let reply = client.post(path, headers, b"{}").await;
        assert_eq!(reply.status, status, "{path}: {}", reply.text);
        assert_eq!(reply.names("delivered"), branches, "{path}");
    }
    assert_eq!(queue_bodies(&broker, &format!("{p}.orders")).await.len(), 2);
    assert_eq!(queue_bodies(&broker, &format!("{p}.audit")).await.len(), 2);
    stop_clean(running, &broker, &p).await;
}

#[tokio::test]
async fn refused_requests_publish_nothing_and_say_why() {
    let p = unique_prefix("http-refuse");
    let broker = TestBroker::connect(&p).await;
    let config = Forwarder::new(&p)
        .endpoint(Endpoint::queue("service", &format!("{p}.service")))
        .filter("json", Filter::json("/kind").set("equals", "order"))
        .branch(Branch::new("service", "json", "service"))
        .http(&[
            ("tokens", Value::from(["s3cret"])),
            ("max_body_bytes", Value::from(1024u32)),
        ]);
    let (running, client) = start(&config, &broker, &p).await;
    let auth = ("authorization", "Bearer s3cret");
    let order = br#"{"kind":"order"}"#;

    let unauthorized = client.post("/messages/k", &[], order).await;
    assert_eq!(unauthorized.status, 401, "{}", unauthorized.text);
    assert_eq!(
        unauthorized
            .headers
            .get("www-authenticate")
            .map(String::as_str),
        Some("Bearer")
    );
    let wrong = client
        .post("/messages/k", &[("authorization", "Bearer nope")], order)
        .await;
    assert_eq!(wrong.status, 401);
    let big = vec![b'x'; 1025];
    let long_key = "k".repeat(256);
    let cases: Vec<Refusal> = vec![
        ("GET", "/messages/k", vec![auth], b"", 405),
        ("POST", "/elsewhere", vec![auth], order, 404),
        ("POST", "/messages/k", vec![auth], &big, 413),
        (
            "POST",
            "/messages/k",
            vec![auth, ("idempotency-key", &long_key)],
            order,
            400,
        ),
        ("POST", "/messages/%ZZ", vec![auth], order, 400),
        ("POST", "/messages/k", vec![auth], b"not json", 415),
        (
            "POST",
            "/messages/k",
            vec![auth],
            br#"{"kind":"refund"}"#,
            404,
        ),
    ];
    for (method, path, headers, body, status) in cases {
        let reply = client.send(method, path, &headers, body).await;
        assert_eq!(reply.status, status, "{method} {path}: {}", reply.text);
        assert!(
            reply.json["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{method} {path}: a reason: {}",
            reply.text
        );
    }
    assert_eq!(
        broker.queue_len(&format!("{p}.service")).await,
        0,
        "nothing published"
    );
    let ok = client.post("/messages/k", &[auth], order).await;
    assert_eq!(ok.status, 202, "{}", ok.text);
    assert_eq!(broker.queue_len(&format!("{p}.service")).await, 1);
    stop_clean(running, &broker, &p).await;
}

#[tokio::test]
async fn a_retry_after_a_502_reaches_only_the_failed_branch() {
    let p = unique_prefix("http-retry");
    let broker = TestBroker::connect(&p).await;
    // The service queue is missing (the broker returns the copy) and has no backup.
    let config = Forwarder::new(&p)
        .endpoint(Endpoint::queue("service", &format!("{p}.service")).undeclared())
        .endpoint(Endpoint::queue("logging", &format!("{p}.logging")))
        .filter("all", Filter::match_all())
        .branch(Branch::new("service", "all", "service"))
        .branch(Branch::new("logging", "all", "logging"))
        .http(&[]);
    let (running, client) = start(&config, &broker, &p).await;
    let key = [("idempotency-key", "retry-1")];

    let failed = client.post("/messages/k", &key, b"work").await;
    assert_eq!(failed.status, 502, "{}", failed.text);
    assert_eq!(failed.names("delivered"), ["logging"]);
    assert_eq!(failed.names("failed"), ["service"]);
    assert_eq!(failed.json["failed"][0]["endpoint"], "service");

    broker.declare_queue(&format!("{p}.service")).await;
    let retried = client.post("/messages/k", &key, b"work").await;
    assert_eq!(retried.status, 202, "{}", retried.text);
    assert_eq!(retried.names("delivered"), ["logging", "service"]);
    let again = client.post("/messages/k", &key, b"work").await;
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.text, retried.text, "the original record");
    let conflict = client.post("/messages/k", &key, b"other work").await;
    assert_eq!(conflict.status, 409, "{}", conflict.text);
    let moved = client.post("/messages/other", &key, b"work").await;
    assert_eq!(moved.status, 409, "another routing key: {}", moved.text);

    assert_eq!(
        queue_bodies(&broker, &format!("{p}.service")).await,
        [b"work".to_vec()]
    );
    assert_eq!(
        queue_bodies(&broker, &format!("{p}.logging")).await,
        [b"work".to_vec()],
        "the retries sent logging nothing"
    );
    stop_clean(running, &broker, &p).await;
}

#[tokio::test]
async fn an_unreachable_broker_is_503_with_retry_after_and_never_a_dead_letter() {
    let p = unique_prefix("http-down");
    let broker = TestBroker::connect(&p).await;
    // Nothing listens on this port: every connection is refused at once.
    let closed = support::ingress::ingress_listener().1;
    let config = Forwarder::new(&p)
        .broker("far", &format!("amqp://guest:guest@{closed}/%2f"))
        .endpoint(
            Endpoint::queue("service", &format!("{p}.service"))
                .undeclared()
                .on("far"),
        )
        .endpoint(Endpoint::queue("logging", &format!("{p}.logging")))
        .filter("all", Filter::match_all())
        .branch(Branch::new("service", "all", "service"))
        .branch(Branch::new("logging", "all", "logging"))
        .http(&[]);
    let (running, client) = start(&config, &broker, &p).await;
    let reply = client
        .post("/messages/k", &[("idempotency-key", "down-1")], b"w")
        .await;
    assert_eq!(reply.status, 503, "{}", reply.text);
    assert_eq!(
        reply.headers.get("retry-after").map(String::as_str),
        Some("5")
    );
    assert_eq!(reply.names("delivered"), ["logging"]);
    assert_eq!(reply.names("failed"), ["service"]);
    // The retry would send logging nothing: it was confirmed.
    let retried = client
        .post("/messages/k", &[("idempotency-key", "down-1")], b"w")
        .await;
    assert_eq!(retried.status, 503, "{}", retried.text);
    assert_eq!(broker.queue_len(&format!("{p}.logging")).await, 1);
    assert_eq!(broker.queue_len(&format!("{p}.dlq")).await, 0);
    stop_clean(running, &broker, &p).await;
}

/// The first request holds the only in-flight slot while its endpoint's
/// broker stalls; the second is answered 429 at once, the first 504 once
/// its time is up, and a retry after the broker is back completes it.
#[tokio::test]
async fn past_max_in_flight_is_429_and_a_stalled_broker_is_504() {
    let p = unique_prefix("http-stall");
    let broker = TestBroker::connect(&p).await;
    let proxy = support::FaultProxy::start(support::amqp_addr()).await;
    let config = service_behind(&p, &proxy, 3000).http(&[
        ("max_in_flight", Value::from(1u32)),
        ("request_timeout_ms", Value::from(1000u32)),
    ]);
    let (running, client) = start(&config, &broker, &p).await;
    let warm = client.post("/messages/k", &[], b"warm").await;
    assert_eq!(warm.status, 202, "{}", warm.text);

    proxy.stall();
    let key = [("idempotency-key", "stalled-1")];
    let first = {
        let client = client.clone();
        tokio::spawn(async move { client.post("/messages/k", &key, b"held").await })
    };
    let busy = slot_held(&client).await;
    assert_eq!(
        busy.headers.get("retry-after").map(String::as_str),
        Some("1")
    );
    let first = first.await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(first.status, 504, "{}", first.text);
    proxy.resume();

    let done = support::wait_for("the retry completes", DEFAULT_TIMEOUT, || {
        let client = client.clone();
        async move {
            let reply = client.post("/messages/k", &key, b"held").await;
            matches!(reply.status, 200 | 202).then_some(reply)
        }
    })
    .await;
    assert_eq!(done.names("delivered"), ["service"], "{}", done.text);
    let bodies = queue_bodies(&broker, &format!("{p}.service")).await;
    let held = bodies.iter().filter(|b| b.as_slice() == b"held").count();
    // The stalled copy may land once the broker is back: a duplicate the
    // copy id lets a consumer drop. Never lost.
    assert!((1..=2).contains(&held), "held copies: {held}");
    eprintln!(
        "stalled request: {held} copies of it delivered ({} duplicate)",
        held - 1
    );
    assert_eq!(
        bodies.iter().filter(|b| b.as_slice() == b"extra").count(),
        0
    );
    stop_clean(running, &broker, &p).await;
}

#[tokio::test]
async fn check_refuses_an_open_listener_without_tokens() {
    let p = unique_prefix("http-check");
    let toml = Forwarder::new(&p)
        .match_all(&p)
        .http(&[("listen", Value::from("0.0.0.0:18080"))])
        .toml();
    let err = switchyard::config::load_str(&toml, "test.toml")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("ingress.http.listen"), "{err}");
    assert!(err.contains("tokens"), "{err}");
    for extra in [
        ("tokens", Value::from(["t"])),
        ("allow_anonymous", Value::Bool(true)),
    ] {
        let toml = Forwarder::new(&p)
            .match_all(&p)
            .http(&[("listen", Value::from("0.0.0.0:18080")), extra.clone()])
            .toml();
        assert!(
            switchyard::config::load_str(&toml, "test.toml").is_ok(),
            "{extra:?}"
        );
    }
}

#[allow(dead_code)]
fn reply_summary(reply: &Reply) -> String {
    format!("{} {}", reply.status, reply.text)
}

#[allow(dead_code)]
async fn wait_len(broker: &TestBroker, queue: &str, n: u32) {
    wait_until(&format!("{queue} holds {n}"), DEFAULT_TIMEOUT, || async {
        broker.try_queue_len(queue).await == Some(n)
    })
    .await;
}

#[tokio::test]
async fn a_forwarder_fed_by_http_alone_consumes_nothing_and_serves_requests() {
    let p = unique_prefix("http-alone");
    let broker = TestBroker::connect(&p).await;
    let config = Forwarder::new(&p).without_queue().seed(&p).http(&[]);
    let toml = config.toml();
    assert!(
        !toml.contains("[inbound]") && !toml.contains("[dead_letter]"),
        "{toml}"
    );
    let admin = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let admin_addr = admin.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let options = Options {
        admin: Some(admin),
        ..Options::default()
    };
    let (running, client) = start_ingress(&config, options, None).await;
    support::wait_for("ready", DEFAULT_TIMEOUT, || async {
        let reply = support::http_get(admin_addr, "/readyz").await.ok()?;
        (reply.status == 200).then_some(())
    })
    .await;
    let reply = client.post("/messages/k", &[], b"alone").await;
    assert_eq!(reply.status, 202, "{}", reply.text);
    assert_eq!(reply.names("delivered"), ["logging", "service"]);
    assert_eq!(
        queue_bodies(&broker, &format!("{p}.service")).await,
        [b"alone".to_vec()]
    );
    assert!(
        !broker.queue_exists(&format!("{p}.in")).await,
        "no inbound queue is declared"
    );
    stop_clean(running, &broker, &p).await;
}

#[tokio::test]
async fn filters_see_the_method_and_path_and_put_means_post() {
    let p = unique_prefix("http-method");
    let broker = TestBroker::connect(&p).await;
    let config = Forwarder::new(&p)
        .endpoint(Endpoint::queue("puts", &format!("{p}.puts")))
        .filter(
            "put",
            Filter::header("x-switchyard-http-method").set("equals", "PUT"),
        )
        .filter(
            "v2",
            Filter::header("x-switchyard-http-path").set("regex", "^/messages/v2\\."),
        )
        .filter("either", Filter::any_of(&["put", "v2"]))
        .branch(Branch::new("puts", "either", "puts"))
        .http(&[]);
    let (running, client) = start(&config, &broker, &p).await;
    let put = client.send("PUT", "/messages/orders", &[], b"by put").await;
    assert_eq!(put.status, 202, "{}", put.text);
    let post = client.post("/messages/orders", &[], b"by post").await;
    assert_eq!(post.status, 404, "{}", post.text);
    let v2 = client.post("/messages/v2.orders", &[], b"by path").await;
    assert_eq!(v2.status, 202, "{}", v2.text);
    let got = broker.get_all(&format!("{p}.puts")).await;
    let bodies: Vec<String> = got.iter().map(|m| m.body_str()).collect();
    assert_eq!(bodies, ["by put", "by path"]);
    // The annotations are the forwarder's own: filters read them, copies do
    // not carry them.
    assert!(
        got.iter()
            .all(|m| m.header("x-switchyard-http-method").is_none())
    );
    assert_eq!(got[0].routing_key, format!("{p}.puts"));
    stop_clean(running, &broker, &p).await;
}

#[tokio::test]
async fn a_shutdown_bounds_a_request_in_flight_and_a_retry_after_restart_delivers_it() {
    let p = unique_prefix("http-shutdown");
    let broker = TestBroker::connect(&p).await;
    let proxy = support::FaultProxy::start(support::amqp_addr()).await;
    let config = service_behind(&p, &proxy, 30_000)
        .top("shutdown_timeout_ms", 2000)
        .http(&[("max_in_flight", Value::from(1u32))]);
    let (running, client) = start(&config, &broker, &p).await;
    let warm = client.post("/messages/k", &[], b"warm").await;
    assert_eq!(warm.status, 202, "{}", warm.text);

    proxy.stall();
    let key = [("idempotency-key", "at-shutdown-1")];
    let held = {
        let client = client.clone();
        tokio::spawn(async move {
            let reply = client.try_send("POST", "/messages/k", &key, b"held").await;
            (reply, std::time::Instant::now())
        })
    };
    // The one slot is taken once the held request is being delivered.
    slot_held(&client).await;

    // Without the bounds the held request would wait for its 30 s confirm
    // timeout. The shutdown gives it 2 s to be answered; the forwarder then
    // ends within its 2 s bound plus 2 s to close the stalled connection and
    // 5 s for the tasks behind it (docs/operations.md).
    let stopping = std::time::Instant::now();
    running.stop().await.unwrap_or_else(|e| panic!("{e}"));
    let took = stopping.elapsed();
    assert!(
        took < std::time::Duration::from_secs(13),
        "stopping took {took:?}"
    );
    let (held, held_ended) = held.await.unwrap_or_else(|e| panic!("{e}"));
    let held_took = held_ended.saturating_duration_since(stopping);
    assert!(
        held_took < std::time::Duration::from_secs(5),
        "the held request ended {held_took:?} into the shutdown"
    );
    // No confirm came, so no 202: either an answer that says the outcome
    // is unknown or the connection closed without one.
    match &held {
        Ok(reply) => assert!(
            matches!(reply.status, 503 | 504),
            "held request: {}",
            reply_summary(reply)
        ),
        Err(e) => eprintln!("held request: connection closed at shutdown ({e})"),
    }
    assert!(
        client
            .try_send("POST", "/messages/k", &[], b"late")
            .await
            .is_err(),
        "the listener still answers after the shutdown"
    );
    eprintln!("stopped in {took:?} with a request in flight, which ended after {held_took:?}");

    // The caller retries with the same key on the next instance: its
    // records died with the first, so the copy goes again; the stalled one
    // may land too once the broker answers, a duplicate with the same copy
    // id. Never none.
    proxy.resume();
    let (running, client) = start(&config, &broker, &p).await;
    let retry = client.post("/messages/k", &key, b"held").await;
    assert_eq!(retry.status, 202, "{}", reply_summary(&retry));
    let service = format!("{p}.service");
    wait_until("the retried copy arrives", DEFAULT_TIMEOUT, || {
        let broker = &broker;
        let service = &service;
        async move { broker.queue_len(service).await >= 2 }
    })
    .await;
    let bodies = queue_bodies(&broker, &service).await;
    let copies = bodies.iter().filter(|b| b.as_slice() == b"held").count();
    assert!((1..=2).contains(&copies), "held copies: {copies}");
    eprintln!(
        "held request: {copies} copies after the retry ({} duplicate)",
        copies - 1
    );
    for refused in [b"extra".as_slice(), b"late"] {
        assert_eq!(bodies.iter().filter(|b| b.as_slice() == refused).count(), 0);
    }
    stop_clean(running, &broker, &p).await;
}
