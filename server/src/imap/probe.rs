//! "Has this mailbox changed?" — the question every IMAP command asks the store
//! before it answers — batched across the sessions of a process.
//!
//! Each command's sync needs the selected mailbox's highest modseq as of the
//! moment the command arrived. Asked one by one, that is one PostgreSQL round
//! trip per command, and with hundreds of busy sessions those tiny queries cost
//! the database more than everything else the commands do (profile of
//! bench/imap.sh: 39 % of the machine for `UID SEARCH UNSEEN`). Here the
//! questions queue while one query is in flight and the next query answers all
//! of them at once.
//!
//! Freshness is what a query of its own would give: a request is only ever
//! answered by a query that started after the request was queued, so every
//! change committed before the client sent its command is seen.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use tokio::sync::{mpsc, oneshot};

use crate::store::{Store, StoreError, StoreResult};

/// Most mailboxes one query asks about.
const MAX_BATCH: usize = 1024;

type Reply = oneshot::Sender<StoreResult<Option<u64>>>;

pub struct ModseqProbe {
    store: Arc<dyn Store>,
    /// `mail_imap_change_checks_total{kind="question"}` and `{kind="query"}`:
    /// their ratio is how many questions one query answers.
    questions: prometheus::IntCounter,
    queries: prometheus::IntCounter,
    /// The batching task, started by the first request (inside the runtime).
    queue: OnceLock<mpsc::UnboundedSender<(i64, Reply)>>,
}

impl ModseqProbe {
    pub fn new(
        store: Arc<dyn Store>,
        questions: prometheus::IntCounter,
        queries: prometheus::IntCounter,
    ) -> Self {
        ModseqProbe { store, questions, queries, queue: OnceLock::new() }
    }

    /// The mailbox's highest modseq now; `None` when the mailbox is gone.
    pub async fn highest_modseq(&self, mailbox_id: i64) -> StoreResult<Option<u64>> {
        let queue = self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(run(self.store.clone(), self.queries.clone(), rx));
            tx
        });
        self.questions.inc();
        let (tx, rx) = oneshot::channel();
        if queue.send((mailbox_id, tx)).is_err() {
            // The task is gone (its runtime shut down): ask directly.
            return self.direct(mailbox_id).await;
        }
        match rx.await {
            Ok(answer) => answer,
            Err(_) => self.direct(mailbox_id).await,
        }
    }

    async fn direct(&self, mailbox_id: i64) -> StoreResult<Option<u64>> {
        self.queries.inc();
        let found = self.store.highest_modseqs(&[mailbox_id]).await?;
        Ok(found.first().map(|&(_, m)| m))
    }
}

/// Ends when the probe (the only sender) is dropped.
async fn run(
    store: Arc<dyn Store>,
    queries: prometheus::IntCounter,
    mut rx: mpsc::UnboundedReceiver<(i64, Reply)>,
) {
    let mut batch: Vec<(i64, Reply)> = Vec::new();
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < MAX_BATCH
            && let Ok(more) = rx.try_recv()
        {
            batch.push(more);
        }
        let mut ids: Vec<i64> = batch.iter().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids.dedup();
        queries.inc();
        match store.highest_modseqs(&ids).await {
            Ok(found) => {
                let found: HashMap<i64, u64> = found.into_iter().collect();
                for (id, reply) in batch.drain(..) {
                    let _ = reply.send(Ok(found.get(&id).copied()));
                }
            }
            Err(e) => {
                let text = e.to_string();
                for (_, reply) in batch.drain(..) {
                    let _ = reply.send(Err(StoreError::Unavailable(text.clone())));
                }
            }
        }
    }
}
