//! The leader's side: accepts followers that prove the key and commits what
//! they send in its own batches, declining while it drains and shedding while
//! a full round of commits is already waiting, so that a follower is never
//! worse off than committing its delivery itself.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::configure;
use super::frames::{Outcome, decode_request, encode_answer, read_frame, write_frames};
use super::handshake;
use crate::delivery::Deliverer;
use crate::net::Shutdown;

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

    /// Deliveries shed so far.
    #[cfg(test)]
    pub(super) fn shed(&self) -> u64 {
        self.shed.get()
    }

    /// Resolves once no follower has sent anything for `quiet` and every
    /// delivery is answered, or at `deadline`. Followers that were declined
    /// come back after [`RETRY_AFTER`](super::RETRY_AFTER) while the leader's address is still
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
    let mut read = BufReader::new(read);
    handshake::as_leader(&mut read, &mut write, key, instance).await?;
    let (answers, queue) = mpsc::unbounded_channel();
    let writer = tokio::spawn(write_frames(queue, BufWriter::new(write)));
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
