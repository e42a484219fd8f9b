//! The live connection kept up: nodes tried in order of preference, the
//! backoff when none answers, the return to a more preferred node, and
//! each new connection's blocked state followed.

use super::attempt::{connect_once, preference};
use super::failure::{AttemptFailure, ConnectError, ConnectFailure};
use super::{BACKOFF_MAX, Blocking, Connector, DRAIN, RETURN_CHECK, SETTLING, State, Waiting};
use crate::broker::closing::close_connection;
use futures_util::StreamExt;
use lapin::{Connection, ConnectionProperties, Event};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::time::Instant;

impl Connector {
    /// The live connection, connecting if needed: to the first node that
    /// answers, in order of preference, the node just lost last.
    pub async fn connection(&self) -> Result<Arc<Connection>, ConnectError> {
        let mut state = self.state.lock().await;
        if let Some(c) = &state.connection {
            if c.status().connected() {
                return Ok(c.clone());
            }
            state.connection = None;
            state.lost = Some(state.node);
        }
        if let Some(waiting) = &state.waiting
            && Instant::now() < waiting.until
        {
            return Err(waiting.after.backing_off(&self.spec.name));
        }
        let order = preference(self.spec.nodes(), state.lost);
        let mut failed = None;
        for (place, &node) in order.iter().enumerate() {
            match connect_once(&self.spec, node, self.properties()).await {
                Ok(connection) => {
                    let was_down = state.backoff.failures() > 0 || state.lost.is_some();
                    return Ok(self.adopt(&mut state, node, connection, was_down));
                }
                Err(error) => {
                    if let Some(&next) = order.get(place + 1) {
                        let next = self.spec.node_of(next);
                        self.telemetry.broker_node_failed(
                            &self.spec.name,
                            &self.spec.node_of(node),
                            &self.spec.redacted_uri_of(node),
                            &error.error(&self.spec, node).reason(),
                            &next,
                        );
                    }
                    failed = Some((node, error));
                }
            }
        }
        let Some((node, error)) = failed else {
            return Err(ConnectError::BackingOff {
                broker: self.spec.name.clone(),
                last: Arc::new(ConnectFailure::NoNode),
            });
        };
        let refused = matches!(error, AttemptFailure::Refused(_));
        let delay = state.backoff.next_delay();
        // A refusal needs a configuration change: retried at the slowest pace.
        let delay = if refused { BACKOFF_MAX } else { delay };
        let broker = &self.spec.name;
        let (name, uri) = (self.spec.node_of(node), self.spec.redacted_uri_of(node));
        let retry_in = (!(refused && self.refusal_final.load(Ordering::Relaxed))).then_some(delay);
        match &error {
            AttemptFailure::Refused(refusal) => {
                let reason = refusal.to_string();
                self.telemetry
                    .broker_refused(broker, &name, &uri, &reason, retry_in);
            }
            AttemptFailure::Failed(failure) => {
                let reason = failure.to_string();
                self.telemetry
                    .broker_unreachable(broker, &name, &uri, &reason, delay);
            }
        }
        let told = error.error(&self.spec, node);
        state.waiting = Some(Waiting {
            until: Instant::now() + delay,
            after: error,
        });
        Err(told)
    }

    fn properties(&self) -> ConnectionProperties {
        ConnectionProperties::default().with_connection_name(self.connection_name.clone().into())
    }

    /// Makes `connection`, on `node`, the current one: a new epoch, a new
    /// blocked state, the node in logs and metrics.
    fn adopt(
        &self,
        state: &mut State,
        node: usize,
        connection: Connection,
        was_down: bool,
    ) -> Arc<Connection> {
        let connection = Arc::new(connection);
        self.follow_blocking(&connection);
        self.frame_max
            .store(connection.configuration().frame_max(), Ordering::Relaxed);
        *state = State {
            connection: Some(connection.clone()),
            node,
            ..State::default()
        };
        self.epoch.send_modify(|n| {
            *n += 1;
            self.epoch_now.store(*n, Ordering::Release);
            if *n > 1 {
                *self
                    .settling_until
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some(Instant::now() + SETTLING);
            }
        });
        let nodes: Vec<String> = (0..self.spec.nodes())
            .map(|i| self.spec.node_of(i))
            .collect();
        self.telemetry
            .broker_node(&self.spec.name, self.role.as_str(), &nodes, node);
        if was_down {
            self.telemetry.broker_reconnected(
                &self.spec.name,
                &self.spec.node_of(node),
                &self.spec.redacted_uri_of(node),
            );
        }
        if node > 0 {
            self.return_in_background();
        }
        connection
    }

    /// Starts, once, the task that brings the connection back to a more
    /// preferred node when one answers.
    fn return_in_background(&self) {
        let Some(me) = self.me.upgrade() else { return };
        if self.returning.swap(true, Ordering::Relaxed) {
            return;
        }
        self.background.spawn(async move {
            let closed = me.closed.clone();
            tokio::select! {
                () = closed.cancelled() => {}
                () = me.return_to_preferred() => {}
            }
        });
    }

    /// Every [`RETURN_CHECK`] while on a less preferred node: tries the
    /// more preferred ones in order and moves to the first that answers.
    async fn return_to_preferred(&self) {
        loop {
            tokio::time::sleep(RETURN_CHECK).await;
            let current = {
                let state = self.state.lock().await;
                match &state.connection {
                    Some(c) if c.status().connected() => state.node,
                    _ => continue,
                }
            };
            for node in 0..current {
                let Ok(connection) = connect_once(&self.spec, node, self.properties()).await else {
                    continue;
                };
                let mut state = self.state.lock().await;
                let still = state.node == current
                    && state
                        .connection
                        .as_ref()
                        .is_some_and(|c| c.status().connected());
                if !still {
                    let connection = Arc::new(connection);
                    let telemetry = self.telemetry.clone();
                    self.background.spawn(async move {
                        close_connection(&connection, 200, "switchyard: not needed", &telemetry)
                            .await;
                    });
                    break;
                }
                let left = state.connection.take();
                self.telemetry.broker_returned(
                    &self.spec.name,
                    self.role.as_str(),
                    &self.spec.node_of(current),
                    &self.spec.node_of(node),
                );
                self.adopt(&mut state, node, connection, false);
                if let Some(left) = left {
                    self.drain_and_close(left);
                }
                break;
            }
        }
    }

    /// Closes a connection left for a more preferred node once the work
    /// on it has had [`DRAIN`] (at once when the connector closes).
    fn drain_and_close(&self, connection: Arc<Connection>) {
        let (closed, telemetry) = (self.closed.clone(), self.telemetry.clone());
        self.background.spawn(async move {
            tokio::select! {
                () = closed.cancelled() => {}
                () = tokio::time::sleep(DRAIN) => {}
            }
            let why = "switchyard: back on the preferred node";
            close_connection(&connection, 200, why, &telemetry).await;
        });
    }

    /// Follows `connection.blocked` / `unblocked` on a new connection; a new
    /// connection starts unblocked.
    fn follow_blocking(&self, connection: &Connection) {
        let blocking = self.blocking.clone();
        let broker = self.spec.name.clone();
        let telemetry = self.telemetry.clone();
        let set = move |blocked: bool| {
            blocking.send_if_modified(|b| {
                let changed = b.blocked != blocked;
                if changed {
                    *b = Blocking {
                        blocked,
                        since: Instant::now(),
                    };
                }
                changed
            })
        };
        set(false);
        let mut events = Box::pin(connection.events_listener());
        self.background.spawn(async move {
            while let Some(event) = events.next().await {
                match event {
                    Event::ConnectionBlocked(reason) if set(true) => {
                        telemetry.broker_blocked(&broker, &reason)
                    }
                    Event::ConnectionUnblocked if set(false) => telemetry.broker_unblocked(&broker),
                    _ => {}
                }
            }
        });
    }
}
