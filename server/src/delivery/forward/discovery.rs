//! Who leads: the addresses of `smtp.group_commit_leader`, ascending, looked up
//! again every few seconds because pods come and go. Every pod takes the
//! lowest, so they agree on a leader without an election.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::{OnceCell, watch};

/// How often the leader's name is looked up again (pods come and go).
const RESOLVE_EVERY: Duration = Duration::from_secs(5);

/// The addresses of the leader's name, ascending, as a task keeps them.
pub(super) type Addresses = watch::Receiver<Vec<SocketAddr>>;

/// The addresses of `name`, ascending; the first call looks them up and starts
/// the task that keeps them current in `cell` (it ends once the cell is gone).
pub(super) async fn addresses<'a>(cell: &'a OnceCell<Addresses>, name: &str) -> &'a Addresses {
    cell.get_or_init(|| async {
        let name = name.to_string();
        let first = lookup(&name, true).await.unwrap_or_default();
        let (tx, rx) = watch::channel(first);
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
