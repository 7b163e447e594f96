//! The pod's budget for client input held in flight: IMAP literals, SMTP DATA and
//! BDAT content, POP3 command lines. Per-connection limits bound what one client
//! makes the pod hold; this bounds what all of them do at once, so that a few
//! hundred sessions each inside its own limit cannot take the pod past its memory
//! limit (an OOM kill loses every session of the pod, not just the greedy ones).
//!
//! A transfer reserves what it announces (a literal's or BDAT chunk's size) or
//! grows its reservation as content arrives (DATA), before the memory is
//! allocated. When the budget is spent the transfer gets the protocol's temporary
//! error (SMTP `452 4.3.1`, IMAP `NO [LIMIT]`, POP3 `-ERR [SYS/TEMP]`) and the
//! client retries later, as from a busy Postfix. A [`Reservation`] gives its bytes
//! back when dropped, whichever way the session ends.
//!
//! Sizing: a quarter of the pod's memory limit (`net.memory_limit_bytes`, or the
//! cgroup's `memory.max`) leaves the rest to the caches (`imap.body_cache_bytes`
//! and friends), the runtime, TLS state of every connection, and the transient
//! copies a delivery makes while it is stored.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use prometheus::{IntCounterVec, IntGauge};

use crate::config::Config;
use crate::metrics::Metrics;

/// The budget when no memory limit is known (a process outside a container).
pub const DEFAULT_BUDGET: u64 = 256 * 1024 * 1024;

/// What share of the memory limit transfers may hold: 1/`LIMIT_SHARE`.
const LIMIT_SHARE: u64 = 4;

/// cgroup v2, then v1: the container's memory limit, when it has one.
const CGROUP_LIMITS: [&str; 2] = ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"];

/// The transfer budget of this process, in bytes, from the configuration.
pub fn budget_bytes(config: &Config) -> u64 {
    if config.net.transfer_budget_bytes > 0 {
        return config.net.transfer_budget_bytes;
    }
    let limit = match config.net.memory_limit_bytes {
        0 => cgroup_memory_limit(),
        n => Some(n),
    };
    limit.map_or(DEFAULT_BUDGET, |l| (l / LIMIT_SHARE).max(1))
}

/// The memory limit of the cgroup this process runs in; `None` when it has none.
fn cgroup_memory_limit() -> Option<u64> {
    CGROUP_LIMITS.iter().find_map(|path| parse_limit(&std::fs::read_to_string(path).ok()?))
}

/// `memory.max` holds a number or `max`; cgroup v1 writes a huge number (about
/// 2^63 rounded to pages) for "no limit".
fn parse_limit(text: &str) -> Option<u64> {
    let n: u64 = text.trim().parse().ok()?;
    (n > 0 && n < 1 << 60).then_some(n)
}

/// The process-wide budget. Cheap to share (`Arc`).
pub struct TransferBudget {
    limit: usize,
    used: AtomicUsize,
    in_use: IntGauge,
    refusals: IntCounterVec,
}

impl TransferBudget {
    /// A budget of `limit` bytes, reported through `metrics`
    /// (`mail_transfer_budget_bytes`, `mail_transfer_refusals_total`).
    pub fn new(limit: u64, metrics: &Metrics) -> Arc<TransferBudget> {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        metrics.transfer_budget_limit.set(i64::try_from(limit).unwrap_or(i64::MAX));
        Arc::new(TransferBudget {
            limit,
            used: AtomicUsize::new(0),
            in_use: metrics.transfer_budget_in_use.clone(),
            refusals: metrics.transfer_refusals_total.clone(),
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes reserved right now.
    pub fn in_use(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// An empty reservation for `protocol` (the metric's label), to grow.
    pub fn start(self: &Arc<Self>, protocol: &'static str) -> Reservation {
        Reservation { budget: self.clone(), protocol, held: 0 }
    }

    /// Takes `n` more bytes if they fit; true when they did.
    fn take(&self, n: usize) -> bool {
        let taken = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|&t| t <= self.limit)
            })
            .is_ok();
        if taken {
            self.in_use.add(n as i64);
        }
        taken
    }

    fn give_back(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
        self.in_use.sub(n as i64);
    }
}

/// Bytes of the budget held by one transfer; given back when dropped.
pub struct Reservation {
    budget: Arc<TransferBudget>,
    protocol: &'static str,
    held: usize,
}

impl Reservation {
    pub fn held(&self) -> usize {
        self.held
    }

    /// Grows the reservation to `total` bytes (never shrinks it). False, and a
    /// refusal counted, when the budget has no room: the reservation stays as it
    /// was.
    pub fn grow_to(&mut self, total: usize) -> bool {
        let more = total.saturating_sub(self.held);
        if more == 0 {
            return true;
        }
        if !self.budget.take(more) {
            self.budget.refusals.with_label_values(&[self.protocol]).inc();
            return false;
        }
        self.held = total;
        true
    }

    /// Gives every byte back, keeping the reservation for another transfer.
    pub fn clear(&mut self) {
        self.budget.give_back(std::mem::take(&mut self.held));
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_bounded_and_given_back_on_drop() {
        let metrics = Metrics::new();
        let budget = TransferBudget::new(100, &metrics);
        let mut a = budget.start("imap");
        assert!(a.grow_to(60));
        assert!(a.grow_to(40), "growing to less is a no-op");
        assert_eq!(a.held(), 60);
        let mut b = budget.start("smtp");
        assert!(!b.grow_to(41), "over the limit");
        assert_eq!((b.held(), budget.in_use()), (0, 60));
        assert!(b.grow_to(40));
        assert_eq!(metrics.transfer_budget_in_use.get(), 100);
        drop(a);
        assert_eq!(budget.in_use(), 40);
        b.clear();
        assert_eq!(budget.in_use(), 0);
        assert!(b.grow_to(100));
        drop(b);
        assert_eq!((budget.in_use(), metrics.transfer_budget_in_use.get()), (0, 0));
        assert_eq!(metrics.transfer_refusals_total.with_label_values(&["smtp"]).get(), 1);
    }

    #[test]
    fn sized_from_the_setting_the_limit_or_the_default() {
        let mut config = Config::default();
        config.net.memory_limit_bytes = 512 * 1024 * 1024;
        assert_eq!(budget_bytes(&config), 128 * 1024 * 1024);
        config.net.transfer_budget_bytes = 1000;
        assert_eq!(budget_bytes(&config), 1000);
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("536870912\n"), Some(536870912));
        assert_eq!(parse_limit("9223372036854771712\n"), None, "cgroup v1 without a limit");
    }
}
