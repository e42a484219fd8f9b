//! The broker a measurement runs against: the shared one the tests use, or
//! a private node of the benchmark's own. Either way: its URL, its
//! `rabbitmqctl`, its Erlang VM's OS pid (for `/proc`), and Shovel.

use crate::support::{
    PrivateNode, TestBroker, amqp_url, amqp_vhost, broker_os_pid, procfs, rabbitmqctl,
    try_rabbitmqctl,
};

/// The plugin the Shovel rows need.
pub const SHOVEL_PLUGIN: &str = "rabbitmq_shovel";

/// Where the rows run.
#[derive(Debug, Clone)]
pub struct Target {
    /// The AMQP URL of the benchmark's client and of the forwarder.
    pub url: String,
    /// The vhost of `url`, for `rabbitmqctl -p`.
    pub vhost: String,
    /// `rabbitmqctl -n` for a private node; `None` for the shared broker.
    node: Option<String>,
    /// The Erlang VM's OS pid, when known: the broker side of the CPU figures.
    pub pid: Option<u32>,
}

impl Target {
    /// The shared broker (`SWITCHYARD_TEST_AMQP_URL`, as for the tests).
    pub async fn shared() -> Self {
        Self {
            url: amqp_url(),
            vhost: amqp_vhost(),
            node: None,
            pid: broker_os_pid().await,
        }
    }

    /// A private node started by the benchmark.
    pub fn private(node: &PrivateNode) -> Self {
        Self {
            url: node.amqp_url(),
            vhost: "/".to_owned(),
            node: Some(node.node_name().to_owned()),
            pid: node.os_pid(),
        }
    }

    fn args<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut full = Vec::with_capacity(args.len() + 2);
        if let Some(node) = &self.node {
            full.extend(["-n", node.as_str()]);
        }
        full.extend_from_slice(args);
        full
    }

    /// `rabbitmqctl` on this broker; panics on failure.
    pub async fn ctl(&self, args: &[&str]) -> String {
        rabbitmqctl(&self.args(args)).await
    }

    /// `rabbitmqctl` on this broker, its failure returned.
    pub async fn try_ctl(&self, args: &[&str]) -> Result<String, String> {
        try_rabbitmqctl(&self.args(args)).await
    }

    /// A test client on this broker, its connection named `name`.
    pub async fn connect(&self, name: &str) -> TestBroker {
        TestBroker::connect_to(&self.url, name).await
    }

    /// "RabbitMQ 3.x.y on Erlang/OTP n", asked from the node itself.
    pub async fn describe(&self) -> String {
        let eval = |expr: &'static str| async move {
            self.try_ctl(&["eval", expr])
                .await
                .map(|v| v.trim().trim_matches('"').to_owned())
                .unwrap_or_else(|_| "?".to_owned())
        };
        let version = eval("{ok, V} = application:get_key(rabbit, vsn), V.").await;
        let otp = eval("erlang:system_info(otp_release).").await;
        let schedulers = eval("erlang:system_info(schedulers_online).").await;
        let pid = self.pid.map_or("unknown".to_owned(), |p| p.to_string());
        format!(
            "RabbitMQ {version} on Erlang/OTP {otp}, {schedulers} scheduler(s) online, OS pid {pid}"
        )
    }

    /// Makes sure Shovel is enabled on the shared broker; says what it did.
    /// (A private node is started with it.)
    pub async fn ensure_shovel(&self) -> String {
        let out = tokio::task::spawn_blocking(|| {
            std::process::Command::new("rabbitmq-plugins")
                .args(["list", "--enabled", "--minimal"])
                .output()
        })
        .await
        .expect("plugin listing task panicked")
        .unwrap_or_else(|e| panic!("cannot run rabbitmq-plugins: {e}"));
        let listing = String::from_utf8_lossy(&out.stdout);
        if listing.lines().any(|l| l.trim() == SHOVEL_PLUGIN) {
            return format!("{SHOVEL_PLUGIN} already enabled");
        }
        let status = tokio::task::spawn_blocking(|| {
            std::process::Command::new("rabbitmq-plugins")
                .args(["enable", SHOVEL_PLUGIN])
                .output()
        })
        .await
        .expect("plugin task panicked")
        .unwrap_or_else(|e| panic!("cannot run rabbitmq-plugins: {e}"));
        assert!(
            status.status.success(),
            "rabbitmq-plugins enable {SHOVEL_PLUGIN}: {}",
            String::from_utf8_lossy(&status.stderr)
        );
        format!("{SHOVEL_PLUGIN} was not enabled: enabled it (it stays enabled)")
    }

    /// Creates dynamic shovels `(name, definition)` in one `rabbitmqctl`
    /// call, so that several start together; returns when the call does.
    pub async fn create_shovels(&self, shovels: &[(String, serde_json::Value)]) {
        if let [(name, definition)] = shovels {
            let value = definition.to_string();
            let args = ["set_parameter", "-p", &self.vhost, "shovel", name, &value];
            self.ctl(&args).await;
            return;
        }
        let parameters: Vec<serde_json::Value> = shovels
            .iter()
            .map(|(name, value)| {
                serde_json::json!({
                    "vhost": self.vhost, "component": "shovel", "name": name, "value": value
                })
            })
            .collect();
        let path = std::env::temp_dir().join(format!("{}-shovels.json", shovels[0].0));
        let definitions = serde_json::json!({ "parameters": parameters }).to_string();
        std::fs::write(&path, definitions)
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        let file = path.display().to_string();
        let result = self.try_ctl(&["import_definitions", &file]).await;
        let _ = std::fs::remove_file(&path);
        if let Err(e) = result {
            panic!("rabbitmqctl import_definitions (shovels): {e}");
        }
    }

    /// Deletes the shovel parameter `name`; one already gone is fine.
    pub async fn clear_shovel(&self, name: &str) {
        let args = ["clear_parameter", "-p", &self.vhost, "shovel", name];
        if let Err(e) = self.try_ctl(&args).await
            && !e.contains("not_found")
            && !e.contains("does not exist")
        {
            eprintln!("warning: clearing shovel {name}: {}", e.trim());
        }
    }

    /// Deletes every shovel parameter whose name starts with `prefix`.
    pub async fn clear_shovels_with_prefix(&self, prefix: &str) {
        let Ok(listing) = self
            .try_ctl(&["list_parameters", "-p", &self.vhost, "--silent"])
            .await
        else {
            return;
        };
        for line in listing.lines() {
            let mut fields = line.split('\t');
            if fields.next() == Some("shovel")
                && let Some(name) = fields.next()
                && name.starts_with(prefix)
            {
                self.clear_shovel(name).await;
            }
        }
    }

    /// `rabbitmqctl shovel_status`, for a failure message.
    pub async fn shovel_status(&self) -> String {
        self.try_ctl(&["shovel_status", "-p", &self.vhost])
            .await
            .unwrap_or_else(|e| e)
    }

    /// The broker's CPU time so far, in clock ticks.
    pub fn cpu_ticks(&self) -> Option<u64> {
        self.pid.and_then(procfs::cpu_ticks)
    }
}

/// A URL without its password.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let user = url[scheme + 3..at].split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}
