//! "Has this mailbox changed?" — the question every IMAP command asks the store
//! before it answers — batched across the sessions of a process.
//!
//! Each command's sync needs the selected mailbox's highest modseq as of the
//! moment the command arrived. Asked one by one, that is one PostgreSQL round
//! trip per command, and with hundreds of busy sessions those tiny queries cost
//! the database more than everything else the commands do (profile of
//! bench/imap.sh: 39 % of the machine for `UID SEARCH UNSEEN`). See [`batch`]
//! for how the questions share queries and why the answers are as fresh.
//!
//! [`batch`]: super::batch

use std::collections::HashMap;
use std::sync::Arc;

use super::batch::{BatchQuery, Batcher};
use crate::store::{Store, StoreResult};

/// Most mailboxes one query asks about.
const MAX_BATCH: usize = 1024;

pub struct ModseqProbe {
    batcher: Batcher<Modseqs>,
}

struct Modseqs(Arc<dyn Store>);

impl BatchQuery for Modseqs {
    type Question = i64;
    type Answer = Option<u64>;

    async fn answer(&self, mailbox_ids: &[i64]) -> StoreResult<Vec<Option<u64>>> {
        let mut ids = mailbox_ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let found: HashMap<i64, u64> = self.0.highest_modseqs(&ids).await?.into_iter().collect();
        Ok(mailbox_ids.iter().map(|id| found.get(id).copied()).collect())
    }
}

impl ModseqProbe {
    /// `questions` and `queries` are `mail_imap_change_checks_total{kind="question"}`
    /// and `{kind="query"}`: their ratio is how many questions one query answers.
    pub fn new(
        store: Arc<dyn Store>,
        questions: prometheus::IntCounter,
        queries: prometheus::IntCounter,
    ) -> Self {
        ModseqProbe { batcher: Batcher::new(Modseqs(store), MAX_BATCH, questions, queries) }
    }

    /// The mailbox's highest modseq now; `None` when the mailbox is gone.
    pub async fn highest_modseq(&self, mailbox_id: i64) -> StoreResult<Option<u64>> {
        self.batcher.ask(mailbox_id).await
    }
}
