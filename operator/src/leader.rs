//! Leader election on a `coordination.k8s.io/v1` Lease (kube-runtime has none).
//!
//! Several operator replicas may run; only the holder of the Lease reconciles. The
//! holder renews every `renew_every`; a Lease not renewed for `lease_duration` may be
//! taken over. Every write carries the `resourceVersion` read just before, so two
//! candidates racing for an expired Lease cannot both win (the loser gets 409).
//! A leader that cannot renew before its Lease expires stops: it must assume another
//! replica has taken over, and two reconcilers would fight over the children.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, Error};

#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_every: Duration,
}

/// What a candidate should do with the Lease as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No Lease yet: create it, holding it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Another holder let it expire (or released it): take it over.
    TakeOver,
    /// Someone else holds a live Lease.
    Wait { holder: String },
}

/// Pure decision from the observed Lease.
pub fn decide(lease: Option<&LeaseSpec>, me: &str, now: Timestamp) -> Decision {
    let Some(spec) = lease else { return Decision::Create };
    match spec.holder_identity.as_deref() {
        Some(h) if h == me => Decision::Renew,
        None | Some("") => Decision::TakeOver,
        Some(h) => {
            let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
            let expired = spec.renew_time.as_ref().is_none_or(|t| t.0 + duration < now);
            if expired { Decision::TakeOver } else { Decision::Wait { holder: h.to_string() } }
        }
    }
}

pub struct LeaderElector {
    api: Api<Lease>,
    cfg: LeaseConfig,
}

impl LeaderElector {
    pub fn new(client: Client, cfg: LeaseConfig) -> Self {
        LeaderElector { api: Api::namespaced(client, &cfg.namespace), cfg }
    }

    fn spec(&self, now: Timestamp, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.cfg.identity.clone()),
            lease_duration_seconds: Some(i32::try_from(self.cfg.lease_duration.as_secs()).unwrap_or(15)),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One round: returns whether we hold the Lease afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, Error> {
        let now = Timestamp::now();
        let current = self.api.get_opt(&self.cfg.name).await?;
        let decision = decide(current.as_ref().and_then(|l| l.spec.as_ref()), &self.cfg.identity, now);
        let result = match (decision, current) {
            (Decision::Create, _) => {
                let lease = Lease {
                    metadata: ObjectMeta { name: Some(self.cfg.name.clone()), ..Default::default() },
                    spec: Some(self.spec(now, None, 0)),
                };
                self.api.create(&PostParams::default(), &lease).await.map(|_| ())
            }
            (Decision::Renew, Some(mut lease)) => {
                let old = lease.spec.take().unwrap_or_default();
                lease.spec = Some(self.spec(now, old.acquire_time, old.lease_transitions.unwrap_or(0)));
                self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await.map(|_| ())
            }
            (Decision::TakeOver, Some(mut lease)) => {
                let old = lease.spec.take().unwrap_or_default();
                lease.spec = Some(self.spec(now, None, old.lease_transitions.unwrap_or(0) + 1));
                self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await.map(|_| ())
            }
            _ => return Ok(false),
        };
        match result {
            Ok(()) => Ok(true),
            // Someone else wrote first (create or replace raced): not the leader.
            Err(Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Waits until this candidate holds the Lease.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election round failed"),
            }
            tokio::time::sleep(self.cfg.renew_every).await;
        }
    }

    /// Renews until a renewal has been impossible for a whole lease duration; returns
    /// then (leadership must be assumed lost).
    pub async fn keep(&self) {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.cfg.renew_every).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => return,
                Err(e) => tracing::warn!(error = %e, "lease renewal failed"),
            }
            // Stop a little before expiry, not after: another replica may take over
            // the moment it expires.
            if last_ok.elapsed() + self.cfg.renew_every >= self.cfg.lease_duration {
                return;
            }
        }
    }

    /// Gives the Lease up on shutdown so a successor need not wait for expiry.
    pub async fn release(&self) {
        if let Ok(Some(mut lease)) = self.api.get_opt(&self.cfg.name).await
            && lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref())
                == Some(self.cfg.identity.as_str())
        {
            if let Some(s) = lease.spec.as_mut() {
                s.holder_identity = None;
            }
            let _ = self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, renewed_secs_ago: i64, duration: i32) -> LeaseSpec {
        let now = Timestamp::now();
        LeaseSpec {
            holder_identity: holder.map(String::from),
            lease_duration_seconds: Some(duration),
            renew_time: Some(MicroTime(now - SignedDuration::from_secs(renewed_secs_ago))),
            ..Default::default()
        }
    }

    #[test]
    fn decisions() {
        let now = Timestamp::now();
        assert_eq!(decide(None, "a", now), Decision::Create);
        assert_eq!(decide(Some(&lease(Some("a"), 1, 15)), "a", now), Decision::Renew);
        assert_eq!(decide(Some(&lease(Some("b"), 1, 15)), "a", now), Decision::Wait { holder: "b".into() });
        assert_eq!(decide(Some(&lease(Some("b"), 16, 15)), "a", now), Decision::TakeOver);
        assert_eq!(decide(Some(&lease(None, 1, 15)), "a", now), Decision::TakeOver, "released");
        let never_renewed = LeaseSpec { holder_identity: Some("b".into()), ..Default::default() };
        assert_eq!(decide(Some(&never_renewed), "a", now), Decision::TakeOver);
    }
}
