//! The connections of one listener, in two rooms. A connection accepted
//! waits in the *lobby* until its client sends a first byte; only then
//! does it take one of the listener's served slots (its limit) and get a
//! request read. So a client that connects and says nothing holds a socket
//! and a small task, never a slot, and the accept loop never waits behind
//! such clients: when the lobby is full, the connection that has waited
//! there longest is closed for the new one. A flood of idle connections
//! thus costs a real client nothing but its own accept.
//!
//! When every slot is taken and another client has sent its first byte,
//! the gate closes a served connection between requests (a keep-alive left
//! idle, or a head that stopped half-way and so is not yet authenticated),
//! oldest first. "Between requests" is what the kernel says when the
//! server's reader finds nothing to read: a connection whose bytes just
//! came (its handler may be about to start), or whose answer may still be
//! on its way out, is not chosen until the server has come back to read it
//! and the socket holds no byte. A connection whose request is being
//! handled is never closed for room, with one exception: a request whose
//! body arrives slower than [`MIN_BODY_RATE`] once it has had
//! [`BODY_GRACE`] to start. While every slot is taken and no connection is
//! between requests, the slowest such body is cut (its request answered
//! `408` and its connection closed) for the waiting client; a body arriving
//! at a reasonable rate is never cut. While no connection can be closed,
//! the new client waits for a slot.

use socket2::SockRef;
use std::collections::BTreeMap;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// Connections a lobby holds at least, whatever the listener's limit: a
/// socket and a task waiting for one byte each, a few hundred bytes.
pub const LOBBY_MIN: usize = 1024;

/// The slowest a request's body may arrive, in bytes a second, once it has
/// had [`BODY_GRACE`], without being cut for a client waiting for a slot
/// (Apache's `mod_reqtimeout` and nginx's per-read body timeout guard the
/// same door).
pub const MIN_BODY_RATE: u64 = 1024;
/// How long a body may take to reach [`MIN_BODY_RATE`].
pub const BODY_GRACE: Duration = Duration::from_secs(1);
/// How often a client waiting for a slot looks again for a body to cut.
const RECHECK: Duration = Duration::from_millis(100);

/// The connections of one listener. Cheap to clone.
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

struct Inner {
    /// Served slots: the listener's limit.
    slots: Arc<Semaphore>,
    served: Mutex<BTreeMap<u64, Arc<Conn>>>,
    /// Connections that have not sent a byte yet, by arrival.
    lobby: Mutex<BTreeMap<u64, Arc<Waiting>>>,
    lobby_limit: usize,
    next_id: AtomicU64,
    /// A served connection became one that may be closed for room.
    idle: Arc<Notify>,
    /// A connection left the lobby.
    left: Notify,
    /// Told each connection closed to make room for another.
    made_room: Box<dyn Fn() + Send + Sync>,
    /// What body timestamps count from.
    epoch: tokio::time::Instant,
    /// Clients that have sent a byte and wait for a slot now.
    waiting: AtomicUsize,
}

/// A connection in the lobby, as the gate sees it.
struct Waiting {
    /// Its first byte arrived: it waits for a slot, and is not closed for
    /// room.
    heard: AtomicBool,
    /// Cancelled when the gate closes it for room.
    shed: CancellationToken,
}

/// A served connection has just received bytes: a request being read.
const HEARD: u8 = 0;
/// A request was answered and the server has not read again since: its
/// answer may still be being written.
const ANSWERED: u8 = 1;
/// Read after an answer, and nothing was there: a keep-alive left idle.
const IDLE: u8 = 2;
/// Read after some bytes, and nothing more was there: when no request is
/// being handled, a head still arriving, and so not yet authenticated.
const STALLED: u8 = 3;

/// A served connection as the gate sees it.
struct Conn {
    id: u64,
    /// [`HEARD`], [`ANSWERED`], [`IDLE`] or [`STALLED`].
    state: AtomicU8,
    /// Requests of this connection being handled.
    busy: AtomicUsize,
    /// Cancelled when the gate closes it for room.
    shed: CancellationToken,
    /// The gate's [`Inner::idle`].
    idle: Arc<Notify>,
    /// Bytes read from its socket so far.
    received: AtomicU64,
    /// While a request's body is read: when that began, in milliseconds
    /// since the gate's epoch plus one (0: no body being read), and the
    /// bytes received before it.
    body_began: AtomicU64,
    body_from: AtomicU64,
    /// Cancelled when the gate cuts its body for arriving too slowly.
    cut: CancellationToken,
}

/// Runs `f` when dropped.
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

/// A connection in the lobby: it leaves when dropped or served.
pub struct Arrived {
    id: u64,
    waiting: Arc<Waiting>,
    gate: Gate,
    stream: Option<TcpStream>,
}

/// A served connection's place: its slot, released (and the connection
/// forgotten) when dropped.
pub struct Admitted {
    conn: Arc<Conn>,
    gate: Gate,
    _slot: OwnedSemaphorePermit,
}

/// What a connection that has sent its first byte gets.
pub struct Served {
    /// Its stream, watched for what its client sends.
    pub stream: Watched,
    /// Its place among the served connections.
    pub admitted: Admitted,
}

impl Gate {
    /// A gate of `limit` served connections and a lobby of at least
    /// [`LOBBY_MIN`]; `made_room` is told each connection closed to make
    /// room for another, in either.
    pub fn new(limit: usize, made_room: impl Fn() + Send + Sync + 'static) -> Self {
        Self::with_lobby(limit, limit.max(LOBBY_MIN), made_room)
    }

    fn with_lobby(
        limit: usize,
        lobby: usize,
        made_room: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                slots: Arc::new(Semaphore::new(limit)),
                served: Mutex::default(),
                lobby: Mutex::default(),
                lobby_limit: lobby,
                next_id: AtomicU64::new(0),
                idle: Arc::new(Notify::new()),
                left: Notify::new(),
                made_room: Box::new(made_room),
                epoch: tokio::time::Instant::now(),
                waiting: AtomicUsize::new(0),
            }),
        }
    }

    fn served(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<Conn>>> {
        self.inner.served.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lobby(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<Waiting>>> {
        self.inner.lobby.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a connection just accepted into the lobby. When the lobby is
    /// full, the connection waiting there longest without a byte is closed
    /// for it; only while every one has sent a byte and waits for a slot
    /// does this wait. `None` once `stop` is cancelled.
    pub async fn arrive(&self, stream: TcpStream, stop: &CancellationToken) -> Option<Arrived> {
        loop {
            let left = self.inner.left.notified();
            let mut left = std::pin::pin!(left);
            left.as_mut().enable();
            {
                let mut lobby = self.lobby();
                if lobby.len() >= self.inner.lobby_limit {
                    let oldest = lobby
                        .iter()
                        .find(|(_, w)| !w.heard.load(Ordering::Acquire))
                        .map(|(id, _)| *id);
                    if let Some(waiting) = oldest.and_then(|id| lobby.remove(&id)) {
                        waiting.shed.cancel();
                        (self.inner.made_room)();
                    }
                }
                if lobby.len() < self.inner.lobby_limit {
                    let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
                    let waiting = Arc::new(Waiting {
                        heard: AtomicBool::new(false),
                        shed: CancellationToken::new(),
                    });
                    lobby.insert(id, waiting.clone());
                    let arrived = Arrived {
                        id,
                        waiting,
                        gate: self.clone(),
                        stream: Some(stream),
                    };
                    return Some(arrived);
                }
            }
            tokio::select! {
                () = stop.cancelled() => return None,
                () = left => {}
            }
        }
    }

    /// A served slot for a connection that has sent a byte: free at once,
    /// or made by closing a served connection between requests
    /// ([`Self::shed_one`]), or, while every one is handling a request,
    /// the first that frees.
    async fn slot(&self, stop: &CancellationToken) -> Option<OwnedSemaphorePermit> {
        if let Ok(slot) = self.inner.slots.clone().try_acquire_owned() {
            return Some(slot);
        }
        let waiting = &self.inner.waiting;
        waiting.fetch_add(1, Ordering::AcqRel);
        let _waited = scopeguard(|| {
            waiting.fetch_sub(1, Ordering::AcqRel);
        });
        loop {
            if let Ok(slot) = self.inner.slots.clone().try_acquire_owned() {
                return Some(slot);
            }
            let idle = self.inner.idle.notified();
            let mut idle = std::pin::pin!(idle);
            idle.as_mut().enable();
            let shed = self.shed_one();
            if !shed {
                self.cut_slowest_body();
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => return None,
                slot = self.inner.slots.clone().acquire_owned() => return slot.ok(),
                () = idle, if !shed => {}
                // A body may fall below the rate while the client waits,
                // and the slot a cut frees may go to another client.
                () = tokio::time::sleep(RECHECK), if !shed => {}
            }
        }
    }

    /// Closes the served connection between requests that has been open
    /// longest. False when every one is handling a request, or has not
    /// been read since its bytes came or its answer was given.
    fn shed_one(&self) -> bool {
        let served = self.served();
        let between = served.values().find(|c| {
            c.busy.load(Ordering::Acquire) == 0
                && matches!(c.state.load(Ordering::Acquire), IDLE | STALLED)
                && !c.shed.is_cancelled()
        });
        match between {
            Some(conn) => {
                conn.shed.cancel();
                (self.inner.made_room)();
                true
            }
            None => false,
        }
    }

    /// Cuts the body arriving slowest among those below [`MIN_BODY_RATE`]
    /// after [`BODY_GRACE`], unless the bodies cut already and not yet
    /// closed will free a slot for every client waiting; whether it cut.
    fn cut_slowest_body(&self) -> bool {
        let now = self.millis();
        let grace = u64::try_from(BODY_GRACE.as_millis()).unwrap_or(u64::MAX);
        let served = self.served();
        let closing = served.values().filter(|c| c.cut.is_cancelled()).count();
        if closing >= self.inner.waiting.load(Ordering::Acquire) {
            return false;
        }
        let slowest = served
            .values()
            .filter(|c| !c.cut.is_cancelled())
            .filter_map(|c| {
                let began = c.body_began.load(Ordering::Acquire).checked_sub(1)?;
                let elapsed = now.saturating_sub(began);
                let bytes = c
                    .received
                    .load(Ordering::Acquire)
                    .saturating_sub(c.body_from.load(Ordering::Acquire));
                let rate = bytes.saturating_mul(1000) / elapsed.max(1);
                (elapsed >= grace && rate < MIN_BODY_RATE).then_some((rate, c))
            })
            .min_by_key(|(rate, _)| *rate);
        match slowest {
            Some((_, conn)) => {
                conn.cut.cancel();
                (self.inner.made_room)();
                true
            }
            None => false,
        }
    }

    /// Milliseconds since the gate's epoch.
    fn millis(&self) -> u64 {
        u64::try_from(self.inner.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// How many connections are served.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.served().len()
    }
}

impl Arrived {
    /// Waits in the lobby for the client's first byte, within `within`,
    /// then for a served slot. `None` when the client sent nothing in
    /// time, the gate closed the connection for room, or `stop`.
    pub async fn first_byte(
        mut self,
        within: Duration,
        stop: &CancellationToken,
    ) -> Option<Served> {
        let stream = self.stream.take()?;
        let shed = self.waiting.shed.clone();
        // A peek, not `readable()`: readiness can be reported with nothing
        // to read, and a peek waits for a byte that is really there.
        let mut byte = [0u8; 1];
        let peeked = tokio::select! {
            () = stop.cancelled() => return None,
            () = shed.cancelled() => return None,
            peeked = tokio::time::timeout(within, stream.peek(&mut byte)) => peeked,
        };
        if !matches!(peeked, Ok(Ok(1))) {
            return None; // nothing in time, the client gone, or an error
        }
        self.waiting.heard.store(true, Ordering::Release);
        let gate = self.gate.clone();
        let slot = tokio::select! {
            () = shed.cancelled() => return None,
            slot = gate.slot(stop) => slot?,
        };
        drop(self);
        let conn = Arc::new(Conn {
            id: gate.inner.next_id.fetch_add(1, Ordering::Relaxed),
            state: AtomicU8::new(HEARD),
            busy: AtomicUsize::new(0),
            shed: CancellationToken::new(),
            idle: gate.inner.idle.clone(),
            received: AtomicU64::new(0),
            body_began: AtomicU64::new(0),
            body_from: AtomicU64::new(0),
            cut: CancellationToken::new(),
        });
        gate.served().insert(conn.id, conn.clone());
        Some(Served {
            stream: Watched {
                io: stream,
                conn: conn.clone(),
            },
            admitted: Admitted {
                conn,
                gate,
                _slot: slot,
            },
        })
    }
}

impl Drop for Arrived {
    fn drop(&mut self) {
        self.gate.lobby().remove(&self.id);
        self.gate.inner.left.notify_one();
    }
}

impl Admitted {
    /// Cancelled when the gate closes this connection for room.
    pub fn shed(&self) -> CancellationToken {
        self.conn.shed.clone()
    }

    /// Marks this connection's requests as being handled ([`BusyMarker`]).
    pub fn busy(&self) -> BusyMarker {
        BusyMarker {
            conn: self.conn.clone(),
        }
    }

    /// Watches the bodies of this connection's requests ([`BodyWatch`]).
    pub fn body_watch(&self) -> BodyWatch {
        BodyWatch {
            conn: self.conn.clone(),
            gate: self.gate.clone(),
        }
    }
}

/// What the gate knows of a connection's request bodies: a request reads
/// its body under [`BodyWatch::reading`], and gives up (`408`) when
/// [`BodyWatch::cut`] is cancelled, which the gate does to a body arriving
/// slower than [`MIN_BODY_RATE`] while another client waits for a slot.
#[derive(Clone)]
pub struct BodyWatch {
    conn: Arc<Conn>,
    gate: Gate,
}

/// A body being read: the gate measures its rate until dropped.
pub struct BodyReading {
    conn: Arc<Conn>,
}

impl BodyWatch {
    /// A body is read from now until the guard is dropped.
    pub fn reading(&self) -> BodyReading {
        let conn = &self.conn;
        conn.body_from
            .store(conn.received.load(Ordering::Acquire), Ordering::Release);
        conn.body_began
            .store(self.gate.millis() + 1, Ordering::Release);
        BodyReading {
            conn: self.conn.clone(),
        }
    }

    /// Cancelled when the gate cuts this connection's body.
    pub fn cut(&self) -> CancellationToken {
        self.conn.cut.clone()
    }
}

impl Drop for BodyReading {
    fn drop(&mut self) {
        self.conn.body_began.store(0, Ordering::Release);
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.gate.served().remove(&self.conn.id);
    }
}

/// Hands out [`Busy`] guards for one connection's requests.
#[derive(Clone)]
pub struct BusyMarker {
    conn: Arc<Conn>,
}

/// A request being handled; the connection is busy until it is dropped.
pub struct Busy {
    conn: Arc<Conn>,
}

impl BusyMarker {
    /// The connection handles a request until the guard is dropped.
    pub fn enter(&self) -> Busy {
        self.conn.busy.fetch_add(1, Ordering::AcqRel);
        Busy {
            conn: self.conn.clone(),
        }
    }

    /// The connection handles a request until it closes: for a listener
    /// that serves one request per connection, so that its answer is not
    /// cut off while being written.
    pub fn hold(&self) {
        self.conn.busy.fetch_add(1, Ordering::AcqRel);
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if self.conn.busy.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Between requests only once the server reads again and finds
            // nothing.
            self.conn.state.store(ANSWERED, Ordering::Release);
        }
    }
}

/// A served connection's stream, noting whether its client is sending.
pub struct Watched {
    io: TcpStream,
    conn: Arc<Conn>,
}

impl Watched {
    /// Whether the socket holds no byte to read, by the kernel's word (a
    /// read that is not ready only says the reactor has not looked yet).
    fn holds_nothing(&self) -> bool {
        let mut byte = [MaybeUninit::uninit()];
        matches!(
            SockRef::from(&self.io).peek(&mut byte),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock
        )
    }

    /// A read was not ready: if the socket really holds nothing, the
    /// connection is between requests (idle or stalled), and a client
    /// waiting for a slot is told.
    fn found_nothing(&self) {
        let state = &self.conn.state;
        let now = match state.load(Ordering::Acquire) {
            ANSWERED => IDLE,
            HEARD => STALLED,
            _ => return,
        };
        if self.holds_nothing() {
            state.store(now, Ordering::Release);
            self.conn.idle.notify_one();
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            let read = (buf.filled().len() - before) as u64;
            self.conn.received.fetch_add(read, Ordering::AcqRel);
            self.conn.state.store(HEARD, Ordering::Release);
        } else if polled.is_pending() {
            self.found_nothing();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests;
