//! DKIM keys the operator makes for a `MailDomain` and rotates.
//!
//! Each key is a Secret of its own (`dkim.key`, PEM), owned by the MailDomain,
//! made once and never changed: which key signs is decided from what DNS shows,
//! so the keys need no mutable state outside their own Secrets and the
//! MailDomain's status. The rules ([`plan`]):
//!
//! - A key signs only once the operator's resolver sees its record. The newest
//!   such key signs; the one signing before keeps signing while DNS cannot be
//!   asked or drops its record for a moment.
//! - A new key is made when there is none, when the newest is older than
//!   `rotationDays` and already signs, when `algorithm` changes, and once per
//!   new value of the `mailcluster.dev/rotate-dkim` annotation. Until its record
//!   is seen it is listed in status as `DKIM (next)` and mail is signed with the
//!   key before it.
//! - A key replaced by a newer one stays listed as `DKIM (retired)` for
//!   `graceDays` after the newer one started signing: verifiers of mail signed
//!   just before still find it. Then it is `Expired` and no longer listed; its
//!   Secret stays until someone deletes it, or the MailDomain goes (the operator
//!   never deletes Secrets).
//!
//! The signing key is written into the cluster's store, where every mail pod
//! reads it within seconds ([`mailcluster_server::dkim::STORED_KEYS_REFRESH`]):
//! a rotation restarts nothing.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::{Client, Resource, ResourceExt};
use mailcluster_api::accounts::{DkimAlgorithm, DomainDkim, DomainDkimStatus, DomainKeyStatus, MailDomain};

/// The label that marks a key Secret, valued with its MailDomain's uid (a
/// name may be longer than a label value can be).
pub const DOMAIN_LABEL: &str = "mailcluster.dev/dkim-for";
const SELECTOR_ANNOTATION: &str = "mailcluster.dev/dkim-selector";
const ALGORITHM_ANNOTATION: &str = "mailcluster.dev/dkim-algorithm";
/// The key of the private key in a key Secret.
pub const SECRET_KEY: &str = "dkim.key";

pub const PENDING: &str = "Pending";
pub const SIGNING: &str = "Signing";
pub const RETIRED: &str = "Retired";
pub const EXPIRED: &str = "Expired";

/// A key the operator made, as its Secret holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct MadeKey {
    pub selector: String,
    pub algorithm: DkimAlgorithm,
    pub secret_name: String,
    pub created: Timestamp,
    pub private_pem: String,
}

/// What [`plan`] decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Make a new key now.
    pub make: bool,
    /// The status of the keys given, oldest first (states and retirement).
    pub status: DomainDkimStatus,
}

/// The keys' states, which key signs, and whether to make a new one, from the
/// keys (oldest first), the last status, whether DNS shows each key's record
/// (`None`: could not be asked), and the annotation's value.
pub fn plan(
    spec: &DomainDkim,
    keys: &[MadeKey],
    old: &DomainDkimStatus,
    published: impl Fn(&str) -> Option<bool>,
    rotate_request: Option<&str>,
    now: Timestamp,
) -> Plan {
    let signing = keys.iter().rposition(|k| {
        published(&k.selector) == Some(true) || old.signing.as_deref() == Some(k.selector.as_str())
    });
    let grace = SignedDuration::from_hours(24 * i64::from(spec.grace_days));
    let old_state = |selector: &str| old.keys.iter().find(|k| k.selector == selector);
    let states: Vec<DomainKeyStatus> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let (state, retired_until) = match signing {
                Some(s) if i == s => (SIGNING, None),
                Some(s) if i < s => {
                    // Retired from the moment a newer key was first seen signing.
                    let until = old_state(&k.selector)
                        .and_then(|o| o.retired_until.as_deref())
                        .and_then(|t| t.parse::<Timestamp>().ok())
                        .unwrap_or_else(|| now.saturating_add(grace).unwrap_or(now));
                    (if until <= now { EXPIRED } else { RETIRED }, Some(until.to_string()))
                }
                _ => (PENDING, None),
            };
            DomainKeyStatus {
                selector: k.selector.clone(),
                algorithm: k.algorithm,
                secret_name: k.secret_name.clone(),
                created: k.created.to_string(),
                state: state.into(),
                retired_until,
            }
        })
        .collect();
    let newest = keys.last();
    let requested = rotate_request.is_some_and(|r| old.rotation_request.as_deref() != Some(r));
    let kind_changed = newest.is_some_and(|k| k.algorithm != spec.algorithm);
    let due = match (spec.rotation_days, newest, signing) {
        (Some(days), Some(k), Some(s)) if s + 1 == keys.len() => {
            let age = now.duration_since(k.created);
            age >= SignedDuration::from_hours(24 * i64::from(days))
        }
        _ => false,
    };
    Plan {
        make: keys.is_empty() || requested || kind_changed || due,
        status: DomainDkimStatus {
            signing: signing.map(|s| keys[s].selector.clone()),
            keys: states,
            rotation_request: rotate_request.map(str::to_string).or_else(|| old.rotation_request.clone()),
        },
    }
}

/// The selector of a key made `now`: `PREFIX-YYYYMMDD`, then `-2`, `-3`… when
/// a key of that day exists.
pub fn next_selector(prefix: &str, now: Timestamp, taken: &[&str]) -> String {
    let day = now.strftime("%Y%m%d").to_string();
    let base = format!("{prefix}-{day}");
    if !taken.contains(&base.as_str()) {
        return base;
    }
    (2..).map(|n| format!("{base}-{n}")).find(|s| !taken.contains(&s.as_str())).unwrap_or(base)
}

/// The MailDomain's key Secrets, oldest first. A Secret with the label that
/// the MailDomain does not own (made by someone else) is not one of its keys.
pub async fn list(client: &Client, ns: &str, domain: &MailDomain) -> Result<Vec<MadeKey>, kube::Error> {
    let Some(uid) = domain.uid() else { return Ok(Vec::new()) };
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secrets = api.list(&ListParams::default().labels(&format!("{DOMAIN_LABEL}={uid}"))).await?;
    let mut keys: Vec<MadeKey> = secrets.items.iter().filter_map(|s| made_key(s, &uid)).collect();
    keys.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.selector.cmp(&b.selector)));
    Ok(keys)
}

fn made_key(secret: &Secret, owner_uid: &str) -> Option<MadeKey> {
    let owned = secret.owner_references().iter().any(|o| o.uid == owner_uid && o.controller == Some(true));
    if !owned {
        return None;
    }
    let annotations = secret.annotations();
    let algorithm = match annotations.get(ALGORITHM_ANNOTATION)?.as_str() {
        "ed25519" => DkimAlgorithm::Ed25519,
        "rsa" => DkimAlgorithm::Rsa,
        _ => return None,
    };
    let pem = secret.data.as_ref()?.get(SECRET_KEY)?;
    Some(MadeKey {
        selector: annotations.get(SELECTOR_ANNOTATION)?.clone(),
        algorithm,
        secret_name: secret.name_any(),
        created: secret.metadata.creation_timestamp.as_ref()?.0,
        private_pem: String::from_utf8(pem.0.clone()).ok()?,
    })
}

/// Makes the domain's next key, named by [`next_selector`] after the keys it
/// has; a name whose Secret exists but is not one of its keys (someone else's)
/// is passed over for the next one.
pub async fn make_next(
    client: &Client,
    ns: &str,
    domain: &MailDomain,
    spec: &DomainDkim,
    made: &[MadeKey],
    now: Timestamp,
) -> anyhow::Result<MadeKey> {
    let mut taken: Vec<String> = made.iter().map(|k| k.selector.clone()).collect();
    for _ in 0..8 {
        let names: Vec<&str> = taken.iter().map(String::as_str).collect();
        let selector = next_selector(&spec.selector, now, &names);
        match make(client, ns, domain, &selector, &spec.algorithm).await {
            Err(e) if name_taken(&e) => taken.push(selector),
            made => return made,
        }
    }
    anyhow::bail!("the Secrets of the next eight key names exist and are not keys of this MailDomain")
}

/// Makes a key and its Secret, owned by the MailDomain.
async fn make(
    client: &Client,
    ns: &str,
    domain: &MailDomain,
    selector: &str,
    algorithm: &DkimAlgorithm,
) -> anyhow::Result<MadeKey> {
    let key = mailcluster_server::dkim::generate(algorithm.name())?;
    let uid = domain.uid().ok_or_else(|| anyhow::anyhow!("the MailDomain has no uid yet"))?;
    let owner = domain.controller_owner_ref(&()).ok_or_else(|| anyhow::anyhow!("no owner reference"))?;
    let name = secret_name(&domain.name_any(), selector);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns.to_string()),
            labels: Some(BTreeMap::from([
                (DOMAIN_LABEL.to_string(), uid),
                ("app.kubernetes.io/managed-by".to_string(), "mailcluster-operator".to_string()),
            ])),
            annotations: Some(BTreeMap::from([
                (SELECTOR_ANNOTATION.to_string(), selector.to_string()),
                (ALGORITHM_ANNOTATION.to_string(), algorithm.name().to_string()),
            ])),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        immutable: Some(true),
        data: Some(BTreeMap::from([(
            SECRET_KEY.to_string(),
            ByteString(key.private_pem.clone().into_bytes()),
        )])),
        ..Default::default()
    };
    let made = Api::<Secret>::namespaced(client.clone(), ns).create(&PostParams::default(), &secret).await?;
    tracing::info!(domain = %domain.spec.domain, selector, secret = %name, "made a DKIM key");
    Ok(MadeKey {
        selector: selector.to_string(),
        algorithm: *algorithm,
        secret_name: name,
        created: made.metadata.creation_timestamp.map(|t| t.0).unwrap_or_else(Timestamp::now),
        private_pem: key.private_pem,
    })
}

/// Whether [`make`] failed because a Secret of the key's name exists already.
fn name_taken(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code == 409)
}

/// `NAME-dkim-SELECTOR`, cut to a valid object name (253 characters) keeping
/// the selector, which tells the Secrets apart.
fn secret_name(domain_name: &str, selector: &str) -> String {
    let tail = format!("-dkim-{selector}");
    let room = 253usize.saturating_sub(tail.len());
    let head: String = domain_name.chars().take(room).collect();
    format!("{}{tail}", head.trim_end_matches(['-', '.']))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rotation_days: Option<u32>) -> DomainDkim {
        DomainDkim { selector: "mc".into(), algorithm: DkimAlgorithm::Ed25519, rotation_days, grace_days: 7 }
    }

    fn at(t: &str) -> Timestamp {
        t.parse().unwrap()
    }

    fn key(selector: &str, created: &str) -> MadeKey {
        MadeKey {
            selector: selector.into(),
            algorithm: DkimAlgorithm::Ed25519,
            secret_name: format!("d-dkim-{selector}"),
            created: at(created),
            private_pem: String::new(),
        }
    }

    fn states(p: &Plan) -> Vec<(&str, &str)> {
        p.status.keys.iter().map(|k| (k.selector.as_str(), k.state.as_str())).collect()
    }

    const NOW: &str = "2026-12-07T12:00:00Z";

    #[test]
    fn the_first_key_is_made_and_signs_only_once_dns_shows_it() {
        let none = plan(&spec(None), &[], &Default::default(), |_| None, None, at(NOW));
        assert!(none.make, "no key: make one");
        assert_eq!(none.status.signing, None);
        let keys = [key("mc-20261207", "2026-12-07T11:00:00Z")];
        let unseen = plan(&spec(None), &keys, &Default::default(), |_| Some(false), None, at(NOW));
        assert!(!unseen.make);
        assert_eq!(unseen.status.signing, None, "its record is not in DNS: nothing signs");
        assert_eq!(states(&unseen), [("mc-20261207", PENDING)]);
        let seen = plan(&spec(None), &keys, &unseen.status, |_| Some(true), None, at(NOW));
        assert_eq!(seen.status.signing.as_deref(), Some("mc-20261207"));
        assert_eq!(states(&seen), [("mc-20261207", SIGNING)]);
        // DNS cannot be asked, or lost the record a moment: the key keeps signing
        for answer in [None, Some(false)] {
            let later = plan(&spec(None), &keys, &seen.status, |_| answer, None, at(NOW));
            assert_eq!(later.status.signing.as_deref(), Some("mc-20261207"), "{answer:?}");
        }
        // without rotationDays a key is never replaced by age
        let old = plan(&spec(None), &keys, &seen.status, |_| Some(true), None, at("2030-01-01T00:00:00Z"));
        assert!(!old.make);
    }

    #[test]
    fn rotation_publishes_the_next_key_first_and_retires_the_old_one_after_the_grace() {
        let s = spec(Some(30));
        let first = key("mc-20261101", "2026-11-01T00:00:00Z");
        let signing = DomainDkimStatus { signing: Some(first.selector.clone()), ..Default::default() };
        let young = plan(
            &s,
            std::slice::from_ref(&first),
            &signing,
            |_| Some(true),
            None,
            at("2026-11-30T23:00:00Z"),
        );
        assert!(!young.make, "29 days old");
        let due = plan(&s, std::slice::from_ref(&first), &signing, |_| Some(true), None, at(NOW));
        assert!(due.make, "36 days old and signing");

        let next = key("mc-20261207", "2026-12-07T12:00:00Z");
        let keys = [first.clone(), next.clone()];
        let only_first = |sel: &str| Some(sel == "mc-20261101");
        let waiting = plan(&s, &keys, &due.status, only_first, None, at("2026-12-08T00:00:00Z"));
        assert!(!waiting.make, "the next key waits for DNS: no third key");
        assert_eq!(waiting.status.signing.as_deref(), Some("mc-20261101"), "the old key signs meanwhile");
        assert_eq!(states(&waiting), [("mc-20261101", SIGNING), ("mc-20261207", PENDING)]);

        let switched = plan(&s, &keys, &waiting.status, |_| Some(true), None, at("2026-12-09T00:00:00Z"));
        assert_eq!(switched.status.signing.as_deref(), Some("mc-20261207"));
        assert_eq!(states(&switched), [("mc-20261101", RETIRED), ("mc-20261207", SIGNING)]);
        let until = switched.status.keys[0].retired_until.clone().unwrap();
        assert_eq!(until.parse::<Timestamp>().unwrap(), at("2026-12-16T00:00:00Z"), "seven days' grace");

        // the retirement date holds across reconciles, then the key expires
        let day_later = plan(&s, &keys, &switched.status, |_| Some(true), None, at("2026-12-10T00:00:00Z"));
        assert_eq!(day_later.status.keys[0].retired_until.as_deref(), Some(until.as_str()));
        let after = plan(&s, &keys, &day_later.status, |_| Some(true), None, at("2026-12-16T00:00:01Z"));
        assert_eq!(states(&after), [("mc-20261101", EXPIRED), ("mc-20261207", SIGNING)]);
        assert!(!after.make, "the new key is young");
    }

    #[test]
    fn a_rotation_request_or_a_new_algorithm_makes_one_key() {
        let keys = [key("mc-20261207", "2026-12-07T11:00:00Z")];
        let signing = DomainDkimStatus { signing: Some("mc-20261207".into()), ..Default::default() };
        let asked = plan(&spec(None), &keys, &signing, |_| Some(true), Some("1"), at(NOW));
        assert!(asked.make);
        assert_eq!(asked.status.rotation_request.as_deref(), Some("1"));
        let again = plan(&spec(None), &keys, &asked.status, |_| Some(true), Some("1"), at(NOW));
        assert!(!again.make, "one key per request value");
        let mut rsa = spec(None);
        rsa.algorithm = DkimAlgorithm::Rsa;
        assert!(plan(&rsa, &keys, &again.status, |_| Some(true), Some("1"), at(NOW)).make);
        let mut made = keys.to_vec();
        made.push(MadeKey { algorithm: DkimAlgorithm::Rsa, ..key("mc-20261207-2", NOW) });
        assert!(!plan(&rsa, &made, &again.status, |_| Some(true), Some("1"), at(NOW)).make, "made already");
    }

    #[test]
    fn selectors_carry_the_day_and_never_repeat() {
        let now = at(NOW);
        assert_eq!(next_selector("mc", now, &[]), "mc-20261207");
        assert_eq!(next_selector("mc", now, &["mc-20261207"]), "mc-20261207-2");
        assert_eq!(next_selector("mc", now, &["mc-20261207", "mc-20261207-2"]), "mc-20261207-3");
        assert_eq!(secret_name("example-com", "mc-20261207"), "example-com-dkim-mc-20261207");
        let long = secret_name(&"a".repeat(300), "mc-20261207");
        assert!(long.len() <= 253 && long.ends_with("-dkim-mc-20261207"), "{long}");
    }
}
