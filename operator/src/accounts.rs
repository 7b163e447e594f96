//! `MailDomain` and `MailAccount` reconcilers: each object is written into the
//! store of the `MailCluster` it names (`spec.clusterRef`, same namespace)
//! through `mailcluster_server::provision`, the code the CLI's `domain`, `user`,
//! `alias` and `senders` commands run.
//!
//! The operator connects to the cluster's PostgreSQL itself, with the URL from
//! the Secret the MailCluster names (`spec.postgres.urlSecretRef`): the writes are
//! a handful of statements, and a status that says at once why an account is
//! not ready needs the answer in the reconcile, which a Job per change would
//! delay by a pod start. One small pool per cluster is kept and reopened when
//! the URL changes.
//!
//! Password Secrets are watched by their metadata only (name and
//! `resourceVersion`; the value is read by name when a MailAccount naming the
//! Secret is reconciled): a changed Secret reconciles the MailAccounts that
//! reference it at once, and a `resourceVersion` other than the one in the
//! account's status is hashed and stored. The server's credential cache is
//! keyed by the stored hash, so the old password stops working as soon as the
//! new hash is stored; the pods' cached recipient entries and credentials of a
//! changed account are dropped through the cluster's Redis, as the CLI does.
//! [`AccountOptions::resync`] reconciles every object again in case a watch
//! event was missed.
//!
//! A MailAccount's `spec.sieve` is the account's script named `kubernetes`,
//! checked by the interpreter the pods run before it is stored and made the
//! active one (its condition `SieveScript` says why not); ConfigMaps are
//! watched by their metadata as password Secrets are.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::reflector::{ObjectRef, Store as Reflected};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use mailcluster_api::accounts::{
    ACCOUNT_FINALIZER, DeletionPolicy, DkimRecord, DnsInputs, DnsRecord, MANAGED_SIEVE_SCRIPT, MailAccount,
    MailAccountStatus, MailDomain, MailDomainStatus, ROTATE_DKIM_ANNOTATION, SieveSource, dns_records,
};
use mailcluster_api::{AccountsPolicy, FIELD_MANAGER, MailCluster, UNMANAGED_LISTED, UnmanagedAccounts};
use mailcluster_model::DomainKey;
use mailcluster_server::provision::{self, PasswordSource, ProvisionError, WantedAccount};
use mailcluster_server::store::{Store, StoreError};
use serde_json::json;
use tokio::sync::Mutex;

use crate::dns_check::RecordChecker;
use crate::domain_keys;

/// How the store reconcilers run.
#[derive(Debug, Clone)]
pub struct AccountOptions {
    /// Watch only this namespace; None = all namespaces.
    pub namespace: Option<String>,
    /// Every object is reconciled again after this long (a changed password
    /// Secret is noticed through its watch, within a second or so).
    pub resync: Duration,
    /// Nameservers the MailDomains' records are checked at; empty: the
    /// system's (in a pod, the cluster's resolver).
    pub dns_nameservers: Vec<std::net::SocketAddr>,
    /// A MailDomain's records are looked up again after this long (and at once
    /// when the list changes).
    pub dns_check: Duration,
}

impl Default for AccountOptions {
    fn default() -> Self {
        AccountOptions {
            namespace: None,
            resync: Duration::from_secs(60),
            dns_nameservers: Vec::new(),
            dns_check: Duration::from_secs(300),
        }
    }
}

/// Connections each cluster's store pool may hold: reconciles are few and short.
const POOL_SIZE: u32 = 2;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The open store of each (namespace, MailCluster), with the URL it was opened
/// with: a changed URL Secret opens a new one.
type Stores = HashMap<(String, String), (String, Arc<dyn Store>)>;

/// What a reconcile needs: the client and one store per (namespace, cluster).
pub struct AccountContext {
    client: Client,
    resync: Duration,
    stores: Mutex<Stores>,
    /// None when no resolver could be set up: records stay `Unknown`.
    dns: Option<RecordChecker>,
    dns_check: Duration,
}

impl AccountContext {
    pub fn new(client: Client, opts: &AccountOptions) -> Self {
        let dns = RecordChecker::new(&opts.dns_nameservers)
            .inspect_err(|e| tracing::warn!(error = %e, "DNS records of MailDomains will not be checked"))
            .ok();
        AccountContext {
            client,
            resync: opts.resync,
            stores: Mutex::new(HashMap::new()),
            dns,
            dns_check: opts.dns_check,
        }
    }

    /// The store of MailCluster `name` in `ns`, or why it cannot be reached as a
    /// not-ready reason and message.
    async fn store(&self, ns: &str, name: &str) -> Result<Arc<dyn Store>, NotReady> {
        let clusters: Api<MailCluster> = Api::namespaced(self.client.clone(), ns);
        let key = (ns.to_string(), name.to_string());
        let cluster = clusters.get_opt(name).await.map_err(|e| {
            NotReady::retry("ClusterUnreadable", format!("cannot read MailCluster {name}: {e}"))
        })?;
        let Some(cluster) = cluster else {
            // A cluster gone takes its pool with it: no idle connections kept to a
            // database nothing serves any more.
            self.stores.lock().await.remove(&key);
            return Err(NotReady::retry("ClusterMissing", format!("no MailCluster {name} in {ns}")));
        };
        let secret_ref = &cluster.spec.postgres.url_secret_ref;
        let url = secret_value(&self.client, ns, &secret_ref.name, &secret_ref.key).await?;
        let mut stores = self.stores.lock().await;
        if let Some((known, store)) = stores.get(&key)
            && *known == url
        {
            return Ok(store.clone());
        }
        let store = mailcluster_server::store::open(
            Some(&url),
            std::path::Path::new("."),
            POOL_SIZE,
            CONNECT_TIMEOUT,
        )
        .await
        .map_err(|e| NotReady::retry("StoreUnavailable", format!("cannot open the store of {name}: {e}")))?;
        stores.insert(key, (url, store.clone()));
        Ok(store)
    }
}

/// Drops what the cluster's pods cached about a changed account, as the CLI
/// does: SMTP recipient entries of `recipients` (so a disabled account or a
/// removed alias is refused now, not when the entry expires) and the verified
/// credentials of `account_ids`. Redis tells every pod to drop its own copy.
/// Failing is a warning: the change is stored, and the entries expire.
async fn forget_cached(client: &Client, ns: &str, cluster: &str, account_ids: &[i64], recipients: &[String]) {
    if account_ids.is_empty() && recipients.is_empty() {
        return;
    }
    let forget = async {
        let mc = Api::<MailCluster>::namespaced(client.clone(), ns)
            .get_opt(cluster)
            .await?
            .ok_or_else(|| anyhow::anyhow!("no MailCluster {cluster}"))?;
        let redis = &mc.spec.redis.url_secret_ref;
        let url = secret_value(client, ns, &redis.name, &redis.key)
            .await
            .map_err(|e| anyhow::anyhow!(e.message))?;
        let prefix = crate::build::pod_config::redis_key_prefix(&mc);
        let cache = mailcluster_server::cache::open(Some(&url), &prefix, CONNECT_TIMEOUT).await?;
        mailcluster_server::provision::forget_cached(cache.as_ref(), account_ids, recipients).await?;
        anyhow::Ok(())
    };
    if let Err(e) = forget.await {
        tracing::warn!(error = %format!("{e:#}"), "cannot clear cached entries; they expire by themselves");
    }
}

/// A Secret key's value as text, or a not-ready reason.
async fn secret_value(client: &Client, ns: &str, name: &str, key: &str) -> Result<String, NotReady> {
    Ok(secret_with_version(client, ns, name, key).await?.0)
}

/// A Secret key's value and the Secret's `resourceVersion`.
async fn secret_with_version(
    client: &Client,
    ns: &str,
    name: &str,
    key: &str,
) -> Result<(String, String), NotReady> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret = secrets
        .get_opt(name)
        .await
        .map_err(|e| NotReady::retry("SecretUnreadable", format!("cannot read Secret {name}: {e}")))?
        .ok_or_else(|| NotReady::retry("SecretMissing", format!("Secret {name} not found")))?;
    let version = secret.resource_version().unwrap_or_default();
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8(b.0.clone()))
        .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(key)).cloned().map(Ok))
        .ok_or_else(|| NotReady::retry("SecretMissing", format!("Secret {name} has no key {key}")))?
        .map_err(|_| NotReady::retry("SecretInvalid", format!("Secret {name} key {key} is not UTF-8")))?;
    Ok((value, version))
}

/// Why an object is not ready: its condition's reason and message, and whether
/// trying again soon may help (a Secret or cluster that may yet appear) or only a
/// change of the object will (a hash format the server cannot verify).
#[derive(Debug)]
pub struct NotReady {
    pub reason: String,
    pub message: String,
    pub retry: bool,
}

impl NotReady {
    fn retry(reason: &str, message: String) -> Self {
        NotReady { reason: reason.into(), message, retry: true }
    }

    fn from_provision(e: ProvisionError) -> Self {
        match e {
            ProvisionError::Invalid(m) => NotReady { reason: "Invalid".into(), message: m, retry: false },
            ProvisionError::Store(StoreError::NotFound(m)) => NotReady::retry("DomainMissing", m),
            ProvisionError::Store(StoreError::Invalid(m)) => {
                NotReady { reason: "Invalid".into(), message: m, retry: false }
            }
            e => NotReady::retry("StoreError", e.to_string()),
        }
    }
}

/// The error type of the reconcilers (the controller logs it and retries).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("finalizer: {0}")]
    Finalizer(String),
    #[error("{0}")]
    Cleanup(String),
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

/// The `Ready` condition, its transition time kept when its status is unchanged.
fn ready(old: &[Condition], generation: Option<i64>, status: bool, reason: &str, message: &str) -> Condition {
    condition(old, "Ready", generation, if status { "True" } else { "False" }, reason, message)
}

/// A condition of `type_`, its transition time kept when its status is unchanged.
fn condition(
    old: &[Condition],
    type_: &str,
    generation: Option<i64>,
    status: &str,
    reason: &str,
    message: &str,
) -> Condition {
    let since = old
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(k8s_openapi::jiff::Timestamp::now()));
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: since,
    }
}

async fn apply_status<K>(api: &Api<K>, obj: &K, status: serde_json::Value) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(&obj.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await?;
    Ok(())
}

// ---------------------------------------------------------------- MailDomain

async fn reconcile_domain(domain: Arc<MailDomain>, ctx: Arc<AccountContext>) -> Result<Action, Error> {
    let ns = domain.namespace().unwrap_or_default();
    let api: Api<MailDomain> = Api::namespaced(ctx.client.clone(), &ns);
    let old = domain.status.clone().unwrap_or_default();
    let generation = domain.metadata.generation;
    let cluster: Api<MailCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let mc = cluster.get_opt(&domain.spec.cluster_ref).await?;
    let mx_host = match &mc {
        Some(mc) => mc.spec.hostname(),
        None => format!("mail.{}", domain.spec.domain),
    };
    // The DKIM records: the cluster's key for the domain, or the keys made here.
    let cluster_key = match &mc {
        Some(mc) => cluster_dkim_txt(&ctx.client, &ns, mc, &domain).await,
        None => None,
    };
    let wanted =
        domain.spec.dkim.as_ref().filter(|_| mc.as_ref().is_some_and(|mc| !has_cluster_key(mc, &domain)));
    let mut made = match wanted {
        Some(_) => domain_keys::list(&ctx.client, &ns, &domain).await?,
        None => Vec::new(),
    };
    let made_txt = |keys: &[domain_keys::MadeKey]| -> Vec<(String, String)> {
        keys.iter()
            .filter_map(|k| {
                match mailcluster_server::dkim::public_txt(k.private_pem.as_bytes(), k.algorithm.name()) {
                    Ok(txt) => Some((k.selector.clone(), txt)),
                    Err(e) => {
                        tracing::warn!(secret = %k.secret_name, error = %e, "a made DKIM key does not parse");
                        None
                    }
                }
            })
            .collect()
    };
    // Every made key's record is looked up first; which one signs follows.
    let mut txts = made_txt(&made);
    let dkim_inputs: Vec<DkimRecord<'_>> = match &cluster_key {
        Some((selector, txt)) => vec![DkimRecord { selector, txt, purpose: "DKIM" }],
        None => txts.iter().map(|(selector, txt)| DkimRecord { selector, txt, purpose: "DKIM" }).collect(),
    };
    let mut records = dns_records(&domain.spec, &DnsInputs { mx_host: &mx_host, dkim: dkim_inputs });
    check_records(&ctx, &old.dns_records, &mut records).await;
    let mut dkim_status = None;
    let mut key_error = None;
    if let Some(spec) = wanted {
        let published = |selector: &str| {
            let name = format!("{selector}._domainkey.");
            records.iter().find(|r| r.type_ == "TXT" && r.name.starts_with(&name)).and_then(|r| {
                match r.published.as_str() {
                    "True" => Some(true),
                    "False" => Some(false),
                    _ => None,
                }
            })
        };
        let old_dkim = old.dkim.clone().unwrap_or_default();
        let request = domain.annotations().get(ROTATE_DKIM_ANNOTATION).map(String::as_str);
        let now = k8s_openapi::jiff::Timestamp::now();
        let mut plan = domain_keys::plan(spec, &made, &old_dkim, published, request, now);
        if plan.make {
            match domain_keys::make_next(&ctx.client, &ns, &domain, spec, &made, now).await {
                Ok(key) => {
                    txts.extend(made_txt(std::slice::from_ref(&key)));
                    made.push(key);
                    plan = domain_keys::plan(spec, &made, &plan.status, published, request, now);
                }
                Err(e) => {
                    tracing::warn!(domain = %domain.spec.domain, error = %e, "cannot make a DKIM key");
                    key_error = Some(format!("cannot make a DKIM key: {e:#}"));
                }
            }
        }
        let listed: Vec<DkimRecord<'_>> = plan
            .status
            .keys
            .iter()
            .filter_map(|k| {
                let purpose = match k.state.as_str() {
                    domain_keys::SIGNING => "DKIM",
                    domain_keys::PENDING => "DKIM (next)",
                    domain_keys::RETIRED => "DKIM (retired)",
                    _ => return None,
                };
                let (selector, txt) = txts.iter().find(|(s, _)| *s == k.selector)?;
                Some(DkimRecord { selector, txt, purpose })
            })
            .collect();
        let checked = std::mem::take(&mut records);
        records = dns_records(&domain.spec, &DnsInputs { mx_host: &mx_host, dkim: listed });
        check_records(&ctx, &checked, &mut records).await;
        dkim_status = Some(plan.status);
    }
    let signing = dkim_status.as_ref().and_then(|status| {
        let selector = status.signing.as_deref()?;
        made.iter().find(|k| k.selector == selector)
    });
    let outcome = async {
        let store = ctx.store(&ns, &domain.spec.cluster_ref).await?;
        let provision_error = |e: StoreError| NotReady::from_provision(e.into());
        provision::ensure_domain(&*store, &domain.spec.domain).await.map_err(NotReady::from_provision)?;
        let quota = domain.spec.quota_bytes.map(|q| q.max(0) as u64);
        let current = store.domain_quota(&domain.spec.domain).await.map_err(provision_error)?;
        if current != quota {
            store.domain_set_quota(&domain.spec.domain, quota).await.map_err(provision_error)?;
        }
        let key = signing.map(|k| DomainKey {
            domain: domain.spec.domain.clone(),
            selector: k.selector.clone(),
            algorithm: k.algorithm.name().to_string(),
            private_pem: k.private_pem.clone(),
        });
        provision::set_domain_key(&*store, &domain.spec.domain, key.as_ref())
            .await
            .map_err(NotReady::from_provision)?;
        provision::set_catch_all(&*store, &domain.spec.domain, domain.spec.catch_all.as_deref())
            .await
            .map_err(|e| match e {
                ProvisionError::Store(StoreError::NotFound(what)) => NotReady {
                    reason: "CatchAllUnknown".into(),
                    message: format!("catchAll: {what} is not in the store"),
                    retry: true,
                },
                e => NotReady::from_provision(e),
            })?;
        Ok::<(), NotReady>(())
    }
    .await;
    let (ready_condition, action) = match &outcome {
        Ok(()) => (
            ready(&old.conditions, generation, true, "Stored", "in the store"),
            Action::requeue(ctx.resync.min(ctx.dns_check)),
        ),
        Err(e) => (
            ready(&old.conditions, generation, false, &e.reason, &e.message),
            Action::requeue(if e.retry { Duration::from_secs(10) } else { ctx.resync }),
        ),
    };
    let published = published_condition(&old.conditions, generation, &records);
    let mut conditions = vec![ready_condition, published];
    if let Some(dkim) = &dkim_status {
        let (state, reason, message) = match (&key_error, &dkim.signing) {
            (Some(e), _) => ("False", "KeyNotMade", e.clone()),
            (None, Some(selector)) => ("True", "Signing", format!("mail is signed with selector {selector}")),
            (None, None) => (
                "False",
                "NotPublished",
                "no key's record is seen in DNS yet: publish the DKIM record".into(),
            ),
        };
        conditions.push(condition(&old.conditions, "DkimSigning", generation, state, reason, &message));
    }
    let status = MailDomainStatus {
        conditions,
        observed_generation: generation,
        dns_records: records,
        dkim: dkim_status,
    };
    if old != status {
        apply_status(&api, &*domain, serde_json::to_value(&status).unwrap_or_default()).await?;
    }
    Ok(action)
}

/// Fills in `published` and `lastChecked` of `records`: carried over from the
/// last status for a record unchanged and checked less than `dns_check` ago,
/// looked up now for the others (all at once; a domain has a handful).
async fn check_records(ctx: &AccountContext, old: &[DnsRecord], records: &mut [DnsRecord]) {
    let now = k8s_openapi::jiff::Timestamp::now();
    let fresh = |r: &DnsRecord| {
        r.last_checked
            .as_deref()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .and_then(|checked| Duration::try_from(now.duration_since(checked)).ok())
            .is_some_and(|age| age < ctx.dns_check)
    };
    let mut due = Vec::new();
    for (i, record) in records.iter_mut().enumerate() {
        let known =
            old.iter().find(|o| o.name == record.name && o.type_ == record.type_ && o.value == record.value);
        match known {
            Some(o) if fresh(o) => {
                record.published = o.published.clone();
                record.last_checked = o.last_checked.clone();
            }
            _ => due.push(i),
        }
    }
    let Some(checker) = &ctx.dns else { return };
    let answers = futures::future::join_all(due.iter().map(|&i| checker.published(&records[i]))).await;
    let checked = now.to_string();
    for (i, published) in due.into_iter().zip(answers) {
        records[i].published = published.into();
        records[i].last_checked = Some(checked.clone());
    }
}

/// `DnsPublished`: True when the resolver sees every record, False naming those
/// it does not, Unknown while some could not be checked.
fn published_condition(old: &[Condition], generation: Option<i64>, records: &[DnsRecord]) -> Condition {
    let missing: Vec<&str> =
        records.iter().filter(|r| r.published == "False").map(|r| r.purpose.as_str()).collect();
    let unknown = records.iter().filter(|r| r.published != "True" && r.published != "False").count();
    let (status, reason, message) = if !missing.is_empty() {
        ("False", "NotPublished", format!("not seen in DNS: {}", missing.join(", ")))
    } else if unknown > 0 {
        ("Unknown", "NotChecked", format!("{unknown} record(s) could not be checked"))
    } else {
        ("True", "Published", "every record is seen in DNS".to_string())
    };
    condition(old, "DnsPublished", generation, status, reason, &message)
}

/// Whether the MailCluster's `spec.dkim` holds a key for the domain: then that
/// key signs (a file in every pod) and the operator makes none.
fn has_cluster_key(mc: &MailCluster, domain: &MailDomain) -> bool {
    mc.spec.dkim.iter().any(|k| k.domain.eq_ignore_ascii_case(&domain.spec.domain))
}

/// The selector and record value of the key the MailCluster signs the domain's
/// mail with (`spec.dkim`, a Secret with the private key), when its selector is
/// the MailDomain's. None when there is no such key or it cannot be read; the
/// record is then not listed rather than listed wrong.
async fn cluster_dkim_txt(
    client: &Client,
    ns: &str,
    mc: &MailCluster,
    domain: &MailDomain,
) -> Option<(String, String)> {
    let wanted = domain.spec.dkim.as_ref()?;
    let key = mc
        .spec
        .dkim
        .iter()
        .find(|k| k.domain.eq_ignore_ascii_case(&domain.spec.domain) && k.selector == wanted.selector)?;
    let pem = secret_value(client, ns, &key.secret_name, &key.secret_key).await.ok()?;
    match mailcluster_server::dkim::public_txt(pem.as_bytes(), key.algorithm.name()) {
        Ok(txt) => Some((key.selector.clone(), txt)),
        Err(e) => {
            tracing::warn!(domain = %domain.spec.domain, error = %e, "cannot read the DKIM key");
            None
        }
    }
}

// ---------------------------------------------------------------- MailAccount

async fn reconcile_account(account: Arc<MailAccount>, ctx: Arc<AccountContext>) -> Result<Action, Error> {
    let ns = account.namespace().unwrap_or_default();
    let api: Api<MailAccount> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, ACCOUNT_FINALIZER, account, |event| async {
        match event {
            Event::Apply(account) => apply_account(&account, &ctx).await,
            Event::Cleanup(account) => cleanup_account(&account, &ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        e => Error::Finalizer(e.to_string()),
    })
}

async fn apply_account(account: &MailAccount, ctx: &AccountContext) -> Result<Action, Error> {
    let ns = account.namespace().unwrap_or_default();
    let api: Api<MailAccount> = Api::namespaced(ctx.client.clone(), &ns);
    let old = account.status.clone().unwrap_or_default();
    let generation = account.metadata.generation;
    let mut secret_version = old.password_secret_version.clone();
    let (mut used_bytes, mut quota_bytes, mut last_login) =
        (old.used_bytes, old.quota_bytes, old.last_login.clone());
    // The SieveScript condition as it was, unless this reconcile gets there.
    let mut sieve: Option<Result<(), NotReady>> = None;
    let outcome = async {
        let spec = &account.spec;
        let store = ctx.store(&ns, &spec.cluster_ref).await?;
        let secret = &spec.password_secret_ref;
        let (value, version) = secret_with_version(&ctx.client, &ns, &secret.name, &secret.key).await?;
        let password = PasswordSource::from_secret(&value).map_err(|e| match e {
            ProvisionError::Invalid(m) => {
                NotReady { reason: "UnsupportedPassword".into(), message: m, retry: false }
            }
            e => NotReady::from_provision(e),
        })?;
        // An unchanged Secret is not hashed or verified again (argon2 on every
        // resync of every account would cost a core).
        let exists =
            store.account_get(&spec.address).await.map_err(|e| NotReady::from_provision(e.into()))?;
        let password_known = old.password_secret_version.as_deref() == Some(&version) && exists.is_some();
        let wanted = WantedAccount {
            email: spec.address.clone(),
            password: (!password_known).then_some(password),
            quota: Some(spec.quota_bytes.map(|q| q.max(0) as u64)),
            enabled: Some(spec.enabled),
            display_name: Some(spec.display_name.clone()),
            aliases: Some(spec.aliases.clone()),
            send_as: Some(spec.send_as.clone()),
        };
        let change = provision::apply_account(&*store, &wanted).await.map_err(NotReady::from_provision)?;
        if change.changed() {
            tracing::info!(account = %change.account.email, created = change.created,
                password = change.password_changed, "account written to the store");
            let ids: Vec<i64> = if change.password_changed { vec![change.account.id] } else { vec![] };
            forget_cached(&ctx.client, &ns, &spec.cluster_ref, &ids, &change.changed_recipients).await;
        }
        secret_version = Some(version);
        // What the status reports besides readiness; a failed read keeps the last figures.
        match store.quota(change.account.id).await {
            Ok(quota) => {
                used_bytes = Some(i64::try_from(quota.used).unwrap_or(i64::MAX));
                quota_bytes = quota.limit().map(|l| i64::try_from(l).unwrap_or(i64::MAX));
            }
            Err(e) => tracing::debug!(account = %spec.address, error = %e, "cannot read the usage"),
        }
        match store.account_last_login(&spec.address).await {
            Ok(at) => last_login = at.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
            Err(e) => tracing::debug!(account = %spec.address, error = %e, "cannot read the last login"),
        }
        sieve = sync_sieve(&ctx.client, &ns, &*store, change.account.id, spec.sieve.as_ref()).await;
        Ok::<(), NotReady>(())
    }
    .await;
    let (condition, action) = match &outcome {
        Ok(()) => {
            (ready(&old.conditions, generation, true, "Stored", "in the store"), Action::requeue(ctx.resync))
        }
        Err(e) => (
            ready(&old.conditions, generation, false, &e.reason, &e.message),
            Action::requeue(if e.retry { Duration::from_secs(10) } else { ctx.resync }),
        ),
    };
    let mut conditions = vec![condition];
    let old_sieve = old.conditions.iter().find(|c| c.type_ == "SieveScript").cloned();
    match (&account.spec.sieve, sieve) {
        (None, _) => {}
        (Some(_), Some(Ok(()))) => conditions.push(crate::accounts::condition(
            &old.conditions,
            "SieveScript",
            generation,
            "True",
            "Active",
            "stored and active",
        )),
        (Some(_), Some(Err(e))) => conditions.push(crate::accounts::condition(
            &old.conditions,
            "SieveScript",
            generation,
            "False",
            &e.reason,
            &e.message,
        )),
        (Some(_), None) => conditions.extend(old_sieve),
    }
    let status = MailAccountStatus {
        conditions,
        observed_generation: generation,
        password_secret_version: secret_version,
        used_bytes,
        quota_bytes,
        last_login,
    };
    if old != status {
        apply_status(&api, account, serde_json::to_value(&status).unwrap_or_default()).await?;
    }
    Ok(action)
}

/// Makes the account's `kubernetes` script what `spec.sieve` says, and the
/// active one; without `spec.sieve`, removes it. `Err` says why the script
/// is not in force (its ConfigMap, or the compiler's message): the account
/// itself is ready either way.
async fn sync_sieve(
    client: &Client,
    ns: &str,
    store: &dyn Store,
    account_id: i64,
    wanted: Option<&SieveSource>,
) -> Option<Result<(), NotReady>> {
    let stored = match store.sieve_list(account_id).await {
        Ok(list) => list.into_iter().find(|e| e.name == MANAGED_SIEVE_SCRIPT),
        Err(e) => return Some(Err(NotReady::retry("StoreError", e.to_string()))),
    };
    let Some(wanted) = wanted else {
        if let Some(entry) = stored {
            let removed = async {
                if entry.active {
                    store.sieve_activate(account_id, None).await?;
                }
                store.sieve_delete(account_id, MANAGED_SIEVE_SCRIPT).await
            };
            if let Err(e) = removed.await {
                tracing::warn!(error = %e, account_id, "the account's script not removed");
            }
        }
        return None;
    };
    let source = match (&wanted.inline, &wanted.config_map_ref) {
        (Some(text), _) => text.clone(),
        (None, Some(r)) => match config_map_value(client, ns, &r.name, &r.key).await {
            Ok(text) => text,
            Err(e) => return Some(Err(e)),
        },
        (None, None) => {
            let message = "give inline or configMapRef".to_string();
            return Some(Err(NotReady { reason: "InvalidScript".into(), message, retry: false }));
        }
    };
    // The pods' own check: what is stored here, they can run.
    let config = mailcluster_server::config::Config::default();
    let checker = mailcluster_server::scripts::Filters::from_config(&config);
    let quota = mailcluster_server::scripts::quota_of(&config);
    let current = match store.sieve_get(account_id, MANAGED_SIEVE_SCRIPT).await {
        Ok(current) => current,
        Err(e) => return Some(Err(NotReady::retry("StoreError", e.to_string()))),
    };
    if current.as_deref() == Some(source.as_bytes()) && stored.as_ref().is_some_and(|e| e.active) {
        return Some(Ok(()));
    }
    let put = mailcluster_server::scripts::put_by_id(
        store,
        &checker,
        quota,
        account_id,
        MANAGED_SIEVE_SCRIPT,
        source.as_bytes(),
        true,
    )
    .await;
    Some(match put {
        Ok(()) => Ok(()),
        Err(StoreError::Invalid(m)) => {
            Err(NotReady { reason: "InvalidScript".into(), message: m, retry: false })
        }
        Err(StoreError::OverQuota(m)) => {
            Err(NotReady { reason: "OverQuota".into(), message: m, retry: false })
        }
        Err(e) => Err(NotReady::retry("StoreError", e.to_string())),
    })
}

/// A ConfigMap key's text.
async fn config_map_value(client: &Client, ns: &str, name: &str, key: &str) -> Result<String, NotReady> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let map = maps
        .get_opt(name)
        .await
        .map_err(|e| NotReady::retry("ConfigMapUnreadable", format!("cannot read ConfigMap {name}: {e}")))?
        .ok_or_else(|| NotReady::retry("ConfigMapMissing", format!("ConfigMap {name} not found")))?;
    map.data
        .as_ref()
        .and_then(|d| d.get(key))
        .cloned()
        .ok_or_else(|| NotReady::retry("ConfigMapMissing", format!("ConfigMap {name} has no key {key}")))
}

/// Before the finalizer goes: `Retain` disables the account (no login, mail
/// refused, mailboxes kept), `Delete` removes it with its mail. A MailCluster
/// that is gone leaves nothing to clean up in a store.
async fn cleanup_account(account: &MailAccount, ctx: &AccountContext) -> Result<Action, Error> {
    let ns = account.namespace().unwrap_or_default();
    let spec = &account.spec;
    let store = match ctx.store(&ns, &spec.cluster_ref).await {
        Ok(store) => store,
        Err(e) if e.reason == "ClusterMissing" => return Ok(Action::await_change()),
        Err(e) => return Err(Error::Cleanup(e.message)),
    };
    let existing = store
        .account_get(&spec.address)
        .await
        .map_err(|e| Error::Cleanup(format!("cannot look up {}: {e}", spec.address)))?;
    let aliases = match &existing {
        Some(account) => {
            store
                .sender_rights(&account.email)
                .await
                .map_err(|e| Error::Cleanup(format!("cannot read the aliases of {}: {e}", spec.address)))?
                .aliases
        }
        None => Vec::new(),
    };
    match spec.deletion_policy {
        DeletionPolicy::Retain => match store.account_set_enabled(&spec.address, false).await {
            Ok(()) | Err(StoreError::NotFound(_)) => {}
            Err(e) => return Err(Error::Cleanup(format!("cannot disable {}: {e}", spec.address))),
        },
        DeletionPolicy::Delete => {
            provision::delete_account(&*store, &spec.address)
                .await
                .map_err(|e| Error::Cleanup(format!("cannot delete {}: {e}", spec.address)))?;
        }
    }
    if let Some(account) = existing {
        let mut recipients = aliases;
        recipients.push(account.email.clone());
        forget_cached(&ctx.client, &ns, &spec.cluster_ref, &[account.id], &recipients).await;
    }
    tracing::info!(account = %spec.address, policy = ?spec.deletion_policy, "MailAccount deleted");
    Ok(Action::await_change())
}

// ------------------------------------------- accounts without a MailAccount

/// Reports the store's accounts that no MailAccount of the cluster describes in
/// `status.unmanagedAccounts`, and under `spec.accounts: Managed` disables them.
/// The MailAccounts are listed from the API server, never from the watch cache:
/// an account is disabled only when a complete, current list does not name it.
async fn reconcile_unmanaged(mc: Arc<MailCluster>, ctx: Arc<AccountContext>) -> Result<Action, Error> {
    let ns = mc.namespace().unwrap_or_default();
    let name = mc.name_any();
    let store = match ctx.store(&ns, &name).await {
        Ok(store) => store,
        Err(e) => {
            tracing::debug!(cluster = %name, reason = %e.reason, "store not reachable for the account report");
            return Ok(Action::requeue(Duration::from_secs(10)));
        }
    };
    let described: std::collections::HashSet<String> =
        Api::<MailAccount>::namespaced(ctx.client.clone(), &ns)
            .list(&Default::default())
            .await?
            .into_iter()
            .filter(|a| a.spec.cluster_ref == name)
            .map(|a| provision::normalized(&a.spec.address))
            .collect();
    let mut unmanaged: Vec<_> = store
        .account_list(None)
        .await?
        .into_iter()
        .filter(|a| !described.contains(&provision::normalized(&a.email)))
        .collect();
    unmanaged.sort_by(|a, b| a.email.cmp(&b.email));
    if mc.spec.accounts == AccountsPolicy::Managed {
        let (mut ids, mut addresses) = (Vec::new(), Vec::new());
        for account in unmanaged.iter_mut().filter(|a| a.enabled) {
            match store.account_set_enabled(&account.email, false).await {
                Ok(()) | Err(StoreError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
            tracing::info!(cluster = %name, account = %account.email, "disabled: no MailAccount describes it");
            account.enabled = false;
            ids.push(account.id);
            addresses.push(account.email.clone());
        }
        forget_cached(&ctx.client, &ns, &name, &ids, &addresses).await;
    }
    let report = UnmanagedAccounts {
        count: unmanaged.len() as u64,
        addresses: unmanaged.iter().take(UNMANAGED_LISTED).map(|a| a.email.clone()).collect(),
        enabled: unmanaged.iter().filter(|a| a.enabled).count() as u64,
    };
    if mc.status.as_ref().and_then(|s| s.unmanaged_accounts.as_ref()) != Some(&report) {
        // A merge patch, not an apply: the MailCluster reconciler applies the
        // rest of the status and leaves this field out (reconcile.rs).
        let patch = json!({"status": {"unmanagedAccounts": report}});
        Api::<MailCluster>::namespaced(ctx.client.clone(), &ns)
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(Action::requeue(ctx.resync))
}

/// The MailAccounts whose Sieve script is in `map` (same namespace, same name).
fn accounts_using_config_map(
    accounts: &Reflected<MailAccount>,
    map: &PartialObjectMeta<ConfigMap>,
) -> Vec<ObjectRef<MailAccount>> {
    let (Some(name), ns) = (map.metadata.name.as_deref(), map.metadata.namespace.as_deref()) else {
        return Vec::new();
    };
    accounts
        .state()
        .iter()
        .filter(|a| {
            a.namespace().as_deref() == ns
                && a.spec
                    .sieve
                    .as_ref()
                    .and_then(|s| s.config_map_ref.as_ref())
                    .is_some_and(|r| r.name == name)
        })
        .map(|a| ObjectRef::from_obj(&**a))
        .collect()
}

/// The MailAccounts whose password is in `secret` (same namespace, same name):
/// what a change of that Secret has to reconcile.
fn accounts_using_secret(
    accounts: &Reflected<MailAccount>,
    secret: &PartialObjectMeta<Secret>,
) -> Vec<ObjectRef<MailAccount>> {
    let (Some(name), ns) = (secret.metadata.name.as_deref(), secret.metadata.namespace.as_deref()) else {
        return Vec::new();
    };
    accounts
        .state()
        .iter()
        .filter(|a| a.namespace().as_deref() == ns && a.spec.password_secret_ref.name == name)
        .map(|a| ObjectRef::from_obj(&**a))
        .collect()
}

fn error_policy<K>(_: Arc<K>, error: &Error, _: Arc<AccountContext>) -> Action {
    tracing::warn!(%error, "store reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// Runs the MailDomain and MailAccount controllers until `shutdown` resolves.
pub async fn run(client: Client, opts: AccountOptions, shutdown: impl Future<Output = ()> + Send + 'static) {
    let ctx = Arc::new(AccountContext::new(client.clone(), &opts));
    let (domains, accounts): (Api<MailDomain>, Api<MailAccount>) = match &opts.namespace {
        Some(ns) => (Api::namespaced(client.clone(), ns), Api::namespaced(client.clone(), ns)),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let (clusters, account_events): (Api<MailCluster>, Api<MailAccount>) = match &opts.namespace {
        Some(ns) => (Api::namespaced(client.clone(), ns), Api::namespaced(client.clone(), ns)),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    // Metadata only: the operator holds no Secret's value between reconciles.
    let secrets: Api<PartialObjectMeta<Secret>> = match &opts.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let config_maps: Api<PartialObjectMeta<ConfigMap>> = match &opts.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let (stop_rx_clusters, ctx_clusters) = (stop_rx.clone(), ctx.clone());
    let domain_controller = Controller::new(domains, watcher::Config::default().any_semantic())
        .graceful_shutdown_on(stopped(stop_rx.clone()))
        .run(reconcile_domain, error_policy, ctx.clone())
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "MailDomain controller");
            }
        });
    let account_controller = Controller::new(accounts, watcher::Config::default().any_semantic());
    let known_accounts = account_controller.store();
    let accounts_for_maps = known_accounts.clone();
    let account_controller = account_controller
        .watches(secrets, watcher::Config::default().any_semantic(), move |secret| {
            accounts_using_secret(&known_accounts, &secret)
        })
        .watches(config_maps, watcher::Config::default().any_semantic(), move |map| {
            accounts_using_config_map(&accounts_for_maps, &map)
        })
        .graceful_shutdown_on(stopped(stop_rx.clone()))
        .run(reconcile_account, error_policy, ctx.clone())
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "MailAccount controller");
            }
        });
    // Each MailAccount change looks at its cluster's store again, once a burst
    // of changes (an Argo CD sync of many accounts) has settled.
    let cluster_controller = Controller::new(clusters, watcher::Config::default().any_semantic())
        .with_config(kube::runtime::controller::Config::default().debounce(Duration::from_secs(2)))
        .watches(account_events, watcher::Config::default().any_semantic(), |account: MailAccount| {
            let ns = account.namespace()?;
            Some(ObjectRef::<MailCluster>::new(&account.spec.cluster_ref).within(&ns))
        })
        .graceful_shutdown_on(stopped(stop_rx_clusters))
        .run(reconcile_unmanaged, error_policy, ctx_clusters)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "MailCluster accounts report");
            }
        });
    let controllers = async {
        tokio::join!(domain_controller, account_controller, cluster_controller);
    };
    // A controller waits for its kind's first list before it reconciles, and a
    // graceful shutdown waits for that controller: with the MailDomain or
    // MailAccount CRD not installed, that is forever. Reconciles in flight get
    // a bounded time after the signal instead.
    tokio::select! {
        _ = controllers => {}
        _ = async {
            stopped(stop_rx).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => tracing::warn!(
            grace_secs = SHUTDOWN_GRACE.as_secs(),
            "store kinds' controllers did not stop in time (are their CRDs installed?)"
        ),
    }
}

/// How long the store kinds' reconciles in flight may take after shutdown is
/// asked for.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
