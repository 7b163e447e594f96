//! One store query for the questions of many sessions.
//!
//! IMAP commands ask the store small questions ("has this mailbox changed?",
//! "where is message 42 of this mailbox?"). Asked one by one, each is a
//! PostgreSQL round trip, and with hundreds of busy sessions the per-query cost
//! outweighs the work the commands do. A [`Batcher`] queues the questions while
//! one query is in flight, and the next query answers all of them at once.
//!
//! Freshness is what a query of its own would give: a question is only ever
//! answered by a query that started after it was queued, so everything committed
//! before the client sent its command is seen.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use tokio::sync::{mpsc, oneshot};

use crate::store::{StoreError, StoreResult};

/// The query a [`Batcher`] runs.
pub trait BatchQuery: Send + Sync + 'static {
    type Question: Clone + Send + 'static;
    type Answer: Send + 'static;
    /// Answers to `questions`, in their order, from one store query.
    fn answer(
        &self,
        questions: &[Self::Question],
    ) -> impl Future<Output = StoreResult<Vec<Self::Answer>>> + Send;
}

type Reply<A> = oneshot::Sender<StoreResult<A>>;
/// A queued question and where its answer goes.
type Queued<Q> = (<Q as BatchQuery>::Question, Reply<<Q as BatchQuery>::Answer>);

pub struct Batcher<Q: BatchQuery> {
    query: Arc<Q>,
    /// Most questions one query answers.
    max_batch: usize,
    /// Their ratio is how many questions one query answers (metrics).
    questions: prometheus::IntCounter,
    queries: prometheus::IntCounter,
    /// The batching task, started by the first question (inside the runtime).
    queue: OnceLock<mpsc::UnboundedSender<Queued<Q>>>,
}

impl<Q: BatchQuery> Batcher<Q> {
    pub fn new(
        query: Q,
        max_batch: usize,
        questions: prometheus::IntCounter,
        queries: prometheus::IntCounter,
    ) -> Self {
        Batcher {
            query: Arc::new(query),
            max_batch: max_batch.max(1),
            questions,
            queries,
            queue: OnceLock::new(),
        }
    }

    pub async fn ask(&self, question: Q::Question) -> StoreResult<Q::Answer> {
        let queue = self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(run(self.query.clone(), self.max_batch, self.queries.clone(), rx));
            tx
        });
        self.questions.inc();
        let (tx, rx) = oneshot::channel();
        if queue.send((question.clone(), tx)).is_ok()
            && let Ok(answer) = rx.await
        {
            return answer;
        }
        // The task is gone (the runtime that started it shut down): ask directly.
        self.queries.inc();
        let mut answers = self.query.answer(std::slice::from_ref(&question)).await?;
        answers.pop().ok_or_else(|| StoreError::Internal("batched query gave no answer".into()))
    }
}

/// Ends when the batcher (the only sender) is dropped.
async fn run<Q: BatchQuery>(
    query: Arc<Q>,
    max_batch: usize,
    queries: prometheus::IntCounter,
    mut rx: mpsc::UnboundedReceiver<Queued<Q>>,
) {
    let mut questions = Vec::new();
    let mut replies = Vec::new();
    while let Some((q, r)) = rx.recv().await {
        questions.push(q);
        replies.push(r);
        while questions.len() < max_batch
            && let Ok((q, r)) = rx.try_recv()
        {
            questions.push(q);
            replies.push(r);
        }
        queries.inc();
        match query.answer(&questions).await {
            Ok(answers) if answers.len() == replies.len() => {
                for (reply, answer) in replies.drain(..).zip(answers) {
                    let _ = reply.send(Ok(answer));
                }
            }
            Ok(answers) => {
                let text =
                    format!("batched query gave {} answers to {} questions", answers.len(), replies.len());
                for reply in replies.drain(..) {
                    let _ = reply.send(Err(StoreError::Internal(text.clone())));
                }
            }
            Err(e) => {
                let text = e.to_string();
                for reply in replies.drain(..) {
                    let _ = reply.send(Err(StoreError::Unavailable(text.clone())));
                }
            }
        }
        questions.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    /// Doubles its questions; fails while `fail` is set; records each batch.
    struct Doubler {
        fail: std::sync::atomic::AtomicBool,
        short: std::sync::atomic::AtomicBool,
        batches: Mutex<Vec<Vec<u32>>>,
    }

    impl BatchQuery for Doubler {
        type Question = u32;
        type Answer = u32;

        async fn answer(&self, questions: &[u32]) -> StoreResult<Vec<u32>> {
            self.batches.lock().unwrap().push(questions.to_vec());
            tokio::time::sleep(Duration::from_millis(20)).await;
            if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(StoreError::Unavailable("down".into()));
            }
            let mut answers: Vec<u32> = questions.iter().map(|q| q * 2).collect();
            if self.short.load(std::sync::atomic::Ordering::SeqCst) {
                answers.pop();
            }
            Ok(answers)
        }
    }

    fn batcher(max_batch: usize) -> Arc<Batcher<Doubler>> {
        let query = Doubler { fail: false.into(), short: false.into(), batches: Mutex::new(Vec::new()) };
        let c = |n: &str| prometheus::IntCounter::new(n, n).unwrap();
        Arc::new(Batcher::new(query, max_batch, c("questions"), c("queries")))
    }

    async fn ask_all(b: &Arc<Batcher<Doubler>>, n: u32) -> Vec<StoreResult<u32>> {
        let asks: Vec<_> = (0..n)
            .map(|q| {
                let b = b.clone();
                tokio::spawn(async move { b.ask(q).await })
            })
            .collect();
        let mut out = Vec::new();
        for a in asks {
            out.push(a.await.unwrap());
        }
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_question_gets_its_own_answer_within_the_batch_limit() {
        let b = batcher(16);
        let answers = ask_all(&b, 100).await;
        for (q, a) in answers.into_iter().enumerate() {
            assert_eq!(a.unwrap(), q as u32 * 2);
        }
        let batches = b.query.batches.lock().unwrap().clone();
        assert!(batches.iter().all(|b| b.len() <= 16), "{batches:?}");
        assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), 100);
        assert!(batches.len() < 100, "questions shared queries: {}", batches.len());
        assert_eq!(b.queries.get(), batches.len() as u64);
        assert_eq!(b.questions.get(), 100);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_or_short_query_fails_every_question_it_carried() {
        let b = batcher(1024);
        b.query.fail.store(true, std::sync::atomic::Ordering::SeqCst);
        for a in ask_all(&b, 50).await {
            assert!(matches!(a, Err(StoreError::Unavailable(ref m)) if m.contains("down")), "{a:?}");
        }
        b.query.fail.store(false, std::sync::atomic::Ordering::SeqCst);
        b.query.short.store(true, std::sync::atomic::Ordering::SeqCst);
        for a in ask_all(&b, 50).await {
            assert!(
                matches!(a, Err(StoreError::Internal(_))),
                "answers are never handed to the wrong question: {a:?}"
            );
        }
        // And the batcher keeps working afterwards.
        b.query.short.store(false, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(b.ask(21).await.unwrap(), 42);
    }
}
