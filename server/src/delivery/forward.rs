//! Batches formed across pods: a pod may hand its deliveries to one other pod
//! (the group-commit leader), which commits them in its own batches together
//! with its own mail.
//!
//! Why: each pod's group commit forms batches from the traffic that pod
//! receives, so N pods sharing a load commit about N times the transactions of
//! one pod for the same mail, and PostgreSQL pays a fixed cost per statement
//! (executor start, commit, WAL flush; bench/RESULTS.md, "Two pods against one").
//! Sending each message to the leader costs a loopback-or-LAN round trip instead.
//!
//! Correctness does not depend on there being one leader: any pod may commit any
//! delivery, so pods that disagree on the leader (or a leader that is down) only
//! form smaller batches. A delivery that could not be sent is committed locally;
//! one that was sent and got no answer (the connection broke, or the leader took
//! too long) fails as `Unavailable`, which the SMTP session answers with a 451:
//! the client retries, and at worst the message is stored twice, never lost.
//!
//! Which pod leads: `smtp.group_commit_leader` is `host:port`, and the host may
//! name several addresses (in Kubernetes, a headless Service over the pods that
//! deliver): every pod takes the lowest address, looked up again every few
//! seconds, so they agree without an election. The pod that finds itself there
//! (the leader's greeting carries its instance id) commits its own mail.
//!
//! Wire format, over one TCP connection per follower (requests pipelined,
//! answered in any order). Both sides prove they hold the key,
//! `smtp.group_commit_secret` (the operator generates one per cluster; a pod
//! without one neither leads nor follows): the leader greets with
//! `MCGC2 <instance> <leader nonce>\n`; the follower answers `<instance>
//! <follower nonce> <HMAC-SHA256(key, "follower" | leader nonce | follower
//! nonce) in hex>\n`; the leader says `OK <HMAC-SHA256(key, "leader" | leader
//! nonce | follower nonce) in hex>\n` (or `NO\n`), and the follower sends
//! nothing before it has checked that proof. The role in each proof means one
//! side's proof is never the other's, so a process without the key cannot pass
//! as a leader by reflecting a follower's proof back to it. The frames after
//! the handshake are neither encrypted nor signed: the pod network (the
//! NetworkPolicy opens port 7025 only between the cluster's own pods) is
//! trusted with them. A request is `u32 length | u64 id | u32 header length |
//! header (JSON) | message`; an answer is `u32 length | u64 id | u8 status |
//! //! payload`: status 0 carries `(i64 mailbox, u32 uid, u64 modseq, u32 added)` per
//! target, 5 says the leader is draining and stored nothing (the follower then
//! commits the delivery itself and looks for the next leader), 6 that it is
//! behind and stored nothing (the follower commits that one itself and goes on
//! offering), any other status an error text (1 not found, 2 invalid, 3
//! unavailable, 4 internal). Integers are big-endian.
//!
//! A leader is behind when a full round of commits (`max_batch` ×
//! `max_concurrent` deliveries) is already waiting on it: one leader commits a
//! whole Deployment's mail, and past that point a follower's own commit is
//! sooner than a place in the leader's queue.
//!
//! A draining leader (SIGTERM) declines new deliveries with status 5 rather
//! than closing, so that what a follower sends in the seconds before the
//! headless Service drops the leader's address is committed, not failed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use chrono::{DateTime, Utc};
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use super::Deliverer;
use crate::cache::hex;
use crate::net::Shutdown;
use crate::store::{StoreError, StoreResult};
use mailcluster_model::{DeliveredTo, FlagSet, Flags, MessageMeta, NewDelivery};

const GREETING: &str = "MCGC2";
/// How long a follower waits for the leader to connect and accept it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// After a failed connection, deliveries are committed locally for this long
/// before the leader is tried again (no connect attempt per message).
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest a sent delivery may wait for its answer: the SMTP client's own
/// DATA timeout is minutes; a leader that takes this long is failing.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long sent data may stay unacknowledged before a peer is taken for dead.
const DEAD_AFTER: Duration = Duration::from_secs(5);
/// How often the leader's name is looked up again (pods come and go).
const RESOLVE_EVERY: Duration = Duration::from_secs(5);
/// How long a leader found draining is passed over: longer than its drain
/// waits for followers to go quiet, so that it can stop.
const AVOID_DRAINING: Duration = Duration::from_secs(30);

/// A random id of this process, to tell a pod that resolved its own address.
pub fn instance_id() -> String {
    let mut id = [0u8; 8];
    rand::fill(&mut id);
    hex(&id)
}

/// Which side of the handshake a proof is from: part of what is signed, so a
/// proof made by one side is never accepted from the other.
#[derive(Clone, Copy)]
enum Role {
    Leader,
    Follower,
}

/// HMAC-SHA256 over the role and both nonces (fields separated by a NUL,
/// which a hex nonce never contains).
fn proof(key: &[u8], role: Role, leader_nonce: &str, follower_nonce: &str) -> Option<Hmac<Sha256>> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).ok()?;
    mac.update(match role {
        Role::Leader => b"leader",
        Role::Follower => b"follower",
    });
    for nonce in [leader_nonce, follower_nonce] {
        mac.update(b"\0");
        mac.update(nonce.as_bytes());
    }
    Some(mac)
}

fn proof_hex(key: &[u8], role: Role, leader_nonce: &str, follower_nonce: &str) -> Option<String> {
    proof(key, role, leader_nonce, follower_nonce).map(|mac| hex(&mac.finalize().into_bytes()))
}

/// Whether `given` (hex) is `role`'s proof over the two nonces; constant time.
fn proven(key: &[u8], role: Role, leader_nonce: &str, follower_nonce: &str, given: &str) -> bool {
    decode_hex(given)
        .and_then(|given| {
            proof(key, role, leader_nonce, follower_nonce).map(|mac| mac.verify_slice(&given).is_ok())
        })
        .unwrap_or(false)
}

/// A fresh challenge: 16 random bytes in hex.
fn nonce() -> String {
    let mut nonce = [0u8; 16];
    rand::fill(&mut nonce);
    hex(&nonce)
}

/// What a request's header carries, as the leader reads it.
#[derive(Deserialize)]
struct Header {
    targets: Vec<i64>,
    internal_date: DateTime<Utc>,
    flags: u32,
    keywords: Vec<String>,
    meta: MessageMeta,
}

/// The leader's answer to one delivery.
#[derive(Debug)]
enum Outcome {
    Done(StoreResult<Vec<DeliveredTo>>),
    /// Nothing stored: the leader is draining (look for the next one).
    Declined,
    /// Nothing stored: the leader has a full round of commits waiting (commit
    /// this one here, keep offering the next ones).
    Busy,
}
type Answer = oneshot::Sender<Outcome>;

/// [`Header`] as the follower writes it, borrowed from the delivery (no copy of
/// the metadata per forwarded message).
#[derive(Serialize)]
struct HeaderRef<'a> {
    targets: &'a [i64],
    internal_date: DateTime<Utc>,
    flags: u32,
    keywords: &'a [String],
    meta: &'a MessageMeta,
}

/// Status of a delivery declined by a draining leader.
const DECLINED: u8 = 5;
/// Status of a delivery shed by a leader that is behind.
const BUSY: u8 = 6;

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
    addrs: Arc<tokio::sync::OnceCell<tokio::sync::watch::Receiver<Vec<SocketAddr>>>>,
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
            addrs: Arc::new(tokio::sync::OnceCell::new()),
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

    /// The leader name's addresses, ascending; the first call looks them up
    /// and starts the task that keeps them current.
    async fn addresses(&self) -> &tokio::sync::watch::Receiver<Vec<SocketAddr>> {
        self.addrs
            .get_or_init(|| async {
                let name = self.leader.clone();
                let first = lookup(&name, true).await.unwrap_or_default();
                let (tx, rx) = tokio::sync::watch::channel(first);
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(RESOLVE_EVERY).await;
                        let had = !tx.borrow().is_empty();
                        let found = lookup(&name, had).await.unwrap_or_default();
                        if tx.send(found).is_err() {
                            return; // the Forwarder is gone
                        }
                    }
                });
                rx
            })
            .await
    }

    /// The open connection to the leader; None while there is none (the
    /// delivery is then committed here), or the leader is this pod. A task of
    /// its own connects, so that a leader that does not answer (its node gone,
    /// packets dropped) holds up no delivery.
    async fn connection(&self) -> Option<Arc<Conn>> {
        let addrs = self.addresses().await;
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

/// The addresses of `name`, ascending; a failure is logged when `say` (once
/// per failure spell, not at every lookup).
async fn lookup(name: &str, say: bool) -> Option<Vec<SocketAddr>> {
    match tokio::net::lookup_host(name).await {
        Ok(addrs) => {
            let mut addrs: Vec<SocketAddr> = addrs.collect();
            addrs.sort();
            addrs.dedup();
            Some(addrs)
        }
        Err(e) => {
            if say {
                tracing::warn!(leader = %name, error = %e, "cannot look up the group-commit leader; committing here");
            }
            None
        }
    }
}

/// Both ends of a follower's connection: no Nagle delay (frames are small and
/// a delivery waits on each), and a peer whose node is gone, which sends no
/// reset, is given up once what was sent stays unacknowledged for
/// [`DEAD_AFTER`] or an idle connection answers no keepalive probe, so that
/// pending deliveries fail (451) and new ones are committed here instead of
/// being sent into the void.
fn configure(stream: &TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let socket = socket2::SockRef::from(stream);
    let probes = socket2::TcpKeepalive::new()
        .with_time(DEAD_AFTER / 2)
        .with_interval(Duration::from_secs(1))
        .with_retries(3);
    socket.set_tcp_keepalive(&probes)?;
    socket.set_tcp_user_timeout(Some(DEAD_AFTER))
}

/// Connects and proves the key; None when the greeting shows this very process.
async fn connect(addr: SocketAddr, key: &[u8], instance: &str) -> std::io::Result<Option<Arc<Conn>>> {
    let refused = |why: &str| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why.to_string());
    let stream = TcpStream::connect(addr).await?;
    configure(&stream)?;
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut line = String::new();
    (&mut read).take(256).read_line(&mut line).await?;
    let mut words = line.trim_end().split(' ');
    let (Some(GREETING), Some(leader), Some(nonce), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Err(refused("not a group-commit leader"));
    };
    if leader == instance {
        return Ok(None);
    }
    let (theirs, ours) = (nonce.to_string(), self::nonce());
    let mine = proof_hex(key, Role::Follower, &theirs, &ours).ok_or_else(|| refused("unusable key"))?;
    write.write_all(format!("{instance} {ours} {mine}\n").as_bytes()).await?;
    line.clear();
    (&mut read).take(256).read_line(&mut line).await?;
    match line.trim_end().split_once(' ') {
        Some(("OK", proof)) if proven(key, Role::Leader, &theirs, &ours, proof) => {}
        // Deliveries go only to a pod that holds the key too: whoever answers
        // on the leader's address without it gets none.
        Some(("OK", _)) => return Err(refused("the leader did not prove the cluster's key")),
        _ => return Err(refused("the leader refused this pod's key")),
    }
    let (frames, queue) = mpsc::unbounded_channel();
    let conn = Arc::new(Conn {
        addr,
        frames: Mutex::new(Some(frames)),
        pending: Mutex::new(Some(HashMap::new())),
        next_id: AtomicU64::new(1),
        declined: std::sync::atomic::AtomicBool::new(false),
    });
    tokio::spawn(write_frames(queue, BufWriter::new(write), Some(conn.clone())));
    tokio::spawn(read_answers(read, conn.clone()));
    Ok(Some(conn))
}

/// Writes queued frames, flushing when the queue is empty (frames queued
/// together leave in one write).
async fn write_frames<W: AsyncWrite + Unpin>(
    mut queue: mpsc::UnboundedReceiver<Bytes>,
    mut out: BufWriter<W>,
    conn: Option<Arc<Conn>>,
) {
    while let Some(frame) = queue.recv().await {
        let mut result = out.write_all(&frame).await;
        while result.is_ok() {
            match queue.try_recv() {
                Ok(frame) => result = out.write_all(&frame).await,
                Err(_) => break,
            }
        }
        if let Err(e) = match result {
            Ok(()) => out.flush().await,
            Err(e) => Err(e),
        } {
            if let Some(conn) = &conn {
                conn.close(&e.to_string());
            }
            return;
        }
    }
    let _ = out.shutdown().await;
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

/// Reads one length-prefixed frame; None at a clean end of stream.
async fn read_frame<R: AsyncRead + Unpin>(read: &mut R, max: usize) -> std::io::Result<Option<BytesMut>> {
    let len = match read.read_u32().await {
        Ok(len) => len as usize,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    };
    if len > max {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("frame of {len} bytes")));
    }
    let mut frame = BytesMut::zeroed(len);
    read.read_exact(&mut frame).await?;
    Ok(Some(frame))
}

fn encode_request(id: u64, delivery: &NewDelivery) -> serde_json::Result<Bytes> {
    let header = serde_json::to_vec(&HeaderRef {
        targets: &delivery.targets,
        internal_date: delivery.internal_date,
        flags: delivery.flags.system.0,
        keywords: &delivery.flags.keywords,
        meta: &delivery.meta,
    })?;
    let len = 8 + 4 + header.len() + delivery.raw.len();
    let mut frame = BytesMut::with_capacity(4 + len);
    frame.put_u32(len as u32);
    frame.put_u64(id);
    frame.put_u32(header.len() as u32);
    frame.put_slice(&header);
    frame.put_slice(&delivery.raw);
    Ok(frame.freeze())
}

fn decode_request(mut frame: BytesMut) -> Result<(u64, NewDelivery), String> {
    if frame.len() < 12 {
        return Err("short request".into());
    }
    let id = frame.get_u64();
    let header_len = frame.get_u32() as usize;
    if frame.len() < header_len {
        return Err("short request header".into());
    }
    let header: Header = serde_json::from_slice(&frame.split_to(header_len)).map_err(|e| e.to_string())?;
    let delivery = NewDelivery {
        raw: frame.freeze(),
        meta: header.meta,
        internal_date: header.internal_date,
        targets: header.targets,
        flags: FlagSet { system: Flags(header.flags), keywords: header.keywords },
    };
    Ok((id, delivery))
}

fn encode_answer(id: u64, outcome: &Outcome) -> Bytes {
    let mut body = BytesMut::new();
    body.put_u64(id);
    match outcome {
        Outcome::Declined => body.put_u8(DECLINED),
        Outcome::Busy => body.put_u8(BUSY),
        Outcome::Done(Ok(delivered)) => {
            body.put_u8(0);
            for d in delivered {
                body.put_i64(d.mailbox_id);
                body.put_u32(d.uid);
                body.put_u64(d.modseq);
                body.put_u32(d.added);
            }
        }
        Outcome::Done(Err(e)) => {
            let (code, text) = match e {
                StoreError::NotFound(t) | StoreError::AlreadyExists(t) => (1, t),
                StoreError::Invalid(t) => (2, t),
                StoreError::Unavailable(t) => (3, t),
                StoreError::Internal(t) => (4, t),
            };
            body.put_u8(code);
            body.put_slice(text.as_bytes());
        }
    }
    let mut frame = BytesMut::with_capacity(4 + body.len());
    frame.put_u32(body.len() as u32);
    frame.put_slice(&body);
    frame.freeze()
}

fn decode_answer(mut frame: BytesMut) -> Result<(u64, Outcome), String> {
    if frame.len() < 9 {
        return Err("short answer".into());
    }
    let id = frame.get_u64();
    let status = frame.get_u8();
    if status == 0 {
        if !frame.len().is_multiple_of(24) {
            return Err("malformed answer".into());
        }
        let mut delivered = Vec::with_capacity(frame.len() / 24);
        while frame.has_remaining() {
            delivered.push(DeliveredTo {
                mailbox_id: frame.get_i64(),
                uid: frame.get_u32(),
                modseq: frame.get_u64(),
                added: frame.get_u32(),
            });
        }
        return Ok((id, Outcome::Done(Ok(delivered))));
    }
    match status {
        DECLINED => return Ok((id, Outcome::Declined)),
        BUSY => return Ok((id, Outcome::Busy)),
        _ => {}
    }
    let text = String::from_utf8_lossy(&frame).into_owned();
    let err = match status {
        1 => StoreError::NotFound(text),
        2 => StoreError::Invalid(text),
        3 => StoreError::Unavailable(text),
        _ => StoreError::Internal(text),
    };
    Ok((id, Outcome::Done(Err(err))))
}

/// What the leader's side has going: a draining pod stays until its followers
/// have gone elsewhere ([`Followers::quiet`]).
pub struct Followers {
    /// Deliveries received and not yet answered.
    in_flight: std::sync::atomic::AtomicUsize,
    last_frame: Mutex<Option<Instant>>,
    /// Deliveries shed while a full round of commits was waiting: a leader
    /// that sheds often carries more than one pod's commits can.
    shed: prometheus::IntCounter,
}

impl Default for Followers {
    fn default() -> Self {
        let shed = prometheus::IntCounter::new(
            "mail_group_commit_shed_total",
            "Deliveries other pods offered while this pod was a full round of commits behind (they committed them)",
        )
        .expect("valid metric");
        Followers { in_flight: Default::default(), last_frame: Mutex::new(None), shed }
    }
}

impl Followers {
    /// Registers `mail_group_commit_shed_total` (once, at start: `serve`).
    pub fn register_metrics(&self, registry: &prometheus::Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.shed.clone()))
    }

    /// Resolves once no follower has sent anything for `quiet` and every
    /// delivery is answered, or at `deadline`. Followers that were declined
    /// come back after [`RETRY_AFTER`] while the leader's address is still
    /// listed, so `quiet` must be longer than that.
    pub async fn quiet(&self, quiet: Duration, deadline: Instant) {
        loop {
            let last = *self.last_frame.lock().unwrap_or_else(|p| p.into_inner());
            let idle = last.is_none_or(|at| at.elapsed() >= quiet);
            if (idle && self.in_flight.load(Ordering::Acquire) == 0) || Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// How long a draining leader waits for its followers to stop sending (they
/// pass it over once declined; one that had nothing to send meanwhile may
/// still come, and then finds the port closed and commits its own).
pub const FOLLOWERS_QUIET: Duration = Duration::from_secs(2);

/// The leader's side: accepts followers that prove the key and commits what
/// they send with its own deliveries (never forwarding it on).
pub async fn accept(
    listener: TcpListener,
    deliverer: Arc<Deliverer>,
    key: Vec<u8>,
    instance: String,
    max_message: usize,
    draining: Shutdown,
    followers: Arc<Followers>,
) {
    let shared = Arc::new((key, instance));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "group-commit accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (deliverer, shared, draining, followers) =
            (deliverer.clone(), shared.clone(), draining.clone(), followers.clone());
        tokio::spawn(async move {
            let served = follower(stream, deliverer, &shared.0, &shared.1, max_message, draining, followers);
            if let Err(e) = served.await {
                tracing::debug!(%peer, error = %e, "group-commit follower connection ended");
            }
        });
    }
}

async fn follower(
    stream: TcpStream,
    deliverer: Arc<Deliverer>,
    key: &[u8],
    instance: &str,
    max_message: usize,
    draining: Shutdown,
    followers: Arc<Followers>,
) -> std::io::Result<()> {
    configure(&stream)?;
    let (read, mut write) = stream.into_split();
    let nonce = self::nonce();
    write.write_all(format!("{GREETING} {instance} {nonce}\n").as_bytes()).await?;
    let mut read = BufReader::new(read);
    let mut line = String::new();
    tokio::time::timeout(CONNECT_TIMEOUT * 5, (&mut read).take(256).read_line(&mut line))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer to the greeting"))??;
    let mut words = line.trim_end().split(' ');
    let answer = match (words.next(), words.next(), words.next(), words.next()) {
        (Some(_), Some(theirs), Some(given), None)
            if !theirs.is_empty() && proven(key, Role::Follower, &nonce, theirs, given) =>
        {
            proof_hex(key, Role::Leader, &nonce, theirs)
        }
        _ => None,
    };
    let Some(answer) = answer else {
        let _ = write.write_all(b"NO\n").await;
        return Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, "wrong group-commit key"));
    };
    write.write_all(format!("OK {answer}\n").as_bytes()).await?;
    let (answers, queue) = mpsc::unbounded_channel();
    let writer = tokio::spawn(write_frames(queue, BufWriter::new(write), None));
    // The message plus its header (the parsed metadata is a fraction of it).
    let max_frame = max_message.saturating_mul(2).saturating_add(1 << 20);
    let result = loop {
        let frame = match read_frame(&mut read, max_frame).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        let (id, delivery) = match decode_request(frame) {
            Ok(request) => request,
            Err(e) => break Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        };
        *followers.last_frame.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        if draining.is_signalled() {
            let _ = answers.send(encode_answer(id, &Outcome::Declined));
            continue;
        }
        // A full round of commits is already waiting here: this one would wait
        // at least a round more, and the follower commits it sooner itself.
        if deliverer.backlog() >= deliverer.round() {
            followers.shed.inc();
            let _ = answers.send(encode_answer(id, &Outcome::Busy));
            continue;
        }
        // Queued before the next frame is read, so that the backlog above
        // counts every delivery this loop has taken.
        followers.in_flight.fetch_add(1, Ordering::AcqRel);
        let (answers, followers) = (answers.clone(), followers.clone());
        deliverer.submit_forwarded(delivery, move |result| {
            let _ = answers.send(encode_answer(id, &Outcome::Done(result)));
            followers.in_flight.fetch_sub(1, Ordering::AcqRel);
        });
    };
    // Answers still being committed keep the writer's queue open until sent.
    drop(answers);
    let _ = writer.await;
    result
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

/// Entry points of the fuzz targets (`fuzz/`): both sides' frame reader,
/// decoders and encoders. Not for other use.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// A decoded answer, opaque but for its encoding and its `Debug` form.
    #[derive(Debug)]
    pub struct Answer(Outcome);

    impl Answer {
        pub fn encode(&self, id: u64) -> Bytes {
            encode_answer(id, &self.0)
        }
    }

    /// The follower's decoding of an answer frame (without its length prefix).
    pub fn decode_answer(frame: &[u8]) -> Result<(u64, Answer), String> {
        super::decode_answer(BytesMut::from(frame)).map(|(id, outcome)| (id, Answer(outcome)))
    }

    /// The leader's decoding of a request frame (without its length prefix).
    pub fn decode_request(frame: &[u8]) -> Result<(u64, NewDelivery), String> {
        super::decode_request(BytesMut::from(frame))
    }

    /// A request frame, length prefix included.
    pub fn encode_request(id: u64, delivery: &NewDelivery) -> serde_json::Result<Bytes> {
        super::encode_request(id, delivery)
    }

    /// One length-prefixed frame of at most `max` bytes; None at a clean end.
    pub async fn read_frame<R: AsyncRead + Unpin>(
        read: &mut R,
        max: usize,
    ) -> std::io::Result<Option<BytesMut>> {
        super::read_frame(read, max).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery() -> NewDelivery {
        NewDelivery {
            raw: Bytes::from_static(b"Subject: hi\r\n\r\nbody\r\n"),
            meta: MessageMeta { subject: "hi".into(), ..Default::default() },
            internal_date: Utc::now(),
            targets: vec![7, 9],
            flags: FlagSet { system: Flags::SEEN, keywords: vec!["$Label1".into()] },
        }
    }

    #[test]
    fn requests_and_answers_survive_the_wire() {
        let sent = delivery();
        let mut frame = BytesMut::from(&encode_request(42, &sent).unwrap()[..]);
        assert_eq!(frame.get_u32() as usize, frame.len());
        let (id, got) = decode_request(frame).unwrap();
        assert_eq!(id, 42);
        assert_eq!(
            (got.raw, got.meta, got.targets, got.flags),
            (sent.raw, sent.meta, sent.targets, sent.flags)
        );
        assert_eq!(got.internal_date, sent.internal_date);

        let delivered = vec![
            DeliveredTo { mailbox_id: 7, uid: 3, modseq: 11, added: 2 },
            DeliveredTo { mailbox_id: -1, uid: u32::MAX, modseq: u64::MAX, added: 0 },
        ];
        for result in
            [Ok(delivered), Err(StoreError::Unavailable("down".into())), Err(StoreError::Invalid("x".into()))]
        {
            let outcome = Outcome::Done(result);
            let mut frame = BytesMut::from(&encode_answer(9, &outcome)[..]);
            frame.get_u32();
            let (id, got) = decode_answer(frame).unwrap();
            assert_eq!(id, 9);
            assert_eq!(format!("{got:?}"), format!("{outcome:?}"));
        }
        let mut frame = BytesMut::from(&encode_answer(10, &Outcome::Declined)[..]);
        frame.get_u32();
        assert!(matches!(decode_answer(frame), Ok((10, Outcome::Declined))), "declined");
        let mut frame = BytesMut::from(&encode_answer(11, &Outcome::Busy)[..]);
        frame.get_u32();
        assert!(matches!(decode_answer(frame), Ok((11, Outcome::Busy))), "busy");
        assert!(decode_request(BytesMut::from(&b"short"[..])).is_err());
        assert!(decode_answer(BytesMut::from(&[0u8; 8 + 1 + 5][..])).is_err(), "a partial delivered entry");
        assert_eq!(decode_hex("00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(decode_hex("0"), None);
        assert_eq!(decode_hex("zz"), None);
    }

    #[test]
    fn a_proof_binds_the_role_and_both_nonces() {
        let p = |key: &[u8], role, l: &str, f: &str| proof_hex(key, role, l, f).unwrap();
        let follower = p(b"k", Role::Follower, "aa", "bb");
        assert!(proven(b"k", Role::Follower, "aa", "bb", &follower));
        assert!(!proven(b"k", Role::Leader, "aa", "bb", &follower), "a follower's proof is no leader's");
        assert!(!proven(b"other", Role::Follower, "aa", "bb", &follower), "another key");
        assert!(!proven(b"k", Role::Follower, "aa", "bc", &follower), "another follower nonce");
        assert!(!proven(b"k", Role::Follower, "ab", "bb", &follower), "another leader nonce");
        // The separator keeps ("a", "abb") and ("aa", "bb") apart.
        assert_ne!(p(b"k", Role::Follower, "a", "abb"), follower);
        assert!(!proven(b"k", Role::Follower, "aa", "bb", ""), "no proof");
        assert!(!proven(b"k", Role::Follower, "aa", "bb", "zz"), "not hex");
    }

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
        assert_eq!(followers.shed.get(), shed as u64, "the leader counts what it shed");
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
