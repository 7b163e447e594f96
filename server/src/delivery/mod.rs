//! Group commit: concurrent deliveries share one store transaction (one fsync),
//! while each caller still waits for its own message to be durable.
//!
//! Shape: callers put `(NewDelivery, oneshot)` on an mpsc queue; one collector task
//! takes a commit slot (a semaphore permit, at most `max_concurrent` transactions in
//! flight), then drains everything already waiting (up to `max_batch`) and hands the
//! batch to a commit task that calls `store.deliver_batch` once and answers every
//! oneshot. No timer is needed for batching under load: while all commit slots are
//! busy, new deliveries pile up in the queue and the next batch takes them all.
//! While other commits are in flight, a batch that is not full lingers up to
//! `max_wait` (default 1 ms) for company — PostgreSQL's `commit_delay` with
//! `commit_siblings`, in the server: at a steady offered rate it turns many
//! one-message transactions into a few larger ones and keeps P95 low (see
//! bench/RESULTS.md). A lone message on an idle server is committed at once.
//! 3 ms would halve the transactions at 2,000 msg/s (bench/group-commit.sh), but
//! the pool then looks less busy to the autoscaler (`mail_pool_saturation`), the
//! autoscaling test's load no longer scaled the Deployment up, and one pod's P95
//! at that rate rose by a quarter (bench/smtp-pods.sh, run 8).
//!
//! The collector task is started on first use, inside whatever runtime the caller
//! runs on, so that a `Deliverer` can be built before the runtime exists.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::store::{Store, StoreError, StoreResult};
use mailcluster_model::{DeliveredTo, NewDelivery};

pub mod forward;

/// Tuning of the group commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryOptions {
    /// Most deliveries in one transaction.
    pub max_batch: usize,
    /// How long a batch that is not full may wait for more deliveries.
    pub max_wait: Duration,
    /// Transactions in flight at once: while one is syncing, the next batch forms.
    pub max_concurrent: usize,
}

impl Default for DeliveryOptions {
    fn default() -> Self {
        DeliveryOptions { max_batch: 256, max_wait: Duration::from_millis(1), max_concurrent: 4 }
    }
}

type Outcome = StoreResult<Vec<DeliveredTo>>;

/// Where a delivery's result goes.
enum Reply {
    /// A task of this pod awaits it.
    Waiting(oneshot::Sender<Outcome>),
    /// Another pod's delivery ([`forward`]): the commit itself hands the result
    /// to that pod's connection, and before this pod's own, whose senders wait
    /// for one hop less.
    Forwarded(ForwardedReply),
}

impl Reply {
    fn send(self, outcome: Outcome) {
        match self {
            Reply::Waiting(tx) => {
                // A caller that went away (connection dropped) simply misses the
                // answer; its message is stored, which is what an
                // unacknowledged retry tolerates.
                let _ = tx.send(outcome);
            }
            Reply::Forwarded(mut reply) => {
                if let Some(answer) = reply.0.take() {
                    answer(outcome);
                }
            }
        }
    }
}

/// Answers exactly once: a job dropped unanswered (its collector gone) answers
/// with an error, so that the other pod does not wait for a result that will
/// never come.
struct ForwardedReply(Option<Box<dyn FnOnce(Outcome) + Send>>);

impl Drop for ForwardedReply {
    fn drop(&mut self) {
        if let Some(answer) = self.0.take() {
            answer(Err(StoreError::Internal("delivery task ended".into())));
        }
    }
}

struct Job {
    delivery: NewDelivery,
    reply: Reply,
}

pub struct Deliverer {
    store: Arc<dyn Store>,
    options: DeliveryOptions,
    tx: mpsc::UnboundedSender<Job>,
    /// Taken by the collector task when it starts (first `deliver`).
    rx: Mutex<Option<mpsc::UnboundedReceiver<Job>>>,
    batch_size: prometheus::Histogram,
    /// Deliveries queued or being committed.
    backlog: Arc<AtomicUsize>,
    /// The pod that commits this pod's deliveries in its batches, if any.
    forward: Option<forward::Forwarder>,
}

impl Deliverer {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self::with_options(store, DeliveryOptions::default())
    }

    pub fn with_options(store: Arc<dyn Store>, options: DeliveryOptions) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let batch_size = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "mail_group_commit_batch_size",
                "Deliveries committed per store transaction",
            )
            .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0]),
        )
        .expect("valid metric");
        let options = DeliveryOptions {
            max_batch: options.max_batch.max(1),
            max_concurrent: options.max_concurrent.max(1),
            ..options
        };
        Deliverer {
            store,
            options,
            tx,
            rx: Mutex::new(Some(rx)),
            batch_size,
            backlog: Arc::new(AtomicUsize::new(0)),
            forward: None,
        }
    }

    /// Hands deliveries to the group-commit leader at `leader` (see [`forward`]);
    /// `instance` is this process's id, as the leader's greeting would show it.
    pub fn forwarding_to(mut self, leader: String, key: Vec<u8>, instance: String) -> Self {
        self.forward = Some(forward::Forwarder::new(leader, key, instance));
        self
    }

    /// Starts looking for the group-commit leader, when forwarding, so that the
    /// first deliveries find it (`serve`, at start).
    pub async fn start_forwarding(&self) {
        if let Some(forward) = &self.forward {
            forward.start().await;
        }
    }

    pub fn options(&self) -> DeliveryOptions {
        self.options
    }

    /// Deliveries queued or being committed here.
    pub fn backlog(&self) -> usize {
        self.backlog.load(Ordering::Acquire)
    }

    /// The most deliveries one round of commits takes (every slot, full batches).
    pub fn round(&self) -> usize {
        self.options.max_batch.saturating_mul(self.options.max_concurrent)
    }

    /// Registers `mail_group_commit_batch_size`, and when forwarding
    /// `mail_group_commit_forwarded_total` (once, at start: `serve`).
    pub fn register_metrics(&self, registry: &prometheus::Registry) -> prometheus::Result<()> {
        if let Some(forward) = &self.forward {
            forward.register_metrics(registry)?;
        }
        registry.register(Box::new(self.batch_size.clone()))
    }

    /// Stores `delivery` durably; returns the UIDs it got. Returns only after the
    /// transaction holding it has committed (or failed: then nothing of it is
    /// stored — but for a delivery handed to the leader whose answer was lost,
    /// `Unavailable`, stored or not: the client is told to retry, a copy may
    /// then be stored twice, none is lost).
    pub async fn deliver(&self, delivery: NewDelivery) -> StoreResult<Vec<DeliveredTo>> {
        let delivery = match &self.forward {
            Some(forward) => match forward.deliver(delivery).await {
                forward::Forwarded::Answered(result) => return result,
                forward::Forwarded::NotSent(delivery) => *delivery,
            },
            None => delivery,
        };
        self.deliver_here(delivery).await
    }

    /// As [`Deliverer::deliver`], in this pod's own batches whatever the
    /// configuration (the leader's side of [`forward`]).
    pub async fn deliver_here(&self, delivery: NewDelivery) -> StoreResult<Vec<DeliveredTo>> {
        let answer = self.submit(delivery)?;
        answer.await.map_err(|_| StoreError::Internal("delivery task ended".into()))?
    }

    /// Queues `delivery` for this pod's next batch at once (it counts in
    /// [`Deliverer::backlog`] before this returns); the receiver gets the result.
    pub fn submit(
        &self,
        delivery: NewDelivery,
    ) -> StoreResult<oneshot::Receiver<StoreResult<Vec<DeliveredTo>>>> {
        let (reply, answer) = oneshot::channel();
        self.queue(Job { delivery, reply: Reply::Waiting(reply) }).map_err(|(e, _)| e)?;
        Ok(answer)
    }

    /// As [`Deliverer::submit`], for another pod's delivery: `answer` gets the
    /// result, exactly once (an error when it cannot be queued), from the
    /// commit itself and before the results of this pod's own deliveries.
    pub fn submit_forwarded(&self, delivery: NewDelivery, answer: impl FnOnce(Outcome) + Send + 'static) {
        let reply = Reply::Forwarded(ForwardedReply(Some(Box::new(answer))));
        if let Err((e, reply)) = self.queue(Job { delivery, reply }) {
            reply.send(Err(e));
        }
    }

    /// Counts the job in the backlog and queues it; gives its reply back when
    /// the queue is closed.
    fn queue(&self, job: Job) -> Result<(), (StoreError, Reply)> {
        self.start_collector();
        self.backlog.fetch_add(1, Ordering::AcqRel);
        if let Err(mpsc::error::SendError(job)) = self.tx.send(job) {
            self.backlog.fetch_sub(1, Ordering::AcqRel);
            return Err((StoreError::Unavailable("delivery queue closed".into()), job.reply));
        }
        Ok(())
    }

    fn start_collector(&self) {
        let rx = self.rx.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(rx) = rx {
            let batch_size = self.batch_size.clone();
            tokio::spawn(collect(rx, self.store.clone(), self.options, batch_size, self.backlog.clone()));
        }
    }
}

/// Forms batches and starts their commits; ends when every `Deliverer` handle (the
/// sender) is gone and the queue is empty.
async fn collect(
    mut rx: mpsc::UnboundedReceiver<Job>,
    store: Arc<dyn Store>,
    options: DeliveryOptions,
    batch_size: prometheus::Histogram,
    backlog: Arc<AtomicUsize>,
) {
    let slots = Arc::new(Semaphore::new(options.max_concurrent));
    loop {
        let Some(first) = rx.recv().await else { return };
        // Wait for a commit slot before draining: everything that arrives meanwhile
        // joins this batch.
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let mut batch = vec![first];
        while batch.len() < options.max_batch {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        // Linger only when other commits are in flight: then the server is busy and
        // a short wait fills the batch (fewer, larger transactions, which is what
        // keeps the tail short at a steady offered rate), while a lone message on
        // an idle server is committed at once.
        let others_in_flight = slots.available_permits() + 1 < options.max_concurrent;
        if !options.max_wait.is_zero() && batch.len() < options.max_batch && others_in_flight {
            // One timer for the whole linger, not one per message received: a
            // timer earlier than any other wakes the runtime's driver (a syscall)
            // each time one is armed.
            let linger = tokio::time::sleep(options.max_wait);
            tokio::pin!(linger);
            while batch.len() < options.max_batch {
                tokio::select! {
                    biased;
                    job = rx.recv() => match job {
                        Some(job) => batch.push(job),
                        None => break,
                    },
                    () = &mut linger => break,
                }
            }
        }
        batch_size.observe(batch.len() as f64);
        let (store, backlog) = (store.clone(), backlog.clone());
        tokio::spawn(async move {
            let jobs = batch.len();
            commit(store.as_ref(), batch).await;
            backlog.fetch_sub(jobs, Ordering::AcqRel);
            drop(permit);
        });
    }
}

async fn commit(store: &dyn Store, batch: Vec<Job>) {
    let (deliveries, replies): (Vec<NewDelivery>, Vec<Reply>) =
        batch.into_iter().map(|j| (j.delivery, j.reply)).unzip();
    match store.deliver_batch(&deliveries).await {
        Ok(results) if results.len() == replies.len() => {
            // Forwarded results at once, this pod's own after them.
            let mut here = Vec::with_capacity(replies.len());
            for (reply, result) in replies.into_iter().zip(results) {
                match reply {
                    Reply::Forwarded(_) => reply.send(Ok(result)),
                    Reply::Waiting(_) => here.push((reply, result)),
                }
            }
            for (reply, result) in here {
                reply.send(Ok(result));
            }
        }
        Ok(results) => {
            tracing::error!(
                expected = replies.len(),
                got = results.len(),
                "deliver_batch result count mismatch"
            );
            for reply in replies {
                reply.send(Err(StoreError::Internal("deliver_batch result count mismatch".into())));
            }
        }
        Err(err) if replies.len() > 1 && !matches!(err, StoreError::Unavailable(_)) => {
            // One bad delivery (say, a mailbox deleted since RCPT) must not fail the
            // others that shared its transaction: retry them one by one.
            tracing::warn!(error = %err, batch = replies.len(), "group commit failed, retrying singly");
            for (delivery, reply) in deliveries.into_iter().zip(replies) {
                let result = store.deliver_batch(std::slice::from_ref(&delivery)).await;
                reply.send(result.and_then(|mut r| {
                    r.pop().ok_or_else(|| StoreError::Internal("deliver_batch returned nothing".into()))
                }));
            }
        }
        Err(err) => {
            tracing::warn!(error = %err, batch = replies.len(), "group commit failed");
            let text = err.to_string();
            for reply in replies {
                reply.send(Err(StoreError::Unavailable(text.clone())));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use bytes::Bytes;

    use super::*;
    use mailcluster_model::MessageMeta;

    async fn store_with_inbox(dir: &tempfile::TempDir) -> (Arc<dyn Store>, i64) {
        let store = crate::store::open(None, dir.path(), 2, Duration::from_secs(5)).await.unwrap();
        store.migrate().await.unwrap();
        store.domain_add("example.test").await.unwrap();
        let account = store.account_create("a@example.test", "x").await.unwrap();
        let inbox = store.mailbox_get(account.id, "INBOX").await.unwrap().expect("INBOX");
        (store, inbox.id)
    }

    fn delivery(mailbox_id: i64) -> NewDelivery {
        NewDelivery {
            raw: Bytes::from_static(b"Subject: hi\r\n\r\nbody\r\n"),
            meta: MessageMeta { subject: "hi".into(), ..Default::default() },
            internal_date: chrono::Utc::now(),
            targets: vec![mailbox_id],
            flags: Default::default(),
        }
    }

    #[tokio::test]
    async fn another_pods_results_are_handed_over_before_this_pods_own() {
        let dir = tempfile::tempdir().unwrap();
        let (store, inbox) = store_with_inbox(&dir).await;
        let deliverer = Deliverer::new(store);
        // Both queued before the collector runs: one batch, this pod's first.
        let here = Arc::new(Mutex::new(deliverer.submit(delivery(inbox)).unwrap()));
        let (done, forwarded) = oneshot::channel();
        let seen_here = here.clone();
        deliverer.submit_forwarded(delivery(inbox), move |result| {
            // Nothing of this pod's own is answered yet.
            let before = seen_here.lock().unwrap().try_recv().is_err();
            let _ = done.send((result, before));
        });
        let (result, answered_first) = forwarded.await.unwrap();
        assert_eq!(result.unwrap().len(), 1, "the forwarded delivery is stored");
        assert!(answered_first, "this pod's delivery was answered before the forwarded one");
        let mut here = Arc::try_unwrap(here).ok().unwrap().into_inner().unwrap();
        assert_eq!(here.try_recv().expect("answered after").unwrap().len(), 1);
    }

    #[test]
    fn a_forwarded_delivery_is_answered_once_even_when_its_runtime_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = || tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let first = runtime();
        let (store, inbox) = first.block_on(store_with_inbox(&dir));
        let deliverer = Deliverer::new(store);
        let answers = Arc::new(Mutex::new(Vec::new()));
        let answer = || {
            let answers = answers.clone();
            move |result: Outcome| answers.lock().unwrap().push(result.map(|d| d.len()))
        };
        // Queued, then its collector's runtime shuts down before committing it.
        first.block_on(async { deliverer.submit_forwarded(delivery(inbox), answer()) });
        drop(first);
        // The queue is closed for good now: refused at once. (The store's pool
        // is dropped in a runtime too.)
        runtime().block_on(async move {
            deliverer.submit_forwarded(delivery(inbox), answer());
            drop(deliverer);
        });
        let answers = answers.lock().unwrap();
        assert_eq!(answers.len(), 2, "{answers:?}");
        assert!(answers.iter().all(|a| a.is_err()), "{answers:?}");
    }
}
