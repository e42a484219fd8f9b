//! Validation: the contract's annotated example (config/spec-example.toml) loads, and each invalid configuration
//! fails with its exact one-line error.

use super::load::load_str_with_env;
use super::load_str;

use super::Settings;
use crate::destination::{DeadLetterMode, QueueType};
use crate::routing::Outage;

fn inbound(settings: &Settings) -> &crate::config::Inbound {
    settings
        .inbound()
        .as_ref()
        .unwrap_or_else(|| panic!("no [inbound]"))
}

fn dead_letter(settings: &Settings) -> &crate::destination::DeadLetter {
    settings
        .dead_letter()
        .as_ref()
        .unwrap_or_else(|| panic!("no [dead_letter]"))
}

const BASE: &str = r#"
[inbound]
broker = "main"
queue = "work.in"

[dead_letter]
exchange = "work.dlx"
routing_key = "work.dlq"
queue = "work.dlq"

[brokers.main]
uri = "amqp://guest:secret@127.0.0.1:5672/%2f"

[endpoints.primary]
broker = "main"
routing_key = "service.primary"

[endpoints.backup]
broker = "main"
routing_key = "service.backup"

[backup_lists]
backups = ["backup"]

[filters.all]
type = "match_all"

[[filter_table]]
name = "service"
filter = "all"
endpoint = "primary"
backup_list = "backups"
"#;

fn error_of(toml: &str) -> String {
    match load_str(toml, "test.toml") {
        Ok(_) => panic!("expected an error for:\n{toml}"),
        Err(e) => e.to_string(),
    }
}

fn with(extra: &str) -> String {
    format!("{BASE}\n{extra}")
}

#[test]
fn the_spec_example_is_valid() {
    let spec = include_str!("../../config/spec-example.toml");
    let settings = load_str(spec, "spec-example.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(inbound(&settings).prefetch, 1000);
    assert_eq!(dead_letter(&settings).mode, DeadLetterMode::Nack);
    assert_eq!(
        settings.routing.branch_names().collect::<Vec<_>>(),
        ["service", "logging"]
    );
    assert_eq!(
        settings.endpoints["primaryServiceQueue"]
            .confirm_timeout
            .as_millis(),
        5000
    );
}

#[test]
fn the_seed_config_is_valid() {
    let seed = include_str!("../../config/switchyard.toml");
    let settings = load_str(seed, "switchyard.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(settings.endpoints.len(), 4);
}

#[test]
fn defaults_apply() {
    let settings = load_str(BASE, "test.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(inbound(&settings).prefetch, 1000);
    assert!(inbound(&settings).declare);
    assert_eq!(settings.shutdown_timeout.as_millis(), 10_000);
    assert_eq!(
        settings.endpoints["primary"].confirm_timeout.as_millis(),
        5000
    );
    assert_eq!(settings.endpoints["primary"].retries, 0);
    assert_eq!(dead_letter(&settings).mode, DeadLetterMode::Nack);
    assert_eq!(inbound(&settings).queue_type, QueueType::Classic);
    assert_eq!(inbound(&settings).max_redeliveries, 10);
    assert_eq!(inbound(&settings).max_hops, 8);
    assert!(!inbound(&settings).dead_letter_by_policy);
    assert_eq!(dead_letter(&settings).queue_type, QueueType::Classic);
    let primary = &settings.endpoints["primary"];
    assert_eq!(primary.declare_queue_type, QueueType::Classic);
    assert_eq!(primary.probe_interval.as_millis(), 1000);
    assert_eq!(settings.routing.branch_names().count(), 1);
}

#[test]
fn new_keys_are_read() {
    let toml =
        BASE.replace(
            "queue = \"work.in\"",
            "queue = \"work.in\"\nqueue_type = \"quorum\"\nmax_redeliveries = 3\n\
             max_hops = 2\ndead_letter_by_policy = true",
        )
        .replace(
            "queue = \"work.dlq\"",
            "queue = \"work.dlq\"\nqueue_type = \"quorum\"",
        )
        .replace(
            "routing_key = \"service.primary\"",
            "routing_key = \"service.primary\"\ndeclare_queue = \"service.primary\"\n\
             declare_queue_type = \"quorum\"\nprobe_interval_ms = 250",
        )
        .replace(
            "backup_list = \"backups\"",
            "backup_list = \"backups\"\nrequired = true\noutage = \"dead_letter\"\n\
             outage_timeout_ms = 30000",
        ) + "\n[sessions]\nclosed_ttl_ms = 5000\n";
    let settings = load_str(&toml, "test.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(inbound(&settings).queue_type, QueueType::Quorum);
    assert_eq!(inbound(&settings).max_redeliveries, 3);
    assert_eq!(inbound(&settings).max_hops, 2);
    assert!(inbound(&settings).dead_letter_by_policy);
    assert_eq!(dead_letter(&settings).queue_type, QueueType::Quorum);
    let primary = &settings.endpoints["primary"];
    assert_eq!(primary.declare_queue_type, QueueType::Quorum);
    assert_eq!(primary.probe_interval.as_millis(), 250);
    assert_eq!(
        settings.endpoints["backup"].declare_queue_type,
        QueueType::Classic
    );
    let summary = settings.routing.summary();
    assert!(
        summary.contains("[failover, required, outage dead_letter after 30000 ms]"),
        "{summary}"
    );
    assert_eq!(settings.sessions, None, "sessions stay off unless enabled");
}

#[test]
fn one_worker_thread_unless_told_and_zero_is_one_per_core() {
    let default = load_str(BASE, "test.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(default.worker_threads, Some(1));
    let per_core = load_str(&format!("worker_threads = 0\n{BASE}"), "test.toml")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(per_core.worker_threads, None);
    let four = load_str(&format!("worker_threads = 4\n{BASE}"), "test.toml")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(four.worker_threads, Some(4));
}

#[test]
fn sessions_are_compiled_when_enabled() {
    let toml = BASE.to_owned()
        + "\n[sessions]\nenabled = true\nid_header = \"conv\"\nmax_open = 19\n\
           idle_timeout_ms = 1500\nclosed_ttl_ms = 5000\n";
    let settings = load_str(&toml, "test.toml").unwrap_or_else(|e| panic!("{e}"));
    let sessions = settings.sessions.unwrap_or_else(|| panic!("sessions off"));
    assert_eq!(sessions.id_header, "conv");
    assert_eq!(sessions.end_header, "session-end");
    assert_eq!(sessions.max_open * sessions.max_messages, 950);
    assert_eq!(sessions.idle_timeout.as_millis(), 1500);
    assert_eq!(sessions.closed_ttl.as_millis(), 5000);
}

#[test]
fn a_cluster_is_its_nodes_in_order_of_preference() {
    let toml = BASE.replace(
        "uri = \"amqp://guest:secret@127.0.0.1:5672/%2f\"",
        "uris = [\"amqp://guest:secret@rabbit-1/%2f\", \"amqp://guest:secret@rabbit-2:5673/%2f\"]",
    );
    let settings = load_str(&toml, "test.toml").unwrap_or_else(|e| panic!("{e}"));
    let main = &settings.brokers["main"];
    assert_eq!(main.nodes(), 2);
    assert_eq!(main.node(), "rabbit-1:5672");
    assert_eq!(main.node_of(1), "rabbit-2:5673");
    assert_eq!(
        main.redacted_uri(),
        "amqp://guest:***@rabbit-1/%2f, amqp://guest:***@rabbit-2:5673/%2f"
    );
    assert_eq!(main.uri_key(), "uris");
}

#[test]
fn the_forwarders_own_user_is_always_trusted_and_listed_users_besides() {
    let load = |toml: &str| load_str(toml, "test.toml");
    let settings = load(BASE).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(inbound(&settings).trusted_users, ["guest"]);
    let listed = BASE.replace(
        "queue = \"work.in\"\n",
        "queue = \"work.in\"\ntrusted_users = [\"upstream\", \"guest\"]\n",
    );
    let settings = load(&listed).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(inbound(&settings).trusted_users, ["upstream", "guest"]);
    let other = BASE.replace(
        "queue = \"work.in\"\n",
        "queue = \"work.in\"\ntrusted_users = [\"upstream\"]\n",
    );
    let settings = load(&other).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(inbound(&settings).trusted_users, ["guest", "upstream"]);
    let external = BASE.replace(
        "127.0.0.1:5672/%2f\"",
        "127.0.0.1:5672/%2f?auth_mechanism=external\"",
    );
    let settings = load(&external).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        inbound(&settings).trusted_users.is_empty(),
        "a certificate login names no user in the URI"
    );
    let empty = BASE.replace(
        "queue = \"work.in\"\n",
        "queue = \"work.in\"\ntrusted_users = [\"a\", \"\"]\n",
    );
    let error = load(&empty)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert_eq!(
        error,
        "test.toml: inbound.trusted_users[1]: must not be empty; name a RabbitMQ user"
    );
}

#[test]
fn filter_table_entries_default_to_optional_and_holding_through_outages() {
    let settings = load_str(BASE, "test.toml").unwrap_or_else(|e| panic!("{e}"));
    let summary = settings.routing.summary();
    assert!(summary.contains("[failover]"), "{summary}");
    let envelope = crate::envelope::Envelope {
        delivery_tag: 1,
        exchange: String::new(),
        routing_key: "k".to_owned(),
        redelivered: false,
        properties: Default::default(),
        body: Vec::new(),
        annotations: Default::default(),
    };
    let plans = settings.routing.route(&envelope);
    assert_eq!(plans.len(), 1);
    assert_eq!(plans[0].outage, Outage::Wait, "an outage holds by default");
}

#[test]
fn default_branch_name_is_filter_arrow_endpoint() {
    let toml = BASE.replace("name = \"service\"\n", "");
    let settings = load_str(&toml, "test.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        settings.routing.branch_names().collect::<Vec<_>>(),
        ["all->primary"]
    );
}

/// Asserts that each configuration fails to load with exactly its one-line error.
fn each_fails_with_its_exact_error(cases: Vec<(String, &str)>) {
    for (toml, expected) in cases {
        assert_eq!(error_of(&toml), expected);
    }
}

#[test]
fn a_broker_is_one_amqp_uri_or_a_clusters_uris_sharing_user_and_vhost() {
    each_fails_with_its_exact_error(vec![
        (
            BASE.replace(
                "amqp://guest:secret@127.0.0.1:5672/%2f",
                "http://guest:secret@127.0.0.1/",
            ),
            "test.toml: brokers.main.uri: must start with amqp:// or amqps://",
        ),
        (
            BASE.replace(
                "uri = \"amqp://guest:secret@127.0.0.1:5672/%2f\"",
                "uri = \"amqp://guest:secret@127.0.0.1:5672/%2f\"\nuris = [\"amqp://guest:secret@h2/%2f\"]",
            ),
            "test.toml: brokers.main.uris: give either uri (one node) or uris (a cluster's nodes), not both",
        ),
        (
            BASE.replace("uri = \"amqp://guest:secret@127.0.0.1:5672/%2f\"", ""),
            "test.toml: brokers.main.uri: missing; give uri (one node) or uris (a cluster's nodes, preferred first)",
        ),
        (
            BASE.replace("uri = \"amqp://guest:secret@127.0.0.1:5672/%2f\"", "uris = []"),
            "test.toml: brokers.main.uris: is empty; list the cluster's nodes, preferred first",
        ),
        (
            BASE.replace(
                "uri = \"amqp://guest:secret@127.0.0.1:5672/%2f\"",
                "uris = [\"amqp://guest:secret@h1/prod\", \"amqp://guest:secret@h2/test\"]",
            ),
            "test.toml: brokers.main.uris[1]: vhost \"test\" differs from uris[0]'s \"prod\"; the nodes of one broker share vhost, list another cluster as another broker",
        ),
        (
            BASE.replace(
                "uri = \"amqp://guest:secret@127.0.0.1:5672/%2f\"",
                "uris = [\"amqp://guest:secret@h1/prod\", \"amqp://other:secret@h2/prod\"]",
            ),
            "test.toml: brokers.main.uris[1]: user \"other\" differs from uris[0]'s \"guest\"; the nodes of one broker share user, list another cluster as another broker",
        ),
        (
            BASE.replace(
                "uri = \"amqp://guest:secret@127.0.0.1:5672/%2f\"",
                "uris = [\"amqp://guest:secret@h1/prod\", \"http://h2\"]",
            ),
            "test.toml: brokers.main.uris[1]: must start with amqp:// or amqps://",
        ),
    ]);
}

#[test]
fn tls_keys_need_an_amqps_uri_readable_files_and_a_certificate_with_its_key() {
    each_fails_with_its_exact_error(vec![
        (
            BASE.replace("%2f\"", "%2f\"\nca_file = \"ca.pem\""),
            "test.toml: brokers.main.ca_file: applies only to an amqps:// uri; use amqps:// or remove it",
        ),
        (
            BASE.replace("%2f\"", "%2f\"\nclient_key_file = \"client.key\""),
            "test.toml: brokers.main.client_key_file: applies only to an amqps:// uri; use amqps:// or remove it",
        ),
        (
            tls_broker("ca_file = \"missing-ca.pem\""),
            "test.toml: brokers.main.ca_file: cannot read \"missing-ca.pem\": No such file or directory (os error 2)",
        ),
        (
            tls_broker("client_cert_file = \"client.pem\""),
            "test.toml: brokers.main.client_key_file: missing: client_cert_file needs its private key; set both or neither",
        ),
        (
            tls_broker("client_key_file = \"client.key\""),
            "test.toml: brokers.main.client_cert_file: missing: client_key_file needs its certificate; set both or neither",
        ),
        (
            tls_broker("client_cert_file = \"none.pem\"\nclient_key_file = \"none.key\""),
            "test.toml: brokers.main.client_cert_file: cannot read \"none.pem\": No such file or directory (os error 2)",
        ),
    ]);
}

#[test]
fn the_inbound_queue_is_named_on_a_known_broker_with_limits_in_range() {
    each_fails_with_its_exact_error(vec![
        (
            BASE.replace("broker = \"main\"\nqueue", "broker = \"other\"\nqueue"),
            "test.toml: inbound.broker: unknown broker \"other\" (defined: main)",
        ),
        (
            BASE.replace("queue = \"work.in\"", "queue = \"\""),
            "test.toml: inbound.queue: must not be empty",
        ),
        (
            BASE.replace("queue = \"work.in\"", "queue = \"work.in\"\nprefetch = 0"),
            "test.toml: inbound.prefetch: must be between 1 and 65535",
        ),
        (
            BASE.replace(
                "queue = \"work.in\"",
                "queue = \"work.in\"\nprefetch = 70000",
            ),
            "test.toml: inbound.prefetch: must be between 1 and 65535",
        ),
        (
            BASE.replace(
                "queue = \"work.in\"",
                "queue = \"work.in\"\nqueue_type = \"stream\"",
            ),
            "test.toml: inbound.queue_type: unknown queue type \"stream\" (expected \"classic\" or \"quorum\")",
        ),
        (
            BASE.replace(
                "queue = \"work.in\"",
                "queue = \"work.in\"\nmax_redeliveries = 0",
            ),
            "test.toml: inbound.max_redeliveries: must be at least 1",
        ),
        (
            BASE.replace("queue = \"work.in\"", "queue = \"work.in\"\nmax_hops = 0"),
            "test.toml: inbound.max_hops: must be at least 1",
        ),
        (
            BASE.replace(
                "queue = \"work.in\"",
                "queue = \"work.in\"\ndead_letter_by_policy = true",
            )
            .replace("[dead_letter]", "[dead_letter]\nmode = \"republish\""),
            "test.toml: inbound.dead_letter_by_policy: applies only to dead_letter.mode = \"nack\"; remove it",
        ),
    ]);
}

#[test]
fn dead_letter_mode_and_queue_type_are_known_and_a_queue_type_needs_a_queue() {
    each_fails_with_its_exact_error(vec![
        (
            BASE.replace("[dead_letter]", "[dead_letter]\nmode = \"drop\""),
            "test.toml: dead_letter.mode: unknown mode \"drop\" (expected \"nack\" or \"republish\")",
        ),
        (
            BASE.replace(
                "queue = \"work.dlq\"",
                "queue = \"work.dlq\"\nqueue_type = \"Quorum\"",
            ),
            "test.toml: dead_letter.queue_type: unknown queue type \"Quorum\" (expected \"classic\" or \"quorum\")",
        ),
        (
            BASE.replace("queue = \"work.dlq\"", "queue_type = \"quorum\""),
            "test.toml: dead_letter.queue_type: applies only with dead_letter.queue; set dead_letter.queue or remove it",
        ),
    ]);
}

#[test]
fn an_endpoint_is_on_a_known_broker_names_its_destination_and_has_timers_above_zero() {
    each_fails_with_its_exact_error(vec![
        (
            BASE.replace(
                "broker = \"main\"\nrouting_key = \"service.backup\"",
                "broker = \"nope\"\nrouting_key = \"service.backup\"",
            ),
            "test.toml: endpoints.backup.broker: unknown broker \"nope\" (defined: main)",
        ),
        (
            BASE.replace(
                "routing_key = \"service.primary\"",
                "routing_key = \"service.primary\"\nconfirm_timeout_ms = 0",
            ),
            "test.toml: endpoints.primary.confirm_timeout_ms: must be greater than 0",
        ),
        (
            BASE.replace("routing_key = \"service.primary\"", ""),
            "test.toml: endpoints.primary.routing_key: must name the destination queue when exchange is the default exchange (\"\")",
        ),
        (
            BASE.replace(
                "routing_key = \"service.primary\"",
                "routing_key = \"service.primary\"\ndeclare_queue = \"service.primary\"\ndeclare_queue_type = \"lazy\"",
            ),
            "test.toml: endpoints.primary.declare_queue_type: unknown queue type \"lazy\" (expected \"classic\" or \"quorum\")",
        ),
        (
            BASE.replace(
                "routing_key = \"service.primary\"",
                "routing_key = \"service.primary\"\ndeclare_queue_type = \"quorum\"",
            ),
            "test.toml: endpoints.primary.declare_queue_type: applies only with declare_queue; set declare_queue or remove it",
        ),
        (
            BASE.replace(
                "routing_key = \"service.primary\"",
                "routing_key = \"service.primary\"\nprobe_interval_ms = 0",
            ),
            "test.toml: endpoints.primary.probe_interval_ms: must be greater than 0",
        ),
    ]);
}

#[test]
fn nothing_is_routed_back_into_the_inbound_queue() {
    each_fails_with_its_exact_error(vec![
        (
            BASE.replace(
                "routing_key = \"service.backup\"",
                "routing_key = \"work.in\"",
            ),
            "test.toml: endpoints.backup.routing_key: publishing to \"work.in\" through the default exchange of broker \"main\", the inbound's broker, would route every copy back into the inbound queue (a forwarding loop); name another queue",
        ),
        (
            with(
                "[brokers.alias]\nuri = \"amqp://other:pw@localhost/%2F\"\n[endpoints.again]\nbroker = \"alias\"\nrouting_key = \"work.in\"",
            ),
            "test.toml: endpoints.again.routing_key: publishing to \"work.in\" through the default exchange of broker \"alias\", which has the host, port and vhost of the inbound's broker \"main\", would route every copy back into the inbound queue (a forwarding loop); name another queue",
        ),
        (
            BASE.replace(
                "routing_key = \"service.backup\"",
                "exchange = \"amq.direct\"\nrouting_key = \"work\"\ndeclare_queue = \"work.in\"",
            ),
            "test.toml: endpoints.backup.declare_queue: \"work.in\" is the inbound queue on broker \"main\", the inbound's broker: this endpoint would route every copy back into the inbound queue (a forwarding loop); name another queue",
        ),
        (
            BASE.replace(
                "exchange = \"work.dlx\"\nrouting_key = \"work.dlq\"\nqueue = \"work.dlq\"",
                "exchange = \"\"\nrouting_key = \"work.in\"",
            ),
            "test.toml: dead_letter.routing_key: publishing dead letters to \"work.in\" through the default exchange would route every dead letter back into the inbound queue (a dead-letter loop); name the dead-letter queue",
        ),
        (
            BASE.replace("queue = \"work.dlq\"", "queue = \"work.in\""),
            "test.toml: dead_letter.queue: \"work.in\" is the inbound queue: binding it to dead_letter.exchange would route every dead letter back into the inbound queue (a dead-letter loop); name another queue",
        ),
    ]);
}

#[test]
fn backup_lists_and_branches_name_what_exists_once_with_known_strategy_and_outage() {
    each_fails_with_its_exact_error(vec![
        (
            BASE.replace("backups = [\"backup\"]", "backups = []"),
            "test.toml: backup_lists.backups: is empty; list at least one endpoint or remove it",
        ),
        (
            BASE.replace(
                "backups = [\"backup\"]",
                "backups = [\"backup\", \"missing\"]",
            ),
            "test.toml: backup_lists.backups[1]: unknown endpoint \"missing\" (defined: backup, primary)",
        ),
        (
            BASE.replace("backups = [\"backup\"]", "backups = [\"primary\"]"),
            "test.toml: filter_table[0].backup_list: endpoint \"primary\" appears twice in this branch's list",
        ),
        (
            BASE.replace("filter = \"all\"", "filter = \"some\""),
            "test.toml: filter_table[0].filter: unknown filter \"some\" (defined: all)",
        ),
        (
            BASE.replace("endpoint = \"primary\"", "endpoint = \"primry\""),
            "test.toml: filter_table[0].endpoint: unknown endpoint \"primry\" (defined: backup, primary)",
        ),
        (
            BASE.replace("backup_list = \"backups\"", "backup_list = \"backupz\""),
            "test.toml: filter_table[0].backup_list: unknown backup list \"backupz\" (defined: backups)",
        ),
        (
            BASE.replace(
                "backup_list = \"backups\"",
                "backup_list = \"backups\"\nstrategy = \"random\"",
            ),
            "test.toml: filter_table[0].strategy: unknown strategy \"random\" (expected \"failover\" or \"round_robin\")",
        ),
        (
            with("[[filter_table]]\nname = \"service\"\nfilter = \"all\"\nendpoint = \"backup\""),
            "test.toml: filter_table[1].name: branch name \"service\" is used twice; names must be unique",
        ),
        (
            BASE.split("[[filter_table]]")
                .next()
                .unwrap_or_default()
                .to_owned(),
            "test.toml: filter_table: has no entries; add at least one [[filter_table]]",
        ),
        (
            BASE.replace(
                "backup_list = \"backups\"",
                "backup_list = \"backups\"\noutage = \"hold\"",
            ),
            "test.toml: filter_table[0].outage: unknown outage \"hold\" (expected \"dead_letter\" or \"wait\")",
        ),
        (
            BASE.replace(
                "backup_list = \"backups\"",
                "backup_list = \"backups\"\noutage_timeout_ms = 5000",
            ),
            "test.toml: filter_table[0].outage_timeout_ms: applies only with outage = \"dead_letter\" (\"wait\" holds for as long as the outage lasts)",
        ),
        (
            BASE.replace(
                "backup_list = \"backups\"",
                "backup_list = \"backups\"\noutage = \"dead_letter\"\noutage_timeout_ms = 0",
            ),
            "test.toml: filter_table[0].outage_timeout_ms: must be at least 1; omit it to dead-letter at once",
        ),
    ]);
}

#[test]
fn a_filter_has_a_known_type_its_own_keys_one_test_and_no_cycle() {
    each_fails_with_its_exact_error(vec![
        (
            with("[filters.bad]\ntype = \"fuzzy\""),
            "test.toml: filters.bad.type: unknown filter type \"fuzzy\" (expected match_all, header, property, routing_key, json, xpath, and, or, not)",
        ),
        (
            with("[filters.h]\ntype = \"header\"\nheader = \"tenant\""),
            "test.toml: filters.h: needs one of equals, exists, regex, in",
        ),
        (
            with(
                "[filters.h]\ntype = \"header\"\nheader = \"tenant\"\nequals = \"a\"\nregex = \"b\"",
            ),
            "test.toml: filters.h: takes only one of equals, exists, regex, in, not several",
        ),
        (
            with("[filters.h]\ntype = \"header\"\nequals = \"a\""),
            "test.toml: filters.h.header: is required",
        ),
        (
            with("[filters.h]\ntype = \"header\"\nheader = \"x\"\nregex = \"(unclosed\""),
            "test.toml: filters.h.regex: invalid regular expression: error: unclosed group",
        ),
        (
            with("[filters.h]\ntype = \"header\"\nheader = \"x\"\nexists = false"),
            "test.toml: filters.h.exists: only `exists = true` is supported; wrap the filter in a \"not\" filter",
        ),
        (
            with("[filters.p]\ntype = \"property\"\nproperty = \"colour\"\nequals = \"red\""),
            "test.toml: filters.p.property: unknown property \"colour\" (expected one of content_type, content_encoding, type, app_id, correlation_id, reply_to, user_id, message_id, priority, expiration)",
        ),
        (
            with("[filters.p]\ntype = \"property\"\nproperty = \"app_id\"\nexists = true"),
            "test.toml: filters.p.exists: does not apply to a \"property\" filter (valid keys: type, property, equals, regex, in)",
        ),
        (
            with("[filters.r]\ntype = \"routing_key\"\nheader = \"x\"\npattern = \"a.*\""),
            "test.toml: filters.r.header: does not apply to a \"routing_key\" filter (valid keys: type, pattern)",
        ),
        (
            with("[filters.a]\ntype = \"and\"\nfilters = [\"all\", \"ghost\"]"),
            "test.toml: filters.a.filters: unknown filter \"ghost\" (defined: a, all)",
        ),
        (
            with("[filters.a]\ntype = \"or\"\nfilters = []"),
            "test.toml: filters.a.filters: must name at least one filter",
        ),
        (
            with(
                "[filters.a]\ntype = \"not\"\nfilter = \"b\"\n[filters.b]\ntype = \"and\"\nfilters = [\"a\"]",
            ),
            "test.toml: filters.a: filters refer to each other in a cycle: a -> b -> a",
        ),
    ]);
}

#[test]
fn a_json_filter_needs_an_rfc_6901_pointer_and_one_test() {
    each_fails_with_its_exact_error(vec![
        (
            with("[filters.j]\ntype = \"json\"\nequals = 1"),
            "test.toml: filters.j.pointer: is required",
        ),
        (
            with("[filters.j]\ntype = \"json\"\npointer = \"a/b\"\nequals = 1"),
            "test.toml: filters.j.pointer: must be \"\" (the whole document) or start with \"/\" (RFC 6901)",
        ),
        (
            with("[filters.j]\ntype = \"json\"\npointer = \"/a~2\"\nequals = 1"),
            "test.toml: filters.j.pointer: has a \"~\" not followed by 0 or 1; write \"~\" as ~0 and \"/\" as ~1 (RFC 6901)",
        ),
        (
            with("[filters.j]\ntype = \"json\"\npointer = \"/a\""),
            "test.toml: filters.j: needs one of equals, exists, regex, in",
        ),
        (
            with("[filters.j]\ntype = \"json\"\npointer = \"/a\"\nequals = 1\nexists = true"),
            "test.toml: filters.j: takes only one of equals, exists, regex, in, not several",
        ),
        (
            with("[filters.j]\ntype = \"json\"\npointer = \"/a\"\nregex = \"(\""),
            "test.toml: filters.j.regex: invalid regular expression: error: unclosed group",
        ),
        (
            with("[filters.j]\ntype = \"json\"\npointer = \"/a\"\nheader = \"h\"\nexists = true"),
            "test.toml: filters.j.header: does not apply to a \"json\" filter (valid keys: type, pointer, equals, exists, regex, in)",
        ),
    ]);
}

#[test]
fn an_xpath_filter_needs_a_parsing_expression_with_its_prefixes_declared() {
    each_fails_with_its_exact_error(vec![
        (
            with("[filters.x]\ntype = \"xpath\""),
            "test.toml: filters.x.expression: is required",
        ),
        (
            with("[filters.x]\ntype = \"xpath\"\nexpression = \"/a[\""),
            "test.toml: filters.x.expression: invalid XPath 1.0 expression: does not parse (EmptyPredicate)",
        ),
        (
            with("[filters.x]\ntype = \"xpath\"\nexpression = \"\""),
            "test.toml: filters.x.expression: invalid XPath 1.0 expression: is empty",
        ),
        (
            with("[filters.x]\ntype = \"xpath\"\nexpression = \"/o:order\""),
            "test.toml: filters.x.expression: invalid XPath 1.0 expression: uses the prefix \"o\", which namespaces does not declare",
        ),
        (
            with("[filters.x]\ntype = \"xpath\"\nexpression = \"nosuch(1)\""),
            "test.toml: filters.x.expression: invalid XPath 1.0 expression: calls \"nosuch()\", which is not an XPath 1.0 function available here",
        ),
        (
            with(
                "[filters.x]\ntype = \"xpath\"\nexpression = \"/o:a\"\nnamespaces = { \"o:x\" = \"urn:o\" }",
            ),
            "test.toml: filters.x.namespaces.o:x: is not a namespace prefix (a name without \":\", starting with a letter or \"_\")",
        ),
        (
            with("[filters.x]\ntype = \"xpath\"\nexpression = \"/o:a\"\nnamespaces = { o = \"\" }"),
            "test.toml: filters.x.namespaces.o: must be a namespace URI, not empty",
        ),
        (
            with("[filters.x]\ntype = \"xpath\"\nexpression = \"/a\"\npointer = \"/a\""),
            "test.toml: filters.x.pointer: does not apply to a \"xpath\" filter (valid keys: type, expression, namespaces)",
        ),
    ]);
}

#[test]
fn sessions_leave_room_in_the_prefetch_time_out_and_use_two_headers() {
    each_fails_with_its_exact_error(vec![
        (
            with("[sessions]\nenabled = true\nmax_open = 20"),
            "test.toml: sessions.max_open: max_open (20) x max_messages (50) = 1000 must stay below \
             inbound.prefetch (1000), or open sessions could hold every prefetch slot and wait \
             forever for messages that cannot arrive; lower them or raise the prefetch",
        ),
        (
            with("[sessions]\nenabled = true\nidle_timeout_ms = 0"),
            "test.toml: sessions.idle_timeout_ms: must be at least 1",
        ),
        (
            with("[control]\nmax_bytes = 1048575"),
            "test.toml: control.max_bytes: must be at least 1048576 (1 MiB), so that retention \
             never trims the newest snapshot of the group's state",
        ),
        (
            with("[control]\nheartbeat_ms = 99"),
            "test.toml: control.heartbeat_ms: must be 100 to 300000 (5 minutes)",
        ),
        (
            with("[control]\nheartbeat_ms = 300001"),
            "test.toml: control.heartbeat_ms: must be 100 to 300000 (5 minutes)",
        ),
        (
            with("[sessions]\nenabled = true\nend_header = \"session-id\""),
            "test.toml: sessions.end_header: is the same header as sessions.id_header; use two headers",
        ),
    ]);
}

#[test]
fn the_admin_address_is_host_and_port() {
    each_fails_with_its_exact_error(vec![(
        with("[admin]\nlisten = \"localhost\""),
        "test.toml: admin.listen: \"localhost\" is not a host:port address (or a port, for loopback)",
    )]);
}

/// [`BASE`] with an `amqps://` broker and `keys` in its table.
fn tls_broker(keys: &str) -> String {
    BASE.replace(
        "uri = \"amqp://guest:secret@127.0.0.1:5672/%2f\"",
        &format!("uri = \"amqps://guest:secret@localhost:5671/%2f\"\n{keys}"),
    )
}

/// A directory with `ca.pem`, a client certificate `client.pem` signed by
/// it with its key `client.key`, another key `other.key`, `junk.pem` (no
/// PEM at all) and `not-x509.pem` (a PEM certificate that does not parse).
fn tls_files() -> std::path::PathBuf {
    use rcgen::{CertificateParams, IsCa, Issuer, KeyPair};
    let dir = std::env::temp_dir().join(format!("sy-config-tls-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let client_key = KeyPair::generate().unwrap();
    let client = CertificateParams::new(vec!["switchyard".to_owned()])
        .unwrap()
        .signed_by(&client_key, &issuer)
        .unwrap();
    let other_key = KeyPair::generate().unwrap();
    for (name, text) in [
        ("ca.pem", ca.pem()),
        ("client.pem", client.pem()),
        ("client.key", client_key.serialize_pem()),
        ("other.key", other_key.serialize_pem()),
        ("junk.pem", "not a certificate\n".to_owned()),
        (
            "not-x509.pem",
            "-----BEGIN CERTIFICATE-----\nAAECAwQF\n-----END CERTIFICATE-----\n".to_owned(),
        ),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
    }
    dir
}

#[test]
fn tls_files_are_read_relative_to_the_configuration_file() {
    let dir = tls_files();
    let origin = dir.join("switchyard.toml");
    let origin = origin.to_str().unwrap();
    let toml = tls_broker(
        "ca_file = \"ca.pem\"\nclient_cert_file = \"client.pem\"\nclient_key_file = \"client.key\"",
    );
    let settings = load_str(&toml, origin).unwrap_or_else(|e| panic!("{e}"));
    let tls = &settings.brokers["main"].tls;
    let ca = std::fs::read_to_string(dir.join("ca.pem")).unwrap();
    assert_eq!(tls.ca_pem.as_deref(), Some(ca.as_str()));
    let client = tls.client.as_ref().expect("a client identity");
    assert_eq!(
        client.cert_pem,
        std::fs::read(dir.join("client.pem")).unwrap()
    );
    assert_eq!(
        client.secret_key_pem(),
        std::fs::read(dir.join("client.key")).unwrap()
    );
    let debug = format!("{:?}", settings.brokers["main"]);
    assert!(!debug.contains("PRIVATE KEY"), "{debug}");

    let plain = load_str(&tls_broker(""), origin).unwrap_or_else(|e| panic!("{e}"));
    let tls = &plain.brokers["main"].tls;
    assert!(tls.ca_pem.is_none() && tls.client.is_none());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_tls_files_fail_naming_the_key_and_the_file() {
    let dir = tls_files();
    let origin = dir.join("switchyard.toml");
    let origin = origin.to_str().unwrap();
    let d = dir.display();
    let cases = [
        (
            "ca_file = \"junk.pem\"".to_owned(),
            format!(
                "brokers.main.ca_file: \"{d}/junk.pem\" holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
            ),
        ),
        (
            "ca_file = \"not-x509.pem\"".to_owned(),
            format!(
                "brokers.main.ca_file: \"{d}/not-x509.pem\": 1 of its 1 PEM certificate(s) cannot be parsed as X.509"
            ),
        ),
        (
            "ca_file = \"client.key\"".to_owned(),
            format!(
                "brokers.main.ca_file: \"{d}/client.key\" holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
            ),
        ),
        (
            "client_cert_file = \"client.pem\"\nclient_key_file = \"other.key\"".to_owned(),
            format!(
                "brokers.main.client_key_file: \"{d}/other.key\" is not the private key of the certificate in \"{d}/client.pem\""
            ),
        ),
        (
            "client_cert_file = \"client.pem\"\nclient_key_file = \"client.pem\"".to_owned(),
            format!(
                "brokers.main.client_key_file: \"{d}/client.pem\" holds no PEM private key (-----BEGIN PRIVATE KEY-----)"
            ),
        ),
        (
            "client_cert_file = \"client.key\"\nclient_key_file = \"client.key\"".to_owned(),
            format!(
                "brokers.main.client_cert_file: \"{d}/client.key\" holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
            ),
        ),
        (
            format!("ca_file = \"{d}/absent.pem\""),
            format!(
                "brokers.main.ca_file: cannot read \"{d}/absent.pem\": No such file or directory (os error 2)"
            ),
        ),
    ];
    for (keys, expected) in cases {
        match load_str(&tls_broker(&keys), origin) {
            Ok(_) => panic!("expected an error for {keys}"),
            Err(e) => assert_eq!(e.to_string(), format!("{origin}: {expected}")),
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_admin_address_is_loopback_unless_a_host_is_given() {
    let cases = [
        (None, None),
        (Some("9090"), Some("127.0.0.1:9090")),
        (Some(":9091"), Some("127.0.0.1:9091")),
        (Some("0.0.0.0:9090"), Some("0.0.0.0:9090")),
        (Some("[::1]:9090"), Some("[::1]:9090")),
    ];
    for (listen, expected) in cases {
        let toml = match listen {
            Some(l) => with(&format!("[admin]\nlisten = \"{l}\"\ntokens = [\"t\"]")),
            None => BASE.to_owned(),
        };
        let settings = load_str(&toml, "test.toml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            settings.admin_listen.map(|a| a.to_string()).as_deref(),
            expected,
            "{listen:?}"
        );
    }
}

#[test]
fn an_admin_endpoint_other_hosts_reach_takes_commands_only_with_tokens() {
    let open = with("[admin]\nlisten = \"0.0.0.0:9090\"");
    let refused = load_str(&open, "test.toml").err().map(|e| e.to_string());
    let refused = refused.unwrap_or_default();
    assert!(
        refused.starts_with("test.toml: admin.tokens: admin.listen 0.0.0.0:9090 is reachable"),
        "{refused}"
    );
    // Health and metrics alone, with control off; or loopback; or tokens.
    for fine in [
        "[admin]\nlisten = \"0.0.0.0:9090\"\n[control]\nenabled = false",
        "[admin]\nlisten = \"127.0.0.1:9090\"",
        "[admin]\nlisten = \"0.0.0.0:9090\"\ntokens = \"a,b\"",
    ] {
        let settings = load_str(&with(fine), "test.toml").unwrap_or_else(|e| panic!("{fine}: {e}"));
        assert!(settings.admin_listen.is_some());
    }
    let control = load_str(
        &with("[admin]\nlisten = \"0.0.0.0:9090\"\ntokens = \"a,b\""),
        "t",
    )
    .unwrap_or_else(|e| panic!("{e}"))
    .control
    .unwrap_or_else(|| panic!("control is on by default"));
    assert_eq!(control.tokens, ["a", "b"]);
    assert_eq!(control.stream, "switchyard.control");
    assert_eq!(control.max_registrations, 256);
    let off = load_str(&with("[control]\nenabled = false"), "t").unwrap_or_else(|e| panic!("{e}"));
    assert!(off.control.is_none());
    let empty = with("[admin]\ntokens = [\"a\", \" \"]");
    let refused = load_str(&empty, "t")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(refused.contains("admin.tokens[1]: is empty"), "{refused}");
}

#[test]
fn only_a_registrable_entry_may_leave_its_endpoint_out() {
    let base = BASE.replace("endpoint = ", "# endpoint = ");
    let refused = load_str(&base, "t")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        refused.contains("filter_table[0].endpoint: is missing") && refused.contains("registrable"),
        "{refused}"
    );
    let registrable = base.replacen(
        "[[filter_table]]",
        "[[filter_table]]\nregistrable = true",
        1,
    );
    let settings = load_str(&registrable, "t").unwrap_or_else(|e| panic!("{e}"));
    // Its backup list stays its list; services' endpoints join after it.
    assert!(
        settings
            .routing
            .summary()
            .contains("backup [failover, registrable]"),
        "{}",
        settings.routing.summary()
    );
    let alone = base.replace("backup_list = \"backups\"", "registrable = true");
    let settings = load_str(&alone, "t").unwrap_or_else(|e| panic!("{e}"));
    assert!(
        settings
            .routing
            .summary()
            .contains("(registered endpoints)"),
        "{}",
        settings.routing.summary()
    );
}

#[test]
fn routing_into_the_inbound_queue_elsewhere_is_no_loop() {
    let cases = [
        // Another vhost, port or host of the same server.
        "[brokers.other]\nuri = \"amqp://guest:guest@127.0.0.1:5672/other\"",
        "[brokers.other]\nuri = \"amqp://guest:guest@127.0.0.1:5673/%2f\"",
        "[brokers.other]\nuri = \"amqp://guest:guest@rabbit.example/%2f\"",
    ];
    for broker in cases {
        let toml = with(&format!(
            "{broker}\n[endpoints.remote]\nbroker = \"other\"\nrouting_key = \"work.in\"\ndeclare_queue = \"work.in\""
        ));
        if let Err(e) = load_str(&toml, "test.toml") {
            panic!("{broker}: {e}");
        }
    }
    // A named exchange with the inbound queue's name as routing key is not
    // the default exchange: nothing says where it routes.
    let via_exchange = BASE.replace(
        "routing_key = \"service.backup\"",
        "exchange = \"fanout.out\"\nrouting_key = \"work.in\"",
    );
    if let Err(e) = load_str(&via_exchange, "test.toml") {
        panic!("{e}");
    }
}

#[test]
fn parse_errors_name_the_file_and_key() {
    let unknown_key = error_of(&BASE.replace("[inbound]", "[inbound]\nprefetchh = 5"));
    assert!(unknown_key.starts_with("test.toml: "), "{unknown_key}");
    assert!(unknown_key.contains("prefetchh"), "{unknown_key}");

    let wrong_type = error_of(&BASE.replace(
        "queue = \"work.in\"",
        "queue = \"work.in\"\nprefetch = \"many\"",
    ));
    assert!(wrong_type.contains("prefetch"), "{wrong_type}");

    let missing = error_of(&BASE.replace("queue = \"work.in\"\n", ""));
    assert!(missing.contains("queue"), "{missing}");

    let not_toml = error_of("[inbound\nbroker = ");
    assert!(not_toml.starts_with("test.toml: "), "{not_toml}");
}

const INBOUND_KEYS: &str = "broker, queue, prefetch, declare, single_active_consumer, \
                            queue_type, max_redeliveries, max_hops, dead_letter_by_policy, \
                            trusted_users";

const TOP_LEVEL_KEYS: &str = "name, shutdown_timeout_ms, worker_threads, inbound, dead_letter, \
                              brokers, endpoints, backup_lists, filters, filter_table, sessions, \
                              admin, ingress, journal, telemetry, control";

#[test]
fn an_unknown_key_is_named_by_its_path_with_the_nearest_valid_key() {
    let cases = [
        (
            BASE.replace("[inbound]", "[inbound]\nprefetchh = 5"),
            format!(
                "test.toml: inbound.prefetchh: unknown key; did you mean `prefetch`? \
                 (valid keys: {INBOUND_KEYS})"
            ),
        ),
        (
            BASE.replace(
                "routing_key = \"service.primary\"",
                "routingkey = \"service.primary\"",
            ),
            "test.toml: endpoints.primary.routingkey: unknown key; did you mean `routing_key`? \
             (valid keys: broker, exchange, routing_key, declare_queue, declare_queue_type, \
             confirm_timeout_ms, retries, headers, probe_interval_ms)"
                .to_owned(),
        ),
        (
            BASE.replace("routing_key = \"work.dlq\"", "Routing-Key = \"work.dlq\""),
            "test.toml: dead_letter.Routing-Key: unknown key; did you mean `routing_key`? \
             (valid keys: mode, exchange, routing_key, queue, queue_type)"
                .to_owned(),
        ),
        (
            BASE.replace("name = \"service\"", "nmae = \"service\""),
            "test.toml: filter_table[0].nmae: unknown key; did you mean `name`? (valid keys: \
             name, filter, endpoint, backup_list, priority, strategy, required, outage, \
             outage_timeout_ms, registrable)"
                .to_owned(),
        ),
        (
            with("[filters.j]\ntype = \"json\"\npointr = \"/a\"\nexists = true"),
            "test.toml: filters.j.pointr: does not apply to a \"json\" filter; did you mean \
             `pointer`? (valid keys: type, pointer, equals, exists, regex, in)"
                .to_owned(),
        ),
        (
            with("[filters.m]\ntype = \"match_all\"\nheader = \"x\""),
            "test.toml: filters.m.header: does not apply to a \"match_all\" filter (valid \
             keys: type)"
                .to_owned(),
        ),
        (
            format!("shutdown_timeout = 5\n{BASE}"),
            format!(
                "test.toml: shutdown_timeout: unknown key; did you mean `shutdown_timeout_ms`? \
                 (valid keys: {TOP_LEVEL_KEYS})"
            ),
        ),
        (
            with("[ingress.htp]\nlisten = \"8080\""),
            "test.toml: ingress.htp: unknown key; did you mean `http`? (valid keys: http)"
                .to_owned(),
        ),
        (
            format!("colour = \"blue\"\n{BASE}"),
            format!("test.toml: colour: unknown key (valid keys: {TOP_LEVEL_KEYS})"),
        ),
        (
            BASE.replace("[inbound]", "[inbound]\nmax_retries = 5"),
            format!("test.toml: inbound.max_retries: unknown key (valid keys: {INBOUND_KEYS})"),
        ),
    ];
    for (toml, expected) in cases {
        assert_eq!(error_of(&toml), expected);
    }
}

#[test]
fn an_unknown_key_from_the_environment_names_the_variable_and_the_nearest_key() {
    let cases = [
        (
            "SWITCHYARD__INBOUND__PREFECH",
            format!(
                "environment variable SWITCHYARD__INBOUND__PREFECH: inbound.prefech: unknown \
                 key; did you mean `prefetch`? (valid keys: {INBOUND_KEYS})"
            ),
        ),
        (
            "SWITCHYARD__COLOUR",
            format!(
                "environment variable SWITCHYARD__COLOUR: colour: unknown key (valid keys: \
                 {TOP_LEVEL_KEYS})"
            ),
        ),
        (
            "SWITCHYARD__FILTERS__ALL__HEADR",
            "environment variable SWITCHYARD__FILTERS__ALL__HEADR: filters.all.headr: does not \
             apply to a \"match_all\" filter (valid keys: type)"
                .to_owned(),
        ),
    ];
    for (var, expected) in cases {
        match load_str_with_env(BASE, "test.toml", &[(var, "5")]) {
            Ok(_) => panic!("{var} should not fit"),
            Err(e) => assert_eq!(e.to_string(), expected),
        }
    }
}

#[test]
fn errors_never_contain_credentials() {
    let err = error_of(&BASE.replace("127.0.0.1:5672", "127.0.0.1:notaport"));
    assert!(err.starts_with("test.toml: brokers.main.uri: "), "{err}");
    assert!(!err.contains("secret"), "{err}");
}

/// BASE without its `[inbound]` and `[dead_letter]` tables.
fn without_queue() -> String {
    let start = BASE.find("[brokers.main]").unwrap_or_default();
    BASE[start..].to_owned()
}

#[test]
fn the_http_ingress_alone_needs_no_inbound_queue_but_something_must_feed_the_forwarder() {
    let http = "[ingress.http]\nlisten = \"8080\"\n";
    let alone = load_str(&format!("{}\n{http}", without_queue()), "test.toml")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(alone.inbound().is_none() && alone.dead_letter().is_none() && alone.queue().is_none());
    let ingress = alone.http.as_ref().unwrap_or_else(|| panic!("no ingress"));
    assert_eq!(ingress.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(
        ingress.max_in_flight, 1000,
        "the default prefetch without an inbound queue"
    );
    assert_eq!(ingress.max_body_bytes, 1024 * 1024);

    assert_eq!(
        error_of(&without_queue()),
        "test.toml: inbound: missing; add an [inbound] queue to consume, an [ingress.http] \
         listener, or both"
    );
    let dead_letter_alone = format!(
        "[dead_letter]\nexchange = \"x\"\nrouting_key = \"y\"\n{}\n{http}",
        without_queue()
    );
    assert_eq!(
        error_of(&dead_letter_alone),
        "test.toml: dead_letter: applies only with [inbound]; remove it, or add the [inbound] \
         queue to consume"
    );
    let inbound_alone = format!(
        "[inbound]\nbroker = \"main\"\nqueue = \"q\"\n{}",
        without_queue()
    );
    assert!(
        error_of(&inbound_alone).starts_with("test.toml: dead_letter: missing"),
        "{}",
        error_of(&inbound_alone)
    );
}

#[test]
fn the_http_ingress_settings_are_checked() {
    let cases = [
        (
            "listen = \"0.0.0.0:8080\"",
            "ingress.http.listen: 0.0.0.0:8080 is reachable from other hosts but no tokens are \
             set",
        ),
        (
            "listen = \"nowhere\"",
            "ingress.http.listen: \"nowhere\" is not a host:port",
        ),
        (
            "listen = \"8080\"\ntokens = [\"\"]",
            "ingress.http.tokens[0]: is empty",
        ),
        // The forms an environment variable gives: one string, commas.
        (
            "listen = \"8080\"\ntokens = \"\"",
            "ingress.http.tokens[0]: is empty",
        ),
        (
            "listen = \"8080\"\ntokens = \",\"",
            "ingress.http.tokens[0]: is empty",
        ),
        (
            "listen = \"8080\"\ntokens = \" \"",
            "ingress.http.tokens[0]: is empty",
        ),
        (
            "listen = \"8080\"\ntokens = \"a,,b\"",
            "ingress.http.tokens[1]: is empty",
        ),
        (
            "listen = \"8080\"\nforward_headers = [\"Authorization\"]",
            "ingress.http.forward_headers[0]: \"Authorization\" is never forwarded: a credential",
        ),
        (
            "listen = \"8080\"\nforward_headers = [\"x-a\", \"Proxy-Authorization\"]",
            "ingress.http.forward_headers[1]: \"Proxy-Authorization\" is never forwarded: a \
             credential",
        ),
        (
            "listen = \"8080\"\nforward_headers = \"Cookie\"",
            "ingress.http.forward_headers[0]: \"Cookie\" is never forwarded: a credential",
        ),
        (
            "listen = \"8080\"\nbody_timeout_ms = 0",
            "ingress.http.body_timeout_ms: must be at least 1",
        ),
        (
            "listen = \"8080\"\nforward_headers = [\"x-switchyard-only\"]",
            "ingress.http.forward_headers[0]: \"x-switchyard-only\" is never forwarded",
        ),
        (
            "listen = \"8080\"\nmax_in_flight = 0",
            "ingress.http.max_in_flight: must be at least 1",
        ),
        (
            "listen = \"8080\"\ncert_file = \"c.pem\"",
            "ingress.http.key_file: missing: cert_file needs its key",
        ),
        (
            "listen = \"8080\"\nbogus = 1",
            "test.toml: ingress.http.bogus: unknown key (valid keys: listen, max_body_bytes, \
             max_in_flight, request_timeout_ms, body_timeout_ms, tokens, allow_anonymous, \
             forward_headers, idempotency_ttl_ms, idempotency_max_keys, max_connections, \
             header_timeout_ms, cert_file, key_file)",
        ),
    ];
    for (keys, expected) in cases {
        let error = error_of(&with(&format!("[ingress.http]\n{keys}\n")));
        assert!(error.contains(expected), "{keys}: {error}");
    }
    let ok = with("[ingress.http]\nlisten = \"0.0.0.0:8080\"\ntokens = \"a, b\"\n");
    let settings = load_str(&ok, "test.toml").unwrap_or_else(|e| panic!("{e}"));
    let ingress = settings
        .http
        .as_ref()
        .unwrap_or_else(|| panic!("no ingress"));
    assert_eq!(
        ingress.tokens,
        ["a", "b"],
        "a comma-separated string, as from the environment"
    );
    assert!(
        !format!("{ingress:?}").contains("\"a\""),
        "tokens are never shown"
    );
}

#[test]
fn a_bad_journal_or_otlp_setting_is_named_by_its_key() {
    let cases = [
        (
            "[journal]\nbroker = \"elsewhere\"",
            "journal.broker: unknown broker \"elsewhere\"",
        ),
        (
            "[journal]\nmax_age = \"7 days\"",
            "journal.max_age: \"7 days\" is not a RabbitMQ age",
        ),
        (
            "[journal]\non_unavailable = \"wait\"",
            "journal.on_unavailable: \"wait\" is not one of",
        ),
        (
            "[journal]\nbuffer = 0",
            "journal.buffer: must be at least 1",
        ),
        (
            "[journal]\nstream = \"\"",
            "journal.stream: must be a queue name",
        ),
        (
            "[telemetry.otlp]\nendpoint = \"localhost:4318\"",
            "telemetry.otlp.endpoint: \"localhost:4318\" is not an http",
        ),
        (
            "[telemetry.otlp]\nendpoint = \"http://jaeger:otlp\"",
            "telemetry.otlp.endpoint:",
        ),
        (
            "[telemetry.otlp]\nendpoint = \"http://u:p@jaeger:4318\"",
            "telemetry.otlp.endpoint:",
        ),
        (
            "[telemetry.otlp]\nendpoint = \"http://jaeger:4318\"\nsample_ratio = 1.5",
            "telemetry.otlp.sample_ratio: 1.5 is not between",
        ),
    ];
    for (table, expected) in cases {
        let error = error_of(&format!("{BASE}\n{table}\n"));
        assert!(error.contains(expected), "{table}: {error}");
    }
    let settings = load_str(
        &format!("{BASE}\n[journal]\nenabled = false\n"),
        "test.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(settings.journal.is_none(), "a disabled journal is off");
}
