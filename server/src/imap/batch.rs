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
