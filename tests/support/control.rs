//! The admin endpoint's `/control` and `/registry` as an operator or a
//! service calls them: bearer token, JSON in and out.

use super::http::{HttpResponse, http_send};
use super::polling::{DEFAULT_TIMEOUT, wait_for};
use serde_json::{Value, json};
use std::net::SocketAddr;

/// One instance's admin endpoint and the token it takes.
#[derive(Debug, Clone)]
pub struct ControlClient {
    pub addr: SocketAddr,
    pub token: String,
}

impl ControlClient {
    pub fn new(addr: SocketAddr, token: &str) -> Self {
        Self {
            addr,
            token: token.to_owned(),
        }
    }

    /// `method path` with the token and `body`; panics when nothing listens.
    pub async fn send(&self, method: &str, path: &str, body: Option<&Value>) -> HttpResponse {
        let auth = format!("Bearer {}", self.token);
        let body = body.map(Value::to_string).unwrap_or_default();
        let headers = [
            ("Authorization", auth.as_str()),
            ("Content-Type", "application/json"),
        ];
        http_send(self.addr, method, path, &headers, body.as_bytes())
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// `method path`, which must answer 200; its JSON.
    pub async fn ok(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let response = self.send(method, path, body).await;
        assert_eq!(response.status, 200, "{method} {path}: {}", response.body);
        json_of(&response)
    }

    /// `GET /control/status`.
    pub async fn status(&self) -> Value {
        self.ok("GET", "/control/status", None).await
    }

    pub async fn pause(&self) -> Value {
        self.ok("POST", "/control/pause", None).await
    }

    pub async fn resume(&self) -> Value {
        self.ok("POST", "/control/resume", None).await
    }

    pub async fn drain(&self, endpoint: &str) -> Value {
        let path = format!("/control/endpoints/{endpoint}/drain");
        self.ok("POST", &path, None).await
    }

    pub async fn undrain(&self, endpoint: &str) -> Value {
        let path = format!("/control/endpoints/{endpoint}/undrain");
        self.ok("POST", &path, None).await
    }

    /// Registers `name` into `branch`, publishing to queue `queue` on the
    /// default exchange, for `ttl_ms`.
    pub async fn register(&self, branch: &str, name: &str, queue: &str, ttl_ms: u64) -> Value {
        let body = json!({ "routing_key": queue, "ttl_ms": ttl_ms });
        self.ok("PUT", &format!("/registry/{branch}/{name}"), Some(&body))
            .await
    }

    pub async fn unregister(&self, branch: &str, name: &str) -> Value {
        self.ok("DELETE", &format!("/registry/{branch}/{name}"), None)
            .await
    }

    /// Its status once the admin endpoint answers (a process may still be
    /// starting) and the instance has recovered the group's state.
    pub async fn recovered(&self) -> Value {
        let auth = format!("Bearer {}", self.token);
        let headers = [("Authorization", auth.as_str())];
        wait_for(
            "the instance answers its status, recovered",
            DEFAULT_TIMEOUT,
            || async {
                let response = http_send(self.addr, "GET", "/control/status", &headers, b"")
                    .await
                    .ok()?;
                let status = (response.status == 200).then(|| json_of(&response))?;
                (status["recovered"] == true).then_some(status)
            },
        )
        .await
    }

    /// Waits until the status satisfies `cond`; returns it.
    pub async fn status_until(&self, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
        wait_for(what, DEFAULT_TIMEOUT, || async {
            let status = self.status().await;
            cond(&status).then_some(status)
        })
        .await
    }
}

/// The response's body as JSON; panics when it is not.
pub fn json_of(response: &HttpResponse) -> Value {
    serde_json::from_str(&response.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", response.body))
}

/// The state of endpoint `name` in a status.
pub fn endpoint_state(status: &Value, name: &str) -> Option<String> {
    status["endpoints"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["state"].as_str().map(str::to_owned))
}

/// The names registered into `branch` in a status.
pub fn registered(status: &Value, branch: &str) -> Vec<String> {
    status["registrations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["branch"] == branch)
        .filter_map(|r| r["name"].as_str().map(str::to_owned))
        .collect()
}
