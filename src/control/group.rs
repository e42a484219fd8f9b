//! One instance's membership of its group: it follows the control stream
//! from its start (or from a snapshot, once retention trimmed it), applies
//! every record of its group in order, and tells the pipeline what
//! changed (the pause, the drained set, the registered endpoints).
//!
//! An instance that starts or reconnects first appends a `hello` record of
//! its own; reading it back means every command written before it has
//! been read, so the state in force is known: [`Group::recovered`]. A
//! command taken on the admin endpoint is appended with a confirm and
//! answered once this instance has read it back and applied it, so the
//! answer tells the truth about the state. Every instance acknowledges
//! each command with an `applied` record, which status shows, and says it
//! is alive every `heartbeat_ms`, so one killed leaves the status.

use super::apply::Changed;
use super::base::{Base, Step};
use super::command::{Refusal, check_registration};
use super::record::{Body, Record, now_ms};
use super::state::GroupState;
use super::state::Registration;
use crate::backoff::Backoff;
use crate::broker::{ControlStream, ControlStreamError, Drains, Start, StreamRecord};
use crate::config::{Control, Settings};
use crate::destination::Endpoint;
use crate::telemetry::Telemetry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long a command's sender waits to read it back applied.
const APPLY_WAIT: Duration = Duration::from_secs(5);
/// How long an instance waits to write and read back its own marker
/// before it takes the state from what the stream delivered, and how
/// quiet the stream must have been by then.
const HELLO_WAIT: Duration = Duration::from_secs(3);
const QUIET: Duration = Duration::from_secs(1);
/// How long a stopping instance tries to say it leaves.
const LEAVE_BOUND: Duration = Duration::from_secs(2);
/// Records read between two snapshots this instance writes.
const SNAPSHOT_EVERY: u64 = 500;

/// The registered endpoints by branch, in name order.
pub type Registered = Arc<BTreeMap<String, Vec<Arc<Endpoint>>>>;

/// Why a command was not carried out.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// Control is off on this instance (`[control] enabled = false`).
    #[error("control is off on this instance ([control] enabled = false)")]
    Off,
    /// The control stream could not be written.
    #[error("the control stream cannot be written now: {0}")]
    Unavailable(ControlStreamError),
    /// Written, but not read back within the wait.
    #[error("the command was written but not applied here within {} s; ask for the status", APPLY_WAIT.as_secs())]
    NotApplied,
    /// Written, and refused as it was read back: the group's state no
    /// longer allowed it (another command came first).
    #[error("{0}")]
    Refused(Refusal),
}

/// One instance's view of its group.
#[derive(Clone)]
pub struct Group {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Option<Control>,
    group: String,
    instance: String,
    state: Mutex<GroupState>,
    paused: watch::Sender<bool>,
    registered: watch::Sender<Registered>,
    recovered: watch::Sender<bool>,
    drains: Drains,
    /// The configuration in force: every command record is checked against
    /// it as it is read, and it says whose records are the group's.
    rules: Mutex<Option<Arc<Settings>>>,
    waiters: Mutex<HashMap<String, oneshot::Sender<Result<(), Refusal>>>>,
    stream: tokio::sync::Mutex<Option<ControlStream>>,
    telemetry: Telemetry,
}

impl Group {
    /// Instance `instance` of group `group`, following `settings`' stream
    /// (`None`: control off, nothing ever paused or registered), setting
    /// `drains` as the group drains endpoints.
    pub fn new(
        settings: Option<Control>,
        group: &str,
        instance: String,
        drains: Drains,
        telemetry: Telemetry,
    ) -> Self {
        let off = settings.is_none();
        Self {
            inner: Arc::new(Inner {
                settings,
                group: group.to_owned(),
                instance,
                state: Mutex::default(),
                paused: watch::Sender::new(false),
                registered: watch::Sender::new(Arc::default()),
                recovered: watch::Sender::new(off),
                drains,
                rules: Mutex::default(),
                waiters: Mutex::default(),
                stream: tokio::sync::Mutex::new(None),
                telemetry,
            }),
        }
    }

    /// Checks every record read from now on against `settings` (the
    /// configuration in force, as its file says).
    pub fn set_rules(&self, settings: Arc<Settings>) {
        *lock(&self.inner.rules) = Some(settings);
    }

    fn rules(&self) -> Option<Arc<Settings>> {
        lock(&self.inner.rules).clone()
    }

    /// This instance's name in the group.
    pub fn instance(&self) -> &str {
        &self.inner.instance
    }

    /// Whether control is on.
    pub fn on(&self) -> bool {
        self.inner.settings.is_some()
    }

    /// The control settings, when on.
    pub fn settings(&self) -> Option<&Control> {
        self.inner.settings.as_ref()
    }

    /// The group's state now.
    pub fn state(&self) -> GroupState {
        lock(&self.inner.state).clone()
    }

    /// Whether the group is paused now.
    pub fn paused(&self) -> bool {
        *self.inner.paused.borrow()
    }

    /// Follows the pause.
    pub fn pause_changes(&self) -> watch::Receiver<bool> {
        self.inner.paused.subscribe()
    }

    /// Pauses or resumes this view alone, as a command read back would,
    /// for unit tests without a stream.
    #[cfg(test)]
    pub fn set_paused(&self, paused: bool) {
        self.inner.paused.send_replace(paused);
    }

    /// Returns once the group is not paused.
    pub async fn until_resumed(&self) {
        let _ = self.inner.paused.subscribe().wait_for(|p| !p).await;
    }

    /// Follows the registered endpoints.
    pub fn registered(&self) -> watch::Receiver<Registered> {
        self.inner.registered.subscribe()
    }

    /// Whether the state in force has been read back.
    pub fn is_recovered(&self) -> bool {
        *self.inner.recovered.borrow()
    }

    /// Returns once the state in force has been read back from the stream
    /// (at once with control off).
    pub async fn recovered(&self) {
        let _ = self.inner.recovered.subscribe().wait_for(|r| *r).await;
    }

    /// Starts following the stream on `background` until `stop`.
    pub fn start(&self, background: &TaskTracker, stop: CancellationToken) {
        let Some(settings) = self.inner.settings.clone() else {
            return;
        };
        let stream = ControlStream::new(
            &settings,
            &self.inner.group,
            background.clone(),
            self.inner.telemetry.clone(),
        );
        let (beating, beat_stop, heartbeat) = (self.clone(), stop.clone(), settings.heartbeat);
        background.spawn(async move { beating.beat(heartbeat, &beat_stop).await });
        let group = self.clone();
        background.spawn(async move {
            *group.inner.stream.lock().await = Some(stream);
            group.follow(&settings, &stop).await;
            // Said once, briefly: a stop that cannot say it leaves a line
            // in the status until newer instances push it out.
            let leave = uuid::Uuid::new_v4().to_string();
            let _ = tokio::time::timeout(LEAVE_BOUND, group.append(leave, Body::Leave)).await;
            if let Some(mut stream) = group.inner.stream.lock().await.take() {
                stream.close().await;
            }
        });
    }

    /// Appends `body` and waits until this instance has applied it.
    pub async fn submit(&self, body: Body) -> Result<(), SubmitError> {
        if self.inner.settings.is_none() {
            return Err(SubmitError::Off);
        }
        let id = uuid::Uuid::new_v4().to_string();
        let (done, applied) = oneshot::channel();
        lock(&self.inner.waiters).insert(id.clone(), done);
        let written = self.append(id.clone(), body).await;
        if let Err(e) = written {
            lock(&self.inner.waiters).remove(&id);
            return Err(SubmitError::Unavailable(e));
        }
        match tokio::time::timeout(APPLY_WAIT, applied).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(refusal))) => Err(SubmitError::Refused(refusal)),
            _ => {
                lock(&self.inner.waiters).remove(&id);
                Err(SubmitError::NotApplied)
            }
        }
    }

    async fn append(&self, id: String, body: Body) -> Result<(), ControlStreamError> {
        let bytes = self.record(id, body);
        let mut stream = self.inner.stream.lock().await;
        match stream.as_mut() {
            Some(stream) => stream.append(&bytes).await,
            None => Err(ControlStreamError::Cancelled),
        }
    }

    /// A record of this instance saying `body`, as written.
    fn record(&self, id: String, body: Body) -> Vec<u8> {
        let record = Record {
            group: self.inner.group.clone(),
            instance: self.inner.instance.clone(),
            id,
            at_ms: now_ms(),
            body,
        };
        serde_json::to_vec(&record).unwrap_or_default()
    }

    /// Says this instance is alive every `heartbeat` once it knows the
    /// state, until `stop`. A beat that cannot be written is skipped: the
    /// next says the same.
    async fn beat(&self, heartbeat: Duration, stop: &CancellationToken) {
        let heartbeat_ms = u64::try_from(heartbeat.as_millis()).unwrap_or(u64::MAX);
        let mut recovered = self.inner.recovered.subscribe();
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                _ = recovered.wait_for(|r| *r) => {}
            }
            let bytes = self.record(
                uuid::Uuid::new_v4().to_string(),
                Body::Alive { heartbeat_ms },
            );
            {
                let mut stream = self.inner.stream.lock().await;
                // Checked under the lock: the `leave` is written once
                // stopped, and no beat may follow it.
                if stop.is_cancelled() {
                    return;
                }
                if let Some(stream) = stream.as_mut() {
                    // A beat the broker holds back (an alarm) does not hold
                    // up the stop: what was sent still precedes the leave.
                    tokio::select! {
                        _ = stream.append(&bytes) => {}
                        () = stop.cancelled() => return,
                    }
                }
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = tokio::time::sleep(heartbeat) => {}
            }
        }
    }

    /// Follows the stream until `stop`, reconnecting with a backoff.
    async fn follow(&self, settings: &Control, stop: &CancellationToken) {
        let mut reader = Reader::default();
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        while !stop.is_cancelled() {
            let result = tokio::select! {
                () = stop.cancelled() => return,
                result = self.follow_once(&mut reader, stop) => result,
            };
            if let Err(error) = result {
                let delay = backoff.next_delay();
                let telemetry = &self.inner.telemetry;
                if error.is_refusal() {
                    telemetry.control_refused(&settings.stream, &error, delay);
                } else {
                    telemetry.control_unavailable(&settings.stream, &error, delay);
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(delay) => {}
                }
            } else {
                backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
            }
        }
    }

    /// One connection's worth of following: declare, say hello, read.
    async fn follow_once(
        &self,
        reader: &mut Reader,
        stop: &CancellationToken,
    ) -> Result<(), ControlStreamError> {
        let mut follower = {
            let guard = self.inner.stream.lock().await;
            let Some(stream) = guard.as_ref() else {
                return Err(ControlStreamError::Cancelled);
            };
            stream.declare().await?;
            stream.follow(reader.next).await?
        };
        let hello = uuid::Uuid::new_v4().to_string();
        // Written beside the reading: a broker that blocks publishers (a
        // resource alarm) holds it back, and the reading must go on.
        let written = {
            let (group, hello) = (self.clone(), hello.clone());
            tokio::spawn(async move { group.append(hello, Body::Hello).await.is_ok() })
        };
        tokio::pin!(written);
        let (mut hello_done, mut hello_written) = (false, false);
        let began = Instant::now();
        let mut last_read = began;
        let result = loop {
            let lapse = self.next_lapse();
            // Without its own marker, an instance takes the state from what
            // the stream delivered once it went quiet.
            let unmarked = !self.is_recovered() && !hello_written;
            let quiet = (began + HELLO_WAIT).max(last_read + QUIET);
            let StreamRecord {
                offset,
                writer,
                body: bytes,
            } = tokio::select! {
                () = stop.cancelled() => break Ok(()),
                () = lapse => {
                    self.lapse();
                    continue;
                }
                done = &mut written, if !hello_done => {
                    // Not written: the state is taken once the stream is quiet.
                    (hello_done, hello_written) = (true, matches!(done, Ok(true)));
                    continue;
                }
                () = tokio::time::sleep_until(quiet), if unmarked => {
                    self.recover_unmarked(reader);
                    continue;
                }
                next = follower.next() => match next {
                    Ok(next) => next,
                    Err(e) => break Err(e),
                },
            };
            last_read = Instant::now();
            reader.next = Start::Offset(offset + 1);
            if !self.written_by_the_group(writer.as_deref()) {
                let stream = self
                    .inner
                    .settings
                    .as_ref()
                    .map_or("", |s| s.stream.as_str());
                let telemetry = &self.inner.telemetry;
                telemetry.stream_record_ignored(stream, offset, writer.as_deref());
                continue;
            }
            let record = match serde_json::from_slice::<Record>(&bytes) {
                Ok(record) => record,
                Err(e) => {
                    self.inner.telemetry.control_record_unreadable(offset, &e);
                    continue;
                }
            };
            if record.group != self.inner.group {
                continue;
            }
            if let Err(e) = self.read(reader, offset, record, &hello).await {
                break Err(e);
            }
        };
        follower.close().await;
        result
    }

    /// Whether a record published as `writer` is one of the group's: its
    /// `user_id`, which the broker checked, names a writer the
    /// configuration in force allows (anyone, when the control broker's
    /// user is unknown).
    fn written_by_the_group(&self, writer: Option<&str>) -> bool {
        let (Some(rules), Some(control)) = (self.rules(), self.inner.settings.as_ref()) else {
            return true;
        };
        let writers = rules.stream_writers(&control.broker);
        writers.is_empty() || writer.is_some_and(|w| writers.iter().any(|u| u == w))
    }

    /// Applies one record of this group read at `offset`.
    async fn read(
        &self,
        reader: &mut Reader,
        offset: u64,
        record: Record,
        hello: &str,
    ) -> Result<(), ControlStreamError> {
        reader.since_snapshot += 1;
        if matches!(record.body, Body::Snapshot { .. }) {
            reader.since_snapshot = 0;
        }
        let (id, command) = (record.id.clone(), record.body.is_command());
        let refused = match reader.base.read(offset, record, hello) {
            Step::Wait => return Ok(()),
            Step::Apply(records) => self.apply_all(&records),
            Step::Rebase(state, records) => {
                self.rebase(*state);
                self.apply_all(&records)
            }
            Step::Partial(records) => {
                if let Some(settings) = &self.inner.settings {
                    let first = reader.base.first().unwrap_or_default();
                    self.inner
                        .telemetry
                        .control_state_partial(&settings.stream, first);
                }
                self.apply_all(&records)
            }
        };
        if id == hello && !self.is_recovered() {
            let state = self.state();
            if let Some(settings) = &self.inner.settings {
                self.inner.telemetry.control_recovered(
                    &settings.stream,
                    state.paused.is_some(),
                    state.drained.len(),
                    state.registration_count(),
                );
            }
            self.inner.recovered.send_replace(true);
        }
        if let Some(waiter) = lock(&self.inner.waiters).remove(&id) {
            let outcome = refused.into_iter().find(|(of, _)| *of == id);
            let _ = waiter.send(outcome.map_or(Ok(()), |(_, refusal)| Err(refusal)));
        }
        if command && self.is_recovered() {
            let ack = uuid::Uuid::new_v4().to_string();
            self.append(ack, Body::Applied { offset }).await?;
        }
        if reader.since_snapshot >= SNAPSHOT_EVERY && self.is_recovered() {
            reader.since_snapshot = 0;
            let state = self.state();
            let snapshot = uuid::Uuid::new_v4().to_string();
            let body = Body::Snapshot {
                through: offset,
                state,
            };
            self.append(snapshot, body).await?;
        }
        Ok(())
    }

    /// The state in force without this instance's marker (it could not be
    /// written): what the stream delivered before going quiet.
    fn recover_unmarked(&self, reader: &mut Reader) {
        let records = reader.base.settle();
        self.apply_all(&records);
        let state = self.state();
        if let Some(settings) = &self.inner.settings {
            self.inner.telemetry.control_recovered_unmarked(
                &settings.stream,
                state.paused.is_some(),
                state.drained.len(),
                state.registration_count(),
            );
        }
        self.inner.recovered.send_replace(true);
    }

    /// Takes `state` as the group's, from a snapshot, less any
    /// registration the configuration in force does not allow.
    fn rebase(&self, mut state: GroupState) {
        if let Some(rules) = self.rules() {
            let empty = GroupState::default();
            for names in state.registrations.values_mut() {
                names.retain(|_, r| check_registration(r, &rules, &empty).is_ok());
            }
            state.registrations.retain(|_, names| !names.is_empty());
        }
        let before = self.state();
        *lock(&self.inner.state) = state;
        self.changed(
            &before,
            Changed {
                paused: true,
                drains: true,
                registrations: true,
            },
            None,
        );
    }

    /// Applies `records` in order; the ids of those refused, with why.
    fn apply_all(&self, records: &[(u64, Record)]) -> Vec<(String, Refusal)> {
        let mut refused = Vec::new();
        for (offset, record) in records {
            if let Err(refusal) = self.apply(*offset, record) {
                refused.push((record.id.clone(), refusal));
            }
        }
        refused
    }

    /// Applies `record` unless the configuration in force refuses it.
    fn apply(&self, offset: u64, record: &Record) -> Result<(), Refusal> {
        let rules = self.rules();
        if rules.is_some() && matches!(record.body, Body::Register(_)) {
            // Leases already over make room before a registration is counted.
            self.lapse();
        }
        let (before, changed) = {
            let mut state = lock(&self.inner.state);
            if let Some(rules) = &rules
                && let Err(refusal) = record.body.allowed(record.at_ms, rules, &state)
            {
                drop(state);
                let telemetry = &self.inner.telemetry;
                telemetry.control_record_refused(offset, &record.instance, &refusal);
                return Err(refusal);
            }
            let before = state.clone();
            let changed = state.apply(offset, record, now_ms());
            (before, changed)
        };
        if changed.any() {
            self.changed(&before, changed, Some(&record.instance));
        }
        Ok(())
    }

    /// Ends the leases due; every instance does so on its own clock.
    fn lapse(&self) {
        let (before, any) = {
            let mut state = lock(&self.inner.state);
            let before = state.clone();
            (before, state.lapse(now_ms()))
        };
        if any {
            self.changed(
                &before,
                Changed {
                    registrations: true,
                    drains: true,
                    ..Changed::default()
                },
                None,
            );
        }
    }

    /// Sleeps until the next lease ends.
    fn next_lapse(&self) -> impl std::future::Future<Output = ()> + use<> {
        let next = lock(&self.inner.state).next_expiry();
        async move {
            match next {
                Some(at) => {
                    let wait = at.saturating_sub(now_ms());
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                }
                None => std::future::pending().await,
            }
        }
    }

    /// Tells the pipeline and telemetry what changed since `before`, by
    /// the instance that wrote the record (`None`: a snapshot or a lapse).
    fn changed(&self, before: &GroupState, changed: Changed, writer: Option<&str>) {
        let state = self.state();
        let telemetry = &self.inner.telemetry;
        if changed.paused && before.paused.is_some() != state.paused.is_some() {
            // A pause is said by who paused; a resume by who resumed.
            let by = match &state.paused {
                Some(since) => since.by.as_str(),
                None => writer.unwrap_or_default(),
            };
            telemetry.paused(state.paused.is_some(), by);
            self.inner.paused.send_replace(state.paused.is_some());
        }
        if changed.drains {
            for (endpoint, since) in &state.drained {
                if !before.drained.contains_key(endpoint) {
                    telemetry.endpoint_drained(endpoint, true, &since.by);
                }
            }
            for (endpoint, since) in &before.drained {
                if !state.drained.contains_key(endpoint) {
                    let by = writer.unwrap_or(&since.by);
                    telemetry.endpoint_drained(endpoint, false, by);
                }
            }
            let names: BTreeSet<String> = state.drained.keys().cloned().collect();
            self.inner.drains.set(names);
        }
        if changed.registrations {
            self.registrations_changed(before, &state);
        }
    }

    fn registrations_changed(&self, before: &GroupState, state: &GroupState) {
        let telemetry = &self.inner.telemetry;
        let now = now_ms();
        for r in state.registered() {
            let had = before
                .registrations
                .get(&r.branch)
                .and_then(|n| n.get(&r.name));
            if had.is_none_or(|had| !had.same_endpoint(r)) {
                let ttl = Duration::from_millis(r.ttl_ms);
                telemetry.registered(&r.branch, &r.name, &r.routing_key, ttl);
            }
        }
        for r in before.registered() {
            let kept = state
                .registrations
                .get(&r.branch)
                .and_then(|n| n.get(&r.name));
            if kept.is_none() {
                let why = if r.expires_at_ms <= now {
                    "lapsed"
                } else {
                    "unregistered"
                };
                telemetry.unregistered(&r.branch, &r.name, why);
            }
        }
        let branches: BTreeSet<&String> = state
            .registrations
            .keys()
            .chain(before.registrations.keys())
            .collect();
        for branch in branches {
            let count = state.registrations.get(branch).map_or(0, BTreeMap::len);
            telemetry.registrations(branch, count);
        }
        let registered: BTreeMap<String, Vec<Arc<Endpoint>>> = state
            .registrations
            .iter()
            .map(|(branch, names)| (branch.clone(), names.values().map(endpoint_of).collect()))
            .collect();
        self.inner.registered.send_replace(Arc::new(registered));
    }
}

/// Where the follower is in the stream, across reconnections.
struct Reader {
    /// Where to follow from next.
    next: Start,
    /// Where its knowledge of the group starts.
    base: Base,
    /// Records read since the last snapshot.
    since_snapshot: u64,
}

impl Default for Reader {
    fn default() -> Self {
        Self {
            next: Start::First,
            base: Base::default(),
            since_snapshot: 0,
        }
    }
}

/// The endpoint a registration publishes to.
pub fn endpoint_of(r: &Registration) -> Arc<Endpoint> {
    Arc::new(Endpoint::plain(
        &r.name,
        &r.broker,
        &r.exchange,
        &r.routing_key,
    ))
}

/// This process's name in its group: its host and process id.
pub fn instance_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
