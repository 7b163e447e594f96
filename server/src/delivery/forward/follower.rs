//! The follower's side: one connection to the leader, kept open by a task of
//! its own, over which deliveries are offered and their answers awaited. Apart
//! from the leader's side because a pod runs this one whenever it names a
//! leader, and the other only when it listens for followers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{OnceCell, mpsc, oneshot};

use super::discovery::{self, Addresses};
use super::frames::{Outcome, decode_answer, encode_request, read_frame, write_frames};
use super::handshake;
use super::{CONNECT_TIMEOUT, RETRY_AFTER, configure};
use crate::store::{StoreError, StoreResult};
use mailcluster_model::{DeliveredTo, NewDelivery};

/// The longest a sent delivery may wait for its answer: the SMTP client's own
/// DATA timeout is minutes; a leader that takes this long is failing.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a leader found draining is passed over: longer than its drain
/// waits for followers to go quiet, so that it can stop.
const AVOID_DRAINING: Duration = Duration::from_secs(30);

/// What became of a delivery offered to the leader.
pub enum Forwarded {
    /// The leader answered (or the delivery was sent and its fate is unknown:
    /// `Unavailable`).
    Answered(StoreResult<Vec<DeliveredTo>>),
    /// Never sent: commit it here.
    NotSent(Box<NewDelivery>),
}

/// The follower's side: one connection to the leader, opened by a task of its
/// own (at start, and again after it breaks), never on a delivery's path.
pub struct Forwarder {
    leader: String,
    key: Arc<[u8]>,
    instance: Arc<str>,
    state: Arc<Mutex<State>>,
    /// The addresses of the leader's name, ascending, as a task looks them up
    /// every few seconds (never on a delivery's path but the first).
    addrs: Arc<OnceCell<Addresses>>,
    /// Deliveries sent to the leader / committed here (leader unreachable, or
    /// this pod is the leader).
    forwarded: prometheus::IntCounter,
    local: prometheus::IntCounter,
}

#[derive(Default)]
struct State {
    /// Addresses that declined deliveries (draining), and until when to pass
    /// them over.
    draining: HashMap<SocketAddr, Instant>,
    /// The leader chosen last (to log a change once).
    target: Option<SocketAddr>,
    /// This pod's own address, once a greeting showed it.
    own: Option<SocketAddr>,
    conn: Option<Arc<Conn>>,
    /// A task is connecting to the leader.
    connecting: bool,
    retry_at: Option<Instant>,
}

/// Where a delivery's answer goes.
type Answer = oneshot::Sender<Outcome>;

struct Conn {
    addr: SocketAddr,
    /// Taken when the connection is retired: the writer then ends once the
    /// queue is drained, and the leader answers what it has before closing.
    frames: Mutex<Option<mpsc::UnboundedSender<Bytes>>>,
    /// Answers awaited, by request id; `None` once the connection is closed.
    pending: Mutex<Option<HashMap<u64, Answer>>>,
    next_id: AtomicU64,
    /// The leader declined a delivery: it is draining; look for another.
    declined: std::sync::atomic::AtomicBool,
}

impl Conn {
    fn close(&self, why: &str) {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner()).take();
        for (_, answer) in pending.into_iter().flatten() {
            let _ = answer
                .send(Outcome::Done(Err(StoreError::Unavailable(format!("group-commit leader: {why}")))));
        }
    }
    fn is_closed(&self) -> bool {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).is_none()
    }
    fn retire(&self) {
        self.frames.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
    fn send(&self, frame: Bytes) -> bool {
        self.frames.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|f| f.send(frame).is_ok())
    }
}

impl Forwarder {
    pub fn new(leader: String, key: Vec<u8>, instance: String) -> Self {
        let counter = |result: &str| {
            prometheus::IntCounter::with_opts(
                prometheus::Opts::new(
                    "mail_group_commit_forwarded_total",
                    "Deliveries offered to the group-commit leader, by where they were committed",
                )
                .const_label("committed", result),
            )
            .expect("valid metric")
        };
        Forwarder {
            leader,
            key: key.into(),
            instance: instance.into(),
            state: Arc::new(Mutex::new(State::default())),
            addrs: Arc::new(OnceCell::new()),
            forwarded: counter("leader"),
            local: counter("here"),
        }
    }

    pub fn register_metrics(&self, registry: &prometheus::Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.forwarded.clone()))?;
        registry.register(Box::new(self.local.clone()))
    }

    /// Looks the leader up and starts connecting to it, so that the first
    /// deliveries find the connection open (`serve`, at start).
    pub async fn start(&self) {
        let _ = self.connection().await;
    }

    pub async fn deliver(&self, delivery: NewDelivery) -> Forwarded {
        let Some(conn) = self.connection().await else {
            self.local.inc();
            return Forwarded::NotSent(Box::new(delivery));
        };
        match self.send(&conn, delivery).await {
            Forwarded::NotSent(delivery) => {
                self.local.inc();
                Forwarded::NotSent(delivery)
            }
            answered => {
                self.forwarded.inc();
                answered
            }
        }
    }

    async fn send(&self, conn: &Conn, delivery: NewDelivery) -> Forwarded {
        let (answer, answered) = oneshot::channel();
        let id = conn.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut pending = conn.pending.lock().unwrap_or_else(|p| p.into_inner());
            let Some(pending) = pending.as_mut() else { return Forwarded::NotSent(Box::new(delivery)) };
            pending.insert(id, answer);
        }
        let frame = match encode_request(id, &delivery) {
            Ok(frame) => frame,
            Err(e) => {
                conn.pending.lock().unwrap_or_else(|p| p.into_inner()).as_mut().map(|p| p.remove(&id));
                tracing::warn!(error = %e, "cannot encode a delivery for the group-commit leader");
                return Forwarded::NotSent(Box::new(delivery));
            }
        };
        if !conn.send(frame) {
            // The writer is gone (or the connection retired): this delivery was
            // never written, whatever `close` may have answered its entry.
            conn.pending.lock().unwrap_or_else(|p| p.into_inner()).as_mut().map(|p| p.remove(&id));
            return Forwarded::NotSent(Box::new(delivery));
        }
        match tokio::time::timeout(ANSWER_TIMEOUT, answered).await {
            Ok(Ok(Outcome::Done(result))) => Forwarded::Answered(result),
            Ok(Ok(Outcome::Declined)) => {
                conn.declined.store(true, Ordering::Relaxed);
                Forwarded::NotSent(Box::new(delivery))
            }
            Ok(Ok(Outcome::Busy)) => Forwarded::NotSent(Box::new(delivery)),
            Ok(Err(_)) => {
                Forwarded::Answered(Err(StoreError::Unavailable("group-commit leader: no answer".into())))
            }
            Err(_) => {
                conn.pending.lock().unwrap_or_else(|p| p.into_inner()).as_mut().map(|p| p.remove(&id));
                Forwarded::Answered(Err(StoreError::Unavailable(
                    "group-commit leader: answer timed out".into(),
                )))
            }
        }
    }

    /// The open connection to the leader; None while there is none (the
    /// delivery is then committed here), or the leader is this pod. A task of
    /// its own connects, so that a leader that does not answer (its node gone,
    /// packets dropped) holds up no delivery.
    async fn connection(&self) -> Option<Arc<Conn>> {
        let addrs = discovery::addresses(&self.addrs, &self.leader).await;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        // A leader that declined (draining) is passed over until it is gone
        // from the name; meanwhile the next address leads, as it will then.
        if let Some(conn) = state.conn.clone().filter(|c| c.declined.load(Ordering::Relaxed)) {
            tracing::info!(leader = %conn.addr, "the group-commit leader is draining");
            state.draining.insert(conn.addr, now + AVOID_DRAINING);
            conn.retire();
            state.conn = None;
        }
        state.draining.retain(|_, until| now < *until);
        let target = addrs.borrow().iter().copied().find(|a| !state.draining.contains_key(a));
        if target != state.target {
            match target {
                Some(addr) => tracing::info!(leader = %self.leader, %addr, "group-commit leader"),
                None => tracing::info!(leader = %self.leader, "no group-commit leader; committing here"),
            }
            state.target = target;
        }
        let target = target?;
        if state.own == Some(target) {
            return None;
        }
        if let Some(conn) = state.conn.clone() {
            if conn.addr == target && !conn.is_closed() {
                return Some(conn);
            }
            // The leader moved (or the connection broke): answers still owed on
            // the old connection arrive; new deliveries go to the new leader.
            conn.retire();
            state.conn = None;
        }
        if state.connecting || state.retry_at.is_some_and(|at| now < at) {
            return None;
        }
        state.connecting = true;
        let (shared, key, instance) = (self.state.clone(), self.key.clone(), self.instance.clone());
        tokio::spawn(async move {
            let result = tokio::time::timeout(CONNECT_TIMEOUT, connect(target, &key, &instance)).await;
            let mut state = shared.lock().unwrap_or_else(|p| p.into_inner());
            state.connecting = false;
            match result {
                Ok(Ok(Some(conn))) => {
                    state.retry_at = None;
                    if state.target == Some(target) {
                        tracing::info!(%target, "connected to the group-commit leader");
                        state.conn = Some(conn);
                    } else {
                        conn.retire();
                    }
                }
                Ok(Ok(None)) => {
                    tracing::info!(%target, "this pod is the group-commit leader");
                    state.own = Some(target);
                }
                failed => {
                    let why = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => "connect timed out".to_string(),
                    };
                    tracing::warn!(%target, error = %why, "group-commit leader unreachable; committing here");
                    state.retry_at = Some(Instant::now() + RETRY_AFTER);
                }
            }
        });
        None
    }
}

/// Connects and proves the key; None when the greeting shows this very process.
async fn connect(addr: SocketAddr, key: &[u8], instance: &str) -> std::io::Result<Option<Arc<Conn>>> {
    let stream = TcpStream::connect(addr).await?;
    configure(&stream)?;
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    if !handshake::as_follower(&mut read, &mut write, key, instance).await? {
        return Ok(None);
    }
    let (frames, queue) = mpsc::unbounded_channel();
    let conn = Arc::new(Conn {
        addr,
        frames: Mutex::new(Some(frames)),
        pending: Mutex::new(Some(HashMap::new())),
        next_id: AtomicU64::new(1),
        declined: std::sync::atomic::AtomicBool::new(false),
    });
    let writing = conn.clone();
    tokio::spawn(async move {
        if let Err(e) = write_frames(queue, BufWriter::new(write)).await {
            writing.close(&e.to_string());
        }
    });
    tokio::spawn(read_answers(read, conn.clone()));
    Ok(Some(conn))
}

async fn read_answers<R: AsyncRead + Unpin>(mut read: R, conn: Arc<Conn>) {
    let why = loop {
        let frame = match read_frame(&mut read, 1 << 20).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break "connection closed".to_string(),
            Err(e) => break e.to_string(),
        };
        match decode_answer(frame) {
            Ok((id, result)) => {
                let answer = conn
                    .pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_mut()
                    .and_then(|p| p.remove(&id));
                if let Some(answer) = answer {
                    let _ = answer.send(result);
                }
            }
            Err(e) => break e,
        }
    };
    conn.close(&why);
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::super::handshake::{GREETING, Role, proof_hex, proven};
    use super::super::leader::{Followers, accept};
    use super::super::test_delivery as delivery;
    use super::*;
    use crate::delivery::Deliverer;
    use crate::net::Shutdown;

    /// A leader over an embedded store, and a raw connection to it.
    async fn leader(key: &[u8]) -> (SocketAddr, tempfile::TempDir, tokio::sync::watch::Sender<bool>) {
        let (addr, dir, drain, _) = leader_with(key, crate::delivery::DeliveryOptions::default()).await;
        (addr, dir, drain)
    }

    async fn leader_with(
        key: &[u8],
        options: crate::delivery::DeliveryOptions,
    ) -> (SocketAddr, tempfile::TempDir, tokio::sync::watch::Sender<bool>, Arc<Followers>) {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::open(None, dir.path(), 2, Duration::from_secs(5)).await.unwrap();
        store.migrate().await.unwrap();
        let deliverer = Arc::new(Deliverer::with_options(store, options));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (drain, draining) = Shutdown::new();
        let followers = Arc::new(Followers::default());
        tokio::spawn(accept(
            listener,
            deliverer,
            key.to_vec(),
            "leader".into(),
            1024,
            draining,
            followers.clone(),
        ));
        (addr, dir, drain, followers)
    }

    /// Waits for the forwarder's connecting task to be done.
    async fn connected(forwarder: &Forwarder) {
        for _ in 0..500 {
            if forwarder.connection().await.is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never connected to the leader");
    }

    /// The follower's side of the handshake by hand: the leader's answer line,
    /// with its proof checked against `key` (`OK` when it holds).
    async fn greet(addr: SocketAddr, key: &[u8]) -> (BufReader<TcpStream>, String) {
        let mut stream = BufReader::new(TcpStream::connect(addr).await.unwrap());
        let mut greeting = String::new();
        stream.read_line(&mut greeting).await.unwrap();
        let leader_nonce = greeting.trim_end().rsplit(' ').next().unwrap().to_string();
        let mac = proof_hex(key, Role::Follower, &leader_nonce, "f0f0").unwrap();
        stream.get_mut().write_all(format!("follower f0f0 {mac}\n").as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_line(&mut answer).await.unwrap();
        match answer.trim_end().split_once(' ') {
            Some(("OK", leader)) if proven(key, Role::Leader, &leader_nonce, "f0f0", leader) => {
                (stream, "OK".into())
            }
            _ => (stream, answer),
        }
    }

    /// A process on the leader's address that does not hold the key: it greets
    /// as a leader, reads the follower's proof and answers `answer(that line)`,
    /// then reports every byte it receives afterwards.
    async fn fake_leader(answer: fn(&str) -> String) -> (SocketAddr, tokio::task::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut received = Vec::new();
            // Every connection the follower makes, until it stops trying.
            while let Ok(Ok((stream, _))) =
                tokio::time::timeout(Duration::from_secs(3), listener.accept()).await
            {
                let mut stream = BufReader::new(stream);
                stream
                    .get_mut()
                    .write_all(format!("{GREETING} impostor 00112233\n").as_bytes())
                    .await
                    .unwrap();
                let mut line = String::new();
                stream.read_line(&mut line).await.unwrap();
                stream.get_mut().write_all(answer(&line).as_bytes()).await.unwrap();
                let _ =
                    tokio::time::timeout(Duration::from_millis(500), stream.read_to_end(&mut received)).await;
            }
            received
        });
        (addr, task)
    }

    #[tokio::test]
    async fn a_follower_refuses_a_leader_that_does_not_prove_the_key() {
        // Says yes to anything; or sends the follower's own proof back.
        let says_ok: fn(&str) -> String = |_| "OK\n".into();
        let reflects: fn(&str) -> String =
            |line| format!("OK {}\n", line.trim_end().rsplit(' ').next().unwrap_or(""));
        for (what, answer) in [("a bare OK", says_ok), ("the follower's own proof", reflects)] {
            let (addr, fake) = fake_leader(answer).await;
            let refused = connect(addr, b"k", "follower").await;
            assert!(
                matches!(&refused, Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied),
                "{what}: {:?}",
                refused.as_ref().map(|c| c.is_some())
            );
            // Through the forwarder: every delivery is committed here, none sent.
            let forwarder = Forwarder::new(addr.to_string(), b"k".to_vec(), "follower".into());
            for _ in 0..20 {
                assert!(matches!(forwarder.deliver(delivery()).await, Forwarded::NotSent(_)), "{what}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!((forwarder.forwarded.get(), forwarder.local.get()), (0, 20), "{what}");
            assert!(forwarder.state.lock().unwrap().conn.is_none(), "{what}: no connection kept");
            drop(forwarder);
            assert_eq!(fake.await.unwrap(), b"", "{what}: the impostor got no delivery");
        }
    }

    #[tokio::test]
    async fn the_leader_refuses_a_wrong_key_and_closes_on_oversized_frames() {
        let (addr, _dir, drain) = leader(b"right").await;
        let (_, answer) = greet(addr, b"wrong").await;
        assert_eq!(answer, "NO\n");
        // A follower that is itself: its connect sees its own instance id.
        assert!(connect(addr, b"right", "leader").await.unwrap().is_none());
        // A frame longer than a message may be: the connection ends, nothing read.
        let (mut stream, answer) = greet(addr, b"right").await;
        assert_eq!(answer, "OK", "accepted, and the leader proved the key back");
        stream.get_mut().write_all(&u32::MAX.to_be_bytes()).await.unwrap();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "closed: {read:?}");
        // A delivery to a mailbox that does not exist is answered, not dropped.
        let forwarder = Forwarder::new(addr.to_string(), b"right".to_vec(), "follower".into());
        connected(&forwarder).await;
        match forwarder.deliver(delivery()).await {
            Forwarded::Answered(Err(_)) => {}
            Forwarded::Answered(Ok(d)) => panic!("delivered to no mailbox: {d:?}"),
            Forwarded::NotSent(_) => panic!("not sent to a reachable leader"),
        }
        assert_eq!(forwarder.forwarded.get(), 1);
        // A draining leader stores nothing more: the follower commits itself.
        drain.send_replace(true);
        assert!(matches!(forwarder.deliver(delivery()).await, Forwarded::NotSent(_)), "declined");
        assert_eq!((forwarder.forwarded.get(), forwarder.local.get()), (1, 1));
        // …and does not offer it the next one.
        assert!(matches!(forwarder.deliver(delivery()).await, Forwarded::NotSent(_)));
        assert_eq!(forwarder.local.get(), 2);
        assert!(forwarder.state.lock().unwrap().conn.is_none(), "no connection to a draining leader");
    }

    #[tokio::test]
    async fn a_leader_that_is_behind_sheds_and_the_follower_commits_those_itself() {
        // One delivery per commit and one commit at a time: a round is one
        // delivery, so whatever arrives while one is committing is shed.
        let options =
            crate::delivery::DeliveryOptions { max_batch: 1, max_concurrent: 1, max_wait: Duration::ZERO };
        let (addr, _dir, _drain, followers) = leader_with(b"k", options).await;
        let forwarder = Forwarder::new(addr.to_string(), b"k".to_vec(), "follower".into());
        connected(&forwarder).await;
        let outcomes = futures::future::join_all((0..20).map(|_| forwarder.deliver(delivery()))).await;
        let shed = outcomes.iter().filter(|o| matches!(o, Forwarded::NotSent(_))).count();
        assert!(shed > 0, "nothing shed by a leader 20 deliveries behind");
        assert!(shed < 20, "the first delivery is the leader's to commit");
        assert_eq!((forwarder.forwarded.get(), forwarder.local.get()), (20 - shed as u64, shed as u64));
        assert_eq!(followers.shed(), shed as u64, "the leader counts what it shed");
        // Unlike a draining leader, a busy one keeps the follower's next ones.
        let conn = forwarder.state.lock().unwrap().conn.clone().expect("still connected");
        assert!(!conn.declined.load(Ordering::Relaxed));
        assert!(matches!(forwarder.deliver(delivery()).await, Forwarded::Answered(_)), "offered again");
    }

    #[tokio::test]
    async fn a_leader_that_does_not_answer_holds_up_no_delivery() {
        // Connections complete in the kernel's backlog and nobody greets them:
        // a hung process, or packets answered by nobody behind it.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap();
        let forwarder = Forwarder::new(addr.to_string(), b"k".to_vec(), "follower".into());
        let started = Instant::now();
        for _ in 0..20 {
            assert!(matches!(forwarder.deliver(delivery()).await, Forwarded::NotSent(_)));
        }
        assert!(started.elapsed() < CONNECT_TIMEOUT / 2, "deliveries waited {:?}", started.elapsed());
        assert_eq!(forwarder.local.get(), 20);
        // The connecting task gives up by itself, and tries again later.
        tokio::time::sleep(CONNECT_TIMEOUT + Duration::from_millis(200)).await;
        let state = forwarder.state.lock().unwrap();
        assert!(!state.connecting && state.retry_at.is_some() && state.conn.is_none());
    }
}
