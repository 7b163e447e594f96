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
//! payload`: status 0 carries `(i64 mailbox, u32 uid, u64 modseq, u32 added)` per
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

//!
//! Where each part lives: `discovery.rs` finds who leads (the leader name's
//! addresses), `handshake.rs` is the greeting and the proofs of the key,
//! `frames.rs` the requests and answers on the wire, `follower.rs` the side
//! that offers deliveries ([`Forwarder`]) and `leader.rs` the side that
//! commits them ([`accept`]).

use std::time::Duration;

use tokio::net::TcpStream;

mod discovery;
mod follower;
mod frames;
mod handshake;
mod leader;

pub use follower::{Forwarded, Forwarder};
#[doc(hidden)]
pub use frames::fuzzing;
pub use handshake::instance_id;
pub use leader::{FOLLOWERS_QUIET, Followers, accept};

/// How long a follower waits for the leader to connect and accept it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// After a failed connection, deliveries are committed locally for this long
/// before the leader is tried again (no connect attempt per message).
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How long sent data may stay unacknowledged before a peer is taken for dead.
const DEAD_AFTER: Duration = Duration::from_secs(5);

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

/// A delivery for the tests of both sides and of the codec.
#[cfg(test)]
fn test_delivery() -> mailcluster_model::NewDelivery {
    use mailcluster_model::{FlagSet, Flags, MessageMeta, NewDelivery};
    NewDelivery {
        raw: bytes::Bytes::from_static(b"Subject: hi\r\n\r\nbody\r\n"),
        meta: MessageMeta { subject: "hi".into(), ..Default::default() },
        internal_date: chrono::Utc::now(),
        targets: vec![7, 9],
        flags: FlagSet { system: Flags::SEEN, keywords: vec!["$Label1".into()] },
    }
}
