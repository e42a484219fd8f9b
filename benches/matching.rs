//! The cost of routing one message on a compiled table, without a broker:
//! a 100-entry table of mixed header, property, routing-key and combined
//! filters; a `json` filter on a 4 KiB JSON body (parsing included, as it
//! is once per message); an `xpath` filter on a 4 KiB XML body.
//!
//! `cargo bench --bench matching`; results in bench/README.md.

use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::time::Duration;
use switchyard::amqp::{AmqpValue, FieldTable, Properties};
use switchyard::config::{Settings, load_str};
use switchyard::envelope::Envelope;

const BASE: &str = r#"
[inbound]
broker = "main"
queue = "work.in"

[dead_letter]
exchange = "work.dlx"
routing_key = "work.dlq"

[brokers.main]
uri = "amqp://guest:guest@127.0.0.1:5672/%2f"

[endpoints.out]
broker = "main"
routing_key = "out"
"#;

fn settings(filters: &str) -> Settings {
    load_str(&format!("{BASE}{filters}"), "bench").unwrap_or_else(|e| panic!("{e}"))
}

/// 100 entries at priority 0, so every one is evaluated: ten each of header
/// equals (string and number), header in (float), header regex, header
/// exists, property equals, property in, routing-key pattern, `and`, `or`.
/// The message matches entries 91 (count = 42) and 99 (an `or` with 91).
fn mixed_table() -> Settings {
    let mut toml = String::new();
    for i in 0..100 {
        let n = if i == 91 { 42 } else { 1000 + i };
        let filter = match i % 10 {
            0 => format!("type = \"header\"\nheader = \"tenant\"\nequals = \"acme-{i}\""),
            1 => format!("type = \"header\"\nheader = \"count\"\nequals = {n}"),
            2 => format!("type = \"header\"\nheader = \"ratio\"\nin = [{i}.25, {i}.75]"),
            3 => format!("type = \"header\"\nheader = \"tenant\"\nregex = \"^t{i}-\""),
            4 => format!("type = \"header\"\nheader = \"absent-{i}\"\nexists = true"),
            5 => format!("type = \"property\"\nproperty = \"content_type\"\nequals = \"text/{i}\""),
            6 => format!("type = \"property\"\nproperty = \"priority\"\nin = [{i}, {n}]"),
            7 => format!("type = \"routing_key\"\npattern = \"orders.#.x{i}\""),
            8 => format!("type = \"and\"\nfilters = [\"f{}\", \"f{}\"]", i - 1, i - 2),
            _ => format!(
                "type = \"or\"\nfilters = [\"f{}\", \"f{}\", \"f{}\"]",
                i - 8,
                i - 9,
                i - 1
            ),
        };
        toml.push_str(&format!(
            "\n[filters.f{i}]\n{filter}\n\n[[filter_table]]\nname = \"b{i}\"\nfilter = \"f{i}\"\nendpoint = \"out\"\n"
        ));
    }
    settings(&toml)
}

fn message(body: Vec<u8>) -> Envelope {
    let mut headers = FieldTable::default();
    headers.insert("tenant".into(), AmqpValue::LongString("acme".into()));
    headers.insert("count".into(), AmqpValue::LongLongInt(42));
    headers.insert("ratio".into(), AmqpValue::Double(0.5));
    headers.insert("region".into(), AmqpValue::ShortString("eu".into()));
    Envelope {
        delivery_tag: 1,
        exchange: "orders".to_owned(),
        routing_key: "orders.new.eu".to_owned(),
        redelivered: false,
        properties: Properties::default()
            .with_headers(headers)
            .with_content_type("application/json".into())
            .with_priority(5),
        body,
        annotations: Default::default(),
    }
}

/// A 4 KiB JSON order with 40 lines; the status the filter reads is last.
fn json_body() -> Vec<u8> {
    let mut lines = Vec::new();
    let mut i = 0;
    loop {
        let line = format!(
            r#"{{"sku": "SKU-{i:05}", "qty": {}, "price": {}.{:02}, "gift": {}}}"#,
            i % 7 + 1,
            10 + i,
            i % 100,
            i % 2 == 0
        );
        lines.push(line);
        let body = format!(
            r#"{{"order": {{"id": "o-1", "customer": {{"region": "eu-west"}}, "lines": [{}], "status": "paid"}}}}"#,
            lines.join(", ")
        );
        if body.len() >= 4096 {
            return body.into_bytes();
        }
        i += 1;
    }
}

/// A 4 KiB XML invoice in a namespace; the total the filter reads is last.
fn xml_body() -> Vec<u8> {
    let mut lines = String::new();
    let mut i = 0;
    loop {
        lines.push_str(&format!(
            r#"<inv:line sku="SKU-{i:05}" qty="{}"><inv:price>{}.50</inv:price></inv:line>"#,
            i % 7 + 1,
            10 + i
        ));
        let body = format!(
            r#"<?xml version="1.0"?><inv:invoice xmlns:inv="urn:example:invoices"><inv:lines>{lines}</inv:lines><inv:total>250</inv:total></inv:invoice>"#
        );
        if body.len() >= 4096 {
            return body.into_bytes();
        }
        i += 1;
    }
}

fn matching(c: &mut Criterion) {
    let mixed = mixed_table();
    let plain = message(json_body());
    assert_eq!(mixed.routing.route(&plain).len(), 2);
    c.bench_function("100-entry mixed table, header/property/routing-key", |b| {
        b.iter(|| black_box(mixed.routing.route(black_box(&plain))))
    });

    let json = settings(
        r#"
[filters.paid]
type = "json"
pointer = "/order/status"
equals = "paid"

[[filter_table]]
name = "paid"
filter = "paid"
endpoint = "out"
"#,
    );
    let order = message(json_body());
    assert_eq!(json.routing.route(&order).len(), 1);
    c.bench_function("json filter, 4 KiB body (parse + pointer)", |b| {
        b.iter(|| black_box(json.routing.route(black_box(&order))))
    });

    let xpath = settings(
        r#"
[filters.big]
type = "xpath"
expression = "/inv:invoice[inv:total > 100]"
namespaces = { inv = "urn:example:invoices" }

[[filter_table]]
name = "big"
filter = "big"
endpoint = "out"
"#,
    );
    let invoice = message(xml_body());
    assert_eq!(xpath.routing.route(&invoice).len(), 1);
    c.bench_function("xpath filter, 4 KiB body (parse + evaluate)", |b| {
        b.iter(|| black_box(xpath.routing.route(black_box(&invoice))))
    });
}

criterion_group! {
    name = benches;
    // Short runs: this is a shared machine, and the figures are per message.
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = matching
}
criterion_main!(benches);
