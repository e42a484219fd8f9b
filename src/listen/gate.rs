//! The connections of one listener, and which to close when a new one
//! needs room. A listener serves at most its limit at once; when it is
//! full and another client connects, the gate closes the connection least
//! likely to be anybody's work: first one that has sent nothing yet (read
//! and found empty, not merely accepted a moment ago, whose request may be
//! waiting to be read), then one between requests (a keep-alive left idle,
//! or a head still arriving and so not yet authenticated), oldest first. A
//! connection whose request is being handled is never closed for room. A flood of clients that
//! connect and say nothing therefore costs a real client one accept, not a
//! wait in the backlog until the flood's headers time out.

use std::collections::BTreeMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// The served connections of one listener. Cheap to clone.
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

struct Inner {
    slots: Arc<Semaphore>,
    open: Mutex<BTreeMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
    /// A connection became one that may be closed for room.
    idle: Arc<Notify>,
}

/// What a connection's client has sent, as far as the gate knows.
const FRESH: u8 = 0;
/// Read, and nothing was there.
const SILENT: u8 = 1;
/// At least one byte arrived.
const HEARD: u8 = 2;

/// One served connection as the gate sees it.
struct Conn {
    id: u64,
    /// [`FRESH`], [`SILENT`] or [`HEARD`].
    heard: AtomicU8,
    /// Requests of this connection being handled.
    busy: AtomicUsize,
    /// Cancelled when the gate closes it for room.
    shed: CancellationToken,
    /// The gate's [`Inner::idle`].
    idle: Arc<Notify>,
}

/// A connection's place in the gate: its slot, released (and the
/// connection forgotten) when dropped.
pub struct Admitted {
    conn: Arc<Conn>,
    gate: Gate,
    _slot: OwnedSemaphorePermit,
}

/// A request being handled; the connection is busy until it is dropped.
pub struct Busy {
    conn: Arc<Conn>,
}

impl Gate {
    /// A gate of `limit` connections.
    pub fn new(limit: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                slots: Arc::new(Semaphore::new(limit)),
                open: Mutex::default(),
                next_id: AtomicU64::new(0),
                idle: Arc::new(Notify::new()),
            }),
        }
    }

    fn open(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<Conn>>> {
        self.inner.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a connection just accepted: free at once, or made by
    /// closing another ([`Self::shed_one`]), or, when every connection is
    /// handling a request, the first that frees. `None` once `stop` is
    /// cancelled. The second value says whether a connection was closed.
    pub async fn admit(&self, stop: &CancellationToken) -> Option<(Admitted, bool)> {
        let mut shed_any = false;
        loop {
            let slot = match self.inner.slots.clone().try_acquire_owned() {
                Ok(slot) => slot,
                Err(_) => {
                    let notified = self.inner.idle.notified();
                    let mut notified = std::pin::pin!(notified);
                    notified.as_mut().enable();
                    let shed = self.shed_one();
                    shed_any |= shed;
                    tokio::select! {
                        biased;
                        () = stop.cancelled() => return None,
                        slot = self.inner.slots.clone().acquire_owned() => slot.ok()?,
                        () = notified, if !shed => continue,
                    }
                }
            };
            return Some((self.register(slot), shed_any));
        }
    }

    fn register(&self, slot: OwnedSemaphorePermit) -> Admitted {
        let conn = Arc::new(Conn {
            id: self.inner.next_id.fetch_add(1, Ordering::Relaxed),
            heard: AtomicU8::new(FRESH),
            busy: AtomicUsize::new(0),
            shed: CancellationToken::new(),
            idle: self.inner.idle.clone(),
        });
        self.open().insert(conn.id, conn.clone());
        Admitted {
            conn,
            gate: self.clone(),
            _slot: slot,
        }
    }

    /// Closes the open connection least likely to be a client's work:
    /// the oldest that has sent nothing, else the oldest between
    /// requests. False when every connection is handling a request or has
    /// not been read yet.
    fn shed_one(&self) -> bool {
        let open = self.open();
        let idle = |c: &&Arc<Conn>| {
            c.busy.load(Ordering::Acquire) == 0
                && c.heard.load(Ordering::Acquire) != FRESH
                && !c.shed.is_cancelled()
        };
        let silent = open
            .values()
            .filter(idle)
            .find(|c| c.heard.load(Ordering::Acquire) == SILENT);
        match silent.or_else(|| open.values().find(idle)) {
            Some(conn) => {
                conn.shed.cancel();
                true
            }
            None => false,
        }
    }

    /// How many connections are open.
    pub fn len(&self) -> usize {
        self.open().len()
    }

    /// Whether no connection is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Admitted {
    /// `io` watched for the client's first byte.
    pub fn watch<S>(&self, io: S) -> Watched<S> {
        Watched {
            io,
            conn: self.conn.clone(),
        }
    }

    /// Cancelled when the gate closes this connection for room.
    pub fn shed(&self) -> CancellationToken {
        self.conn.shed.clone()
    }

    /// Marks a request of this connection as being handled until the
    /// returned guard is dropped.
    pub fn busy(&self) -> BusyMarker {
        BusyMarker {
            conn: self.conn.clone(),
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.gate.open().remove(&self.conn.id);
    }
}

/// Hands out [`Busy`] guards for one connection's requests.
#[derive(Clone)]
pub struct BusyMarker {
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
}

impl BusyMarker {
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
            self.conn.idle.notify_one();
        }
    }
}

/// A connection's stream, noting whether its client has sent anything.
pub struct Watched<S> {
    io: S,
    conn: Arc<Conn>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        let conn = &self.conn;
        if conn.heard.load(Ordering::Relaxed) != HEARD {
            if buf.filled().len() > before {
                conn.heard.store(HEARD, Ordering::Release);
            } else if polled.is_pending() && conn.heard.swap(SILENT, Ordering::AcqRel) == FRESH {
                conn.idle.notify_one();
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
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
mod tests {
    use super::*;

    fn heard(admitted: &Admitted) {
        admitted.conn.heard.store(HEARD, Ordering::Release);
    }

    fn read_nothing(admitted: &Admitted) {
        admitted.conn.heard.store(SILENT, Ordering::Release);
    }

    #[tokio::test]
    async fn room_is_made_from_the_silent_then_the_idle_never_the_busy() {
        let gate = Gate::new(3);
        let stop = CancellationToken::new();
        let admit = async || gate.admit(&stop).await.map(|(a, _)| a);
        let (Some(busy), Some(idle), Some(silent)) = (admit().await, admit().await, admit().await)
        else {
            panic!("three free slots");
        };
        heard(&busy);
        heard(&idle);
        read_nothing(&silent);
        let _request = busy.busy().enter();

        // Full: the one that said nothing goes first, though it is the newest.
        let (fourth, shed) = tokio::time::timeout(Duration::from_secs(1), async {
            let admitting = gate.admit(&stop);
            let mut admitting = std::pin::pin!(admitting);
            let closed = silent.shed();
            tokio::select! {
                got = admitting.as_mut() => panic!("admitted before any slot was freed: {}", got.is_some()),
                () = closed.cancelled() => {}
            }
            drop(silent);
            admitting.await
        })
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("a slot after the silent connection closed"));
        assert!(shed);

        // Then the one between requests; neither the busy one nor the one
        // not read yet (its request may be waiting) is ever chosen.
        assert!(gate.shed_one());
        assert!(idle.shed().is_cancelled());
        assert!(!busy.shed().is_cancelled() && !fourth.shed().is_cancelled());
        drop(idle);
        assert!(!gate.shed_one(), "one busy, one not read yet");
        assert_eq!(gate.len(), 2);
        read_nothing(&fourth);
        assert!(gate.shed_one(), "read, and nothing was there");
        assert!(fourth.shed().is_cancelled());
    }

    #[tokio::test]
    async fn a_full_gate_of_busy_connections_admits_when_one_turns_idle() {
        let gate = Gate::new(1);
        let stop = CancellationToken::new();
        let (only, _) = gate
            .admit(&stop)
            .await
            .unwrap_or_else(|| panic!("a free slot"));
        heard(&only);
        let request = only.busy().enter();
        let gate2 = gate.clone();
        let stop2 = stop.clone();
        let waiting = tokio::spawn(async move { gate2.admit(&stop2).await.map(|(_, shed)| shed) });
        tokio::task::yield_now().await;
        assert!(
            !waiting.is_finished(),
            "no room while the only connection is busy"
        );
        drop(request);
        let shed = tokio::time::timeout(Duration::from_secs(1), async {
            only.shed().cancelled().await;
            drop(only);
            waiting.await
        })
        .await;
        assert!(matches!(shed, Ok(Ok(Some(true)))), "{shed:?}");
        stop.cancel();
    }

    use std::time::Duration;
}
