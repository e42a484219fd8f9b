//! A command as an operator or a service sends it, checked against the
//! configuration in force and the group's state before anything is
//! written: a refused command changes nothing and says why.

use super::record::Body;
use super::record::now_ms;
use super::state::GroupState;
use super::state::Registration;
use crate::config::Settings;
use crate::errors::unprintable;
use serde::Deserialize;
use std::time::Duration;

/// The shortest and the longest lease a registration may ask for.
pub const MIN_TTL: Duration = Duration::from_secs(1);
pub const MAX_TTL: Duration = Duration::from_secs(3600);
/// The longest name, exchange or routing key AMQP carries.
const MAX_NAME: usize = 255;

/// What a command asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Stop taking new messages.
    Pause,
    /// Take new messages again.
    Resume,
    /// Skip the endpoint in every list.
    Drain(String),
    /// Use the endpoint again.
    Undrain(String),
    /// Register (or renew) a service instance.
    Register {
        /// The branch.
        branch: String,
        /// The instance's name.
        name: String,
        /// What it asks for.
        request: RegisterRequest,
    },
    /// Unregister a service instance.
    Unregister {
        /// The branch.
        branch: String,
        /// The instance's name.
        name: String,
    },
}

/// The body of `PUT /registry/{branch}/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    /// A key of `[brokers]`; default: the inbound broker (else the first).
    pub broker: Option<String>,
    /// The exchange; default `""`, the default exchange.
    #[serde(default)]
    pub exchange: String,
    /// The routing key copies are published with.
    pub routing_key: String,
    /// The lease, in milliseconds.
    pub ttl_ms: u64,
}

/// Why a command is refused; each kind is one HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No such branch, endpoint or registration (404).
    #[error("{0}")]
    NotFound(String),
    /// It clashes with the configuration (409).
    #[error("{0}")]
    Conflict(String),
    /// The request itself is wrong (400).
    #[error("{0}")]
    Invalid(String),
    /// More registrations than `admin.max_registrations` (429).
    #[error("{0}")]
    TooMany(String),
}

impl Command {
    /// The record `settings` and `state` allow this command to become.
    pub fn check(self, settings: &Settings, state: &GroupState) -> Result<Body, Refusal> {
        match self {
            Self::Pause => Ok(Body::Pause),
            Self::Resume => Ok(Body::Resume),
            Self::Drain(endpoint) => {
                known_endpoint(&endpoint, settings, state)?;
                Ok(Body::Drain { endpoint })
            }
            Self::Undrain(endpoint) => {
                if !state.drained.contains_key(&endpoint) {
                    known_endpoint(&endpoint, settings, state)?;
                }
                Ok(Body::Undrain { endpoint })
            }
            Self::Register {
                branch,
                name,
                request,
            } => register(branch, name, request, settings, state),
            Self::Unregister { branch, name } => {
                registrable(&branch, settings)?;
                let known = state
                    .registrations
                    .get(&branch)
                    .is_some_and(|n| n.contains_key(&name));
                if !known {
                    return Err(Refusal::NotFound(format!(
                        "no instance \"{name}\" is registered into branch \"{branch}\""
                    )));
                }
                Ok(Body::Unregister { branch, name })
            }
        }
    }
}

fn known_endpoint(endpoint: &str, settings: &Settings, state: &GroupState) -> Result<(), Refusal> {
    if settings.endpoints.contains_key(endpoint) || state.registration(endpoint).is_some() {
        return Ok(());
    }
    let names: Vec<&str> = settings.endpoints.keys().map(String::as_str).collect();
    Err(Refusal::NotFound(format!(
        "unknown endpoint \"{endpoint}\" (configured: {}; or a registered instance's name)",
        names.join(", ")
    )))
}

fn registrable(branch: &str, settings: &Settings) -> Result<(), Refusal> {
    let Some(found) = settings.routing.branch(branch) else {
        let names: Vec<&str> = settings.routing.branch_names().collect();
        return Err(Refusal::NotFound(format!(
            "unknown branch \"{branch}\" (branches: {})",
            names.join(", ")
        )));
    };
    if !found.registrable() {
        return Err(Refusal::Conflict(format!(
            "branch \"{branch}\" is not registrable: set registrable = true on its \
             [[filter_table]] entry"
        )));
    }
    Ok(())
}

fn register(
    branch: String,
    name: String,
    request: RegisterRequest,
    settings: &Settings,
    state: &GroupState,
) -> Result<Body, Refusal> {
    let broker = match request.broker {
        Some(broker) => broker,
        None => settings
            .inbound()
            .map(|i| i.broker.clone())
            .or_else(|| settings.brokers.keys().next().cloned())
            .unwrap_or_default(),
    };
    let registration = Registration {
        branch,
        name,
        broker,
        exchange: request.exchange,
        routing_key: request.routing_key,
        ttl_ms: request.ttl_ms,
        expires_at_ms: now_ms().saturating_add(request.ttl_ms),
    };
    check_registration(&registration, settings, state)?;
    Ok(Body::Register(registration))
}

impl Body {
    /// Whether a record saying this, written at `at_ms`, may be applied
    /// under `settings` to `state`: the rules the request that makes it
    /// was checked against, checked again as it is read, so that a record
    /// no request could have made (a forged one, or one the group's state
    /// no longer allows, as the last of two registrations racing for the
    /// last place) changes nothing.
    pub fn allowed(
        &self,
        at_ms: u64,
        settings: &Settings,
        state: &GroupState,
    ) -> Result<(), Refusal> {
        match self {
            Self::Drain { endpoint } => known_endpoint(endpoint, settings, state),
            Self::Register(registration) => {
                let lease = at_ms
                    .saturating_add(registration.ttl_ms)
                    .saturating_add(LEASE_SLACK_MS);
                if registration.expires_at_ms > lease {
                    return Err(Refusal::Invalid(format!(
                        "a lease ending later than ttl_ms ({}) after it was written",
                        registration.ttl_ms
                    )));
                }
                check_registration(registration, settings, state)
            }
            _ => Ok(()),
        }
    }
}

/// How far a registration's end may lie past `at_ms + ttl_ms` in a record
/// (the writer computes it a moment before it stamps the record).
const LEASE_SLACK_MS: u64 = 1_000;

/// Every rule a registration obeys: its branch, its name, its broker, an
/// exchange and routing key AMQP can carry and a terminal can show, no
/// loop into the inbound queue, a lease of 1 s to 1 h, and room in the
/// group (a renewal needs none).
pub(super) fn check_registration(
    r: &Registration,
    settings: &Settings,
    state: &GroupState,
) -> Result<(), Refusal> {
    registrable(&r.branch, settings)?;
    if r.name.is_empty() || r.name.len() > MAX_NAME || r.name.chars().any(unprintable) {
        return Err(Refusal::Invalid(
            "the name must be 1 to 255 bytes without control or bidirectional formatting \
             characters"
                .to_owned(),
        ));
    }
    if settings.endpoints.contains_key(&r.name) {
        return Err(Refusal::Conflict(format!(
            "\"{}\" is a configured endpoint's name: register under another name",
            r.name
        )));
    }
    if let Some(other) = state.registration(&r.name).filter(|o| o.branch != r.branch) {
        return Err(Refusal::Conflict(format!(
            "\"{}\" is registered into branch \"{}\": unregister it there first, or use \
             another name",
            r.name, other.branch
        )));
    }
    if !settings.brokers.contains_key(&r.broker) {
        let names: Vec<&str> = settings.brokers.keys().map(String::as_str).collect();
        return Err(Refusal::Invalid(format!(
            "unknown broker \"{}\" (brokers: {})",
            r.broker,
            names.join(", ")
        )));
    }
    for (key, value) in [("routing_key", &r.routing_key), ("exchange", &r.exchange)] {
        if value.len() > MAX_NAME {
            return Err(Refusal::Invalid(format!("{key} is longer than 255 bytes")));
        }
        if value.chars().any(unprintable) {
            return Err(Refusal::Invalid(format!(
                "{key} holds a control or bidirectional formatting character"
            )));
        }
    }
    if r.exchange.is_empty() && r.routing_key.is_empty() {
        return Err(Refusal::Invalid(
            "routing_key is empty: on the default exchange it names the queue".to_owned(),
        ));
    }
    if let Some(words) = settings.forwarding_loop(&r.broker, &r.exchange, &r.routing_key) {
        return Err(Refusal::Conflict(words));
    }
    let ttl = Duration::from_millis(r.ttl_ms);
    if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
        return Err(Refusal::Invalid(format!(
            "ttl_ms {} is outside {} to {} (1 s to 1 h)",
            r.ttl_ms,
            MIN_TTL.as_millis(),
            MAX_TTL.as_millis()
        )));
    }
    let renewal = state
        .registrations
        .get(&r.branch)
        .is_some_and(|n| n.contains_key(&r.name));
    let limit = settings
        .control
        .as_ref()
        .map_or(usize::MAX, |c| c.max_registrations);
    let held = state.registration_count();
    if !renewal && held >= limit {
        return Err(Refusal::TooMany(format!(
            "the group holds {held} registrations, admin.max_registrations is {limit}: \
             unregister one, or raise the limit"
        )));
    }
    Ok(())
}
