use super::*;
use std::sync::atomic::AtomicUsize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const SOON: Duration = Duration::from_secs(1);

/// A loopback TCP connection: the server's end, accepted, and the client's.
async fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
    let client = client.unwrap_or_else(|e| panic!("connect: {e}"));
    let (server, _) = accepted.unwrap_or_else(|e| panic!("accept: {e}"));
    (server, client)
}

/// A gate of `limit` slots and a lobby of `lobby`, and how many
/// connections it has closed for room.
fn gate(limit: usize, lobby: usize) -> (Gate, Arc<AtomicUsize>) {
    let made_room = Arc::new(AtomicUsize::new(0));
    let counted = made_room.clone();
    let gate = Gate::with_lobby(limit, lobby, move || {
        counted.fetch_add(1, Ordering::Relaxed);
    });
    (gate, made_room)
}

async fn arrive(gate: &Gate) -> (Arrived, TcpStream) {
    let (server, client) = pair().await;
    let stop = CancellationToken::new();
    let arrived = tokio::time::timeout(SOON, gate.arrive(server, &stop));
    let Ok(Some(arrived)) = arrived.await else {
        panic!("the lobby takes it");
    };
    (arrived, client)
}

/// A served connection whose first byte the server has read.
struct Client {
    served: Served,
    client: TcpStream,
}

async fn served(gate: &Gate) -> Client {
    let (arrived, mut client) = arrive(gate).await;
    assert!(client.write_all(b"G").await.is_ok());
    let stop = CancellationToken::new();
    let served = tokio::time::timeout(SOON, arrived.first_byte(SOON, &stop));
    let Ok(Some(mut served)) = served.await else {
        panic!("a slot for a client that sent a byte");
    };
    let mut byte = [0u8; 1];
    assert!(matches!(served.stream.read(&mut byte).await, Ok(1)));
    Client { served, client }
}

impl Client {
    /// The server reads, as hyper would, and finds nothing.
    async fn read_nothing(&mut self) {
        let mut byte = [0u8; 1];
        let read =
            tokio::time::timeout(Duration::from_millis(5), self.served.stream.read(&mut byte));
        assert!(read.await.is_err(), "nothing was sent");
    }

    fn closed(&self) -> bool {
        self.served.admitted.shed().is_cancelled()
    }
}

#[tokio::test]
async fn silent_connections_hold_no_slot_and_the_longest_waiting_makes_room() {
    let (gate, made_room) = gate(1, 2);
    let (first, _c1) = arrive(&gate).await;
    let (second, mut c2) = arrive(&gate).await;
    assert_eq!(made_room.load(Ordering::Relaxed), 0);
    let (_third, _c3) = arrive(&gate).await;
    assert_eq!(
        made_room.load(Ordering::Relaxed),
        1,
        "a full lobby closes one for the newcomer"
    );
    let stop = CancellationToken::new();
    let first = tokio::time::timeout(SOON, first.first_byte(SOON, &stop)).await;
    assert!(matches!(first, Ok(None)), "the longest waiting was closed");
    // The second speaks and takes the one slot, which no silent one held.
    assert!(c2.write_all(b"G").await.is_ok());
    let second = tokio::time::timeout(SOON, second.first_byte(SOON, &stop)).await;
    assert!(matches!(second, Ok(Some(_))));
    assert_eq!(gate.len(), 1);
}

#[tokio::test]
async fn a_client_that_sent_its_first_byte_is_not_closed_for_room_in_the_lobby() {
    let (gate, _) = gate(1, 1);
    let busy = served(&gate).await;
    let _request = busy.served.admitted.busy().enter();
    let (waiting, mut client) = arrive(&gate).await;
    assert!(client.write_all(b"G").await.is_ok());
    let stop = CancellationToken::new();
    let waiting = tokio::spawn(async move { waiting.first_byte(SOON * 5, &stop).await.is_some() });
    // Heard, it waits for the slot; the next arrival waits for the lobby.
    let stop = CancellationToken::new();
    let (server, _c) = pair().await;
    let next = tokio::time::timeout(Duration::from_millis(50), gate.arrive(server, &stop)).await;
    assert!(
        next.is_err(),
        "the lobby holds a client that spoke: no room"
    );
    assert!(!waiting.is_finished());
    drop((_request, busy));
    assert!(matches!(
        tokio::time::timeout(SOON, waiting).await,
        Ok(Ok(true))
    ));
}

#[tokio::test]
async fn room_is_made_from_the_idle_and_the_stalled_never_the_busy_or_unread() {
    let (gate, made_room) = gate(10, 10);
    let heard = served(&gate).await;
    let mut stalled = served(&gate).await;
    let busy = served(&gate).await;
    let answered = served(&gate).await;
    let mut idle = served(&gate).await;
    let _request = busy.served.admitted.busy().enter();
    drop(answered.served.admitted.busy().enter());
    drop(idle.served.admitted.busy().enter());
    idle.read_nothing().await;
    stalled.read_nothing().await;

    // Oldest first: the head that stopped half-way, then the keep-alive.
    assert!(gate.shed_one() && stalled.closed());
    assert!(gate.shed_one() && idle.closed());
    assert_eq!(made_room.load(Ordering::Relaxed), 2, "each closure is told");
    // Never one whose bytes just came (its handler may be about to start),
    // one whose answer may still be going out, or one handling a request.
    assert!(!gate.shed_one());
    assert!([&heard, &answered, &busy].iter().all(|c| !c.closed()));
    drop((stalled, idle));
    assert_eq!(gate.len(), 3);
}

#[tokio::test]
async fn bytes_waiting_in_the_socket_are_not_silence_though_a_read_was_not_ready() {
    let (gate, _) = gate(2, 2);
    let mut waiting = served(&gate).await;
    drop(waiting.served.admitted.busy().enter());
    assert!(
        waiting
            .client
            .write_all(b"GET / HTTP/1.1\r\n")
            .await
            .is_ok()
    );
    let mut byte = [0u8; 1];
    let arrived = tokio::time::timeout(SOON, waiting.served.stream.io.peek(&mut byte)).await;
    assert!(matches!(arrived, Ok(Ok(1))), "the bytes reach the server");
    // What a read does before the reactor has seen them: not ready.
    waiting.served.stream.found_nothing();
    assert!(!gate.shed_one(), "bytes wait in the socket: not idle");
    let quiet = served(&gate).await;
    drop(quiet.served.admitted.busy().enter());
    quiet.served.stream.found_nothing();
    assert!(gate.shed_one() && quiet.closed() && !waiting.closed());
}

#[tokio::test]
async fn a_client_waiting_for_a_slot_gets_one_when_a_connection_turns_idle() {
    let (gate, made_room) = gate(1, 4);
    let mut only = served(&gate).await;
    let request = only.served.admitted.busy().enter();
    let (waiting, mut client) = arrive(&gate).await;
    assert!(client.write_all(b"G").await.is_ok());
    let stop = CancellationToken::new();
    let waiting = tokio::spawn(async move { waiting.first_byte(SOON * 5, &stop).await.is_some() });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        !waiting.is_finished(),
        "no slot while the only connection is busy"
    );
    drop(request);
    tokio::task::yield_now().await;
    assert!(
        !waiting.is_finished(),
        "nor while its answer may be going out"
    );
    only.read_nothing().await;
    let shed = only.served.admitted.shed();
    assert!(tokio::time::timeout(SOON, shed.cancelled()).await.is_ok());
    drop(only);
    assert!(matches!(
        tokio::time::timeout(SOON, waiting).await,
        Ok(Ok(true))
    ));
    assert_eq!(made_room.load(Ordering::Relaxed), 1, "room was made for it");
}
