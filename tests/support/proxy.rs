//! TCP faults: `FaultProxy`, an in-process proxy in front of a broker that
//! can stall, cut and refuse connections, and `BlackHole`, a listener that
//! accepts connections and never answers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

struct ProxyShared {
    upstream: SocketAddr,
    stalled: watch::Sender<Stall>,
    /// Reads a stall has held.
    held: AtomicU64,
    refuse: AtomicBool,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Arc<Kill>>>,
}

/// How a proxied connection is told to die. `killed` is checked before held
/// bytes are released, so a cut connection never forwards what it held.
#[derive(Default)]
struct Kill {
    notify: Notify,
    killed: AtomicBool,
}

impl ProxyShared {
    fn kill_all(&self) -> usize {
        let kills: Vec<Arc<Kill>> = self
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for k in &kills {
            k.killed.store(true, Ordering::SeqCst);
            k.notify.notify_one();
        }
        kills.len()
    }
}

/// Removes a proxied connection from the registry when its task ends or is dropped.
struct ConnGuard {
    shared: Arc<ProxyShared>,
    id: u64,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.shared
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// An in-process TCP proxy in front of the broker that can stall, cut and refuse connections.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<ProxyShared>,
    accept_task: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on 127.0.0.1:<ephemeral> forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fault proxy");
        let addr = listener.local_addr().expect("fault proxy local addr");
        let (stalled, _) = watch::channel(Stall::None);
        let shared = Arc::new(ProxyShared {
            upstream,
            stalled,
            held: AtomicU64::new(0),
            refuse: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
        });
        let accept_task = tokio::spawn(accept_loop(listener, shared.clone()));
        FaultProxy {
            addr,
            shared,
            accept_task,
        }
    }

    /// The proxy's listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's listening port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f`: the broker, through the proxy.
    pub fn amqp_url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port())
    }

    /// Holds all bytes in both directions from now on (connections stay open, peers see silence).
    pub fn stall(&self) {
        self.shared.stalled.send_replace(Stall::Both);
    }

    /// Releases held bytes and resumes forwarding.
    pub fn resume(&self) {
        self.shared.stalled.send_replace(Stall::None);
    }

    /// Holds only what the broker sends (confirms, returns, closes); what the
    /// client sends still reaches the broker. `resume()` releases it.
    pub fn stall_downstream(&self) {
        self.shared.stalled.send_replace(Stall::Downstream);
    }

    /// Holds only what the client sends (its publishes never reach the
    /// broker); what the broker sends (a close) still reaches the client.
    /// `resume()` releases it.
    pub fn stall_upstream(&self) {
        self.shared.stalled.send_replace(Stall::Upstream);
    }

    /// Reads held by a stall so far (a read is counted when it is held).
    pub fn held(&self) -> u64 {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// Whether the proxy is currently stalled, in either direction.
    pub fn is_stalled(&self) -> bool {
        *self.shared.stalled.borrow() != Stall::None
    }

    /// Abruptly closes (RST) both sides of every current connection and returns how many; new ones are still accepted.
    pub fn cut(&self) -> usize {
        self.shared.kill_all()
    }

    /// While `on`, new connections are accepted and immediately closed.
    pub fn refuse(&self, on: bool) {
        self.shared.refuse.store(on, Ordering::SeqCst);
    }

    /// Number of live proxied connections.
    pub fn connections(&self) -> usize {
        self.shared
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept_task.abort();
        self.shared.kill_all();
        // Release anything held so no task waits on a stall forever.
        self.shared.stalled.send_replace(Stall::None);
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<ProxyShared>) {
    loop {
        let (client, _) = match listener.accept().await {
            Ok(pair) => pair,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if shared.refuse.load(Ordering::SeqCst) {
            drop(client);
            continue;
        }
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        let kill = Arc::new(Kill::default());
        shared
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, kill.clone());
        let guard = ConnGuard {
            shared: shared.clone(),
            id,
        };
        tokio::spawn(proxy_connection(client, shared.clone(), kill, guard));
    }
}

async fn proxy_connection(
    mut client: TcpStream,
    shared: Arc<ProxyShared>,
    kill: Arc<Kill>,
    _guard: ConnGuard,
) {
    let _ = client.set_nodelay(true);
    let mut upstream = tokio::select! {
        res = TcpStream::connect(shared.upstream) => match res {
            Ok(s) => s,
            Err(_) => return,
        },
        _ = kill.notify.notified() => {
            let _ = client.set_zero_linger();
            return;
        }
    };
    let _ = upstream.set_nodelay(true);
    let killed = {
        let (cr, cw) = client.split();
        let (ur, uw) = upstream.split();
        tokio::select! {
            _ = pump(cr, uw, Stall::Upstream, &shared, &kill.killed) => false,
            _ = pump(ur, cw, Stall::Downstream, &shared, &kill.killed) => false,
            _ = kill.notify.notified() => true,
        }
    };
    if killed {
        // Abortive close: the peers see a reset, not an orderly shutdown.
        let _ = client.set_zero_linger();
        let _ = upstream.set_zero_linger();
    }
}

/// Which directions a stalled proxy holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stall {
    None,
    Both,
    Upstream,
    Downstream,
}

/// Copies bytes from `r` to `w`, holding them while the proxy is stalled in
/// this pump's direction (`Stall::Upstream` for client to broker,
/// `Stall::Downstream` for broker to client; `Stall::Both` holds either).
async fn pump<R, W>(mut r: R, mut w: W, direction: Stall, shared: &ProxyShared, killed: &AtomicBool)
where
    R: AsyncReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    let mut stalled = shared.stalled.subscribe();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let holds = |s: &Stall| *s == Stall::Both || *s == direction;
        if holds(&stalled.borrow()) {
            shared.held.fetch_add(1, Ordering::SeqCst);
        }
        if stalled.wait_for(|s| !holds(s)).await.is_err() || killed.load(Ordering::SeqCst) {
            break;
        }
        if w.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = w.shutdown().await;
}

/// A TCP listener that accepts connections, reads whatever they send and
/// never writes a byte back: a broker that is reachable but never answers
/// (unlike a refused port, which fails a connect at once).
pub struct BlackHole {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    accept_task: JoinHandle<()>,
}

impl BlackHole {
    /// Listens on 127.0.0.1:<ephemeral>.
    pub async fn start() -> BlackHole {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind black hole");
        let addr = listener.local_addr().expect("black hole local addr");
        let accepted = Arc::new(AtomicU64::new(0));
        let counter = accepted.clone();
        let accept_task = tokio::spawn(async move {
            // Dropped with the accept task, which aborts every reader.
            let mut readers = tokio::task::JoinSet::new();
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                counter.fetch_add(1, Ordering::SeqCst);
                readers.spawn(async move {
                    let mut buf = [0u8; 4096];
                    while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
                });
            }
        });
        BlackHole {
            addr,
            accepted,
            accept_task,
        }
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f`: a broker URL nothing answers on.
    pub fn amqp_url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.addr.port())
    }

    /// How many connections it has accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}
