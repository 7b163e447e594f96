//! MailDomains and MailAccounts reconciled by the real controllers
//! (`mailcluster_operator::accounts::run`, in process) against a real Kubernetes
//! control plane and a fresh PostgreSQL database: the account appears in the
//! store and logs in through the server's own `Authenticator`; a changed
//! password Secret replaces the password; bcrypt and SHA512-CRYPT hashes from
//! other systems log in; a hash format the server cannot verify makes the
//! account not Ready; deleting a MailAccount disables the
//! account and keeps its mail (`Retain`) or removes it (`Delete`).
//!
//! The cluster is found through `MAILCLUSTER_TEST_KUBECONFIG`, PostgreSQL through
//! `DATABASE_URL`; without the cluster the tests are skipped locally and fail
//! under `CI`. No MailCluster controller runs: the MailCluster only names the
//! database Secret.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use mailcluster_api::accounts::MailDomainStatus;
use mailcluster_api::{MailAccount, MailCluster, MailDomain};
use mailcluster_model::{NewDelivery, Recipient};
use mailcluster_operator::accounts::{AccountOptions, run};
use mailcluster_server::auth::{AuthConfig, AuthOutcome, Authenticator};
use mailcluster_server::cache::local::LocalCache;
use mailcluster_server::store::Store;
use mailcluster_testkit::TestDatabase;
use mailcluster_testkit::dns::TestDns;
use serde_json::json;
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(90);

struct TestNamespace {
    client: Client,
    name: String,
}

impl TestNamespace {
    async fn create(prefix: &str) -> Option<TestNamespace> {
        let path = match std::env::var("MAILCLUSTER_TEST_KUBECONFIG") {
            Ok(p) if std::path::Path::new(&p).exists() => p,
            _ => {
                assert!(std::env::var_os("CI").is_none(), "MAILCLUSTER_TEST_KUBECONFIG is required in CI");
                eprintln!("skipping: no MAILCLUSTER_TEST_KUBECONFIG (run scripts/kube-up.sh)");
                return None;
            }
        };
        let name = mailcluster_testkit::unique(prefix).replace('_', "-").to_lowercase();
        let kubeconfig = Kubeconfig::read_from(&path).expect("test kubeconfig");
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("kubeconfig");
        config.default_namespace = name.clone();
        let client = Client::try_from(config).expect("client of the test cluster");
        install_crds(&client).await;
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("create namespace");
        Some(TestNamespace { client, name })
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let client = self.client.clone();
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                // Finalizers first, so that the namespace can go without an operator.
                let accounts: Api<MailAccount> = Api::namespaced(client.clone(), &name);
                if let Ok(list) = accounts.list(&Default::default()).await {
                    for a in list {
                        let patch = json!({"metadata": {"finalizers": null}});
                        let _ = accounts
                            .patch(&a.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                            .await;
                    }
                }
                let _ = Api::<Namespace>::all(client).delete(&name, &DeleteParams::default()).await;
            });
        })
        .join();
    }
}

/// Every generated CRD, applied server-side and Established.
async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, text) in mailcluster_operator::crd_files() {
        let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&text).expect("the CRD parses");
        let name = crd.name_any();
        crds.patch(&name, &PatchParams::apply("install-test").force(), &Patch::Apply(&crd))
            .await
            .expect("apply the CRD");
        eventually(&format!("{name} established"), || async {
            let c = crds.get_opt(&name).await.ok()??;
            c.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
        })
        .await;
    }
}

async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {WAIT:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}

/// A namespace with a MailCluster whose database Secret points at a fresh,
/// migrated PostgreSQL database, and the store controllers running.
struct Setup {
    ns: TestNamespace,
    store: Arc<dyn Store>,
    /// One authenticator for the whole test, so that its credential cache holds
    /// a verified old password when the Secret changes.
    auth: Authenticator,
    /// The TXT value of the cluster's DKIM key, as `dkim generate` printed it.
    dkim_txt: String,
    dns: TestDns,
    _db: TestDatabase,
    stop: Option<oneshot::Sender<()>>,
    controllers: Option<tokio::task::JoinHandle<()>>,
}

impl Setup {
    /// `zone`: the example.com zone the operator's resolver sees (a real DNS
    /// server on loopback); empty, no such zone.
    async fn new(prefix: &str, zone: impl Fn(&str) -> String) -> Option<Setup> {
        Setup::with_dns_check(prefix, zone, AccountOptions::default().dns_check).await
    }

    /// [`Setup::new`] with records looked up again every `dns_check`.
    async fn with_dns_check(
        prefix: &str,
        zone: impl Fn(&str) -> String,
        dns_check: Duration,
    ) -> Option<Setup> {
        init_logs();
        let ns = TestNamespace::create(prefix).await?;
        let db = TestDatabase::create("accounts").await;
        let store = mailcluster_server::store::open(Some(&db.url), std::path::Path::new("."), 2, WAIT)
            .await
            .expect("store");
        store.migrate().await.expect("migrate");
        secret(&ns, "mail-db", "url", &db.url).await;
        secret(&ns, "mail-redis", "url", &mailcluster_testkit::redis_url()).await;
        let dkim = mailcluster_server::dkim::generate("ed25519").unwrap();
        secret(&ns, "mail-dkim", "dkim.key", &dkim.private_pem).await;
        let cluster: MailCluster = serde_json::from_value(json!({
            "apiVersion": "mailcluster.dev/v1alpha1", "kind": "MailCluster",
            "metadata": {"name": "mail"},
            "spec": {
                "image": {"tag": "0.1.0"},
                "domains": ["example.com"],
                "hostname": "mx.example.com",
                "postgres": {"urlSecretRef": {"name": "mail-db"}},
                "redis": {"urlSecretRef": {"name": "mail-redis"}},
                "dkim": [{"domain": "example.com", "selector": "s1", "secretName": "mail-dkim", "algorithm": "ed25519"}],
            }
        }))
        .unwrap();
        ns.api::<MailCluster>().create(&PostParams::default(), &cluster).await.expect("create MailCluster");
        let zone = zone(&dkim.dns_txt);
        let zones: Vec<(&str, &str)> =
            if zone.is_empty() { Vec::new() } else { vec![("example.com.", zone.as_str())] };
        let dns = TestDns::start(&zones).await;
        let (stop, stopped) = oneshot::channel::<()>();
        // A resync far longer than any wait here: every change must arrive
        // through a watch (of the objects, or of the password Secrets).
        let opts = AccountOptions {
            namespace: Some(ns.name.clone()),
            resync: Duration::from_secs(3600),
            dns_nameservers: vec![dns.addr()],
            dns_check,
        };
        let controllers = tokio::spawn(run(ns.client.clone(), opts, async move {
            let _ = stopped.await;
        }));
        let auth = Authenticator::new(
            store.clone(),
            Arc::new(LocalCache::new()),
            AuthConfig { failure_delay_ms: 0, ..AuthConfig::default() },
        );
        Some(Setup {
            ns,
            store,
            auth,
            dkim_txt: dkim.dns_txt,
            dns,
            _db: db,
            stop: Some(stop),
            controllers: Some(controllers),
        })
    }

    /// Applies the example.com MailDomain and returns its status once Ready and
    /// its records checked.
    async fn example_domain(&self) -> MailDomainStatus {
        self.apply(
            "maildomains",
            "example-com",
            &json!({
                "apiVersion": "mailcluster.dev/v1alpha1", "kind": "MailDomain",
                "metadata": {"name": "example-com"},
                "spec": {"clusterRef": "mail", "domain": "example.com", "mtaSts": "enforce",
                         "tlsRpt": "tlsrpt@example.com", "quotaBytes": 1000000,
                         "dkim": {"selector": "s1", "algorithm": "ed25519"}},
            }),
        )
        .await;
        let domains = self.ns.api::<MailDomain>();
        eventually("MailDomain Ready and checked", || async {
            let d = domains.get_opt("example-com").await.ok()??;
            let status = d.status?;
            let ready = status.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
            let checked = status.dns_records.iter().all(|r| r.last_checked.is_some());
            (ready && checked).then_some(status)
        })
        .await
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(c) = self.controllers.take() {
            let _ = tokio::time::timeout(Duration::from_secs(20), c).await;
        }
    }

    async fn apply(&self, plural: &str, name: &str, obj: &serde_json::Value) {
        let ar = kube::api::ApiResource {
            group: "mailcluster.dev".into(),
            version: "v1alpha1".into(),
            api_version: "mailcluster.dev/v1alpha1".into(),
            kind: String::new(),
            plural: plural.into(),
        };
        let api: Api<kube::api::DynamicObject> =
            Api::namespaced_with(self.ns.client.clone(), &self.ns.name, &ar);
        api.patch(name, &PatchParams::apply("accounts-test").force(), &Patch::Apply(obj))
            .await
            .expect("apply");
    }

    /// The MailAccount's Ready condition as (status, reason), once it describes
    /// the object's current generation.
    async fn account_ready(&self, name: &str) -> (String, String) {
        let api = self.ns.api::<MailAccount>();
        eventually(&format!("MailAccount {name} reconciled"), || async {
            let a = api.get_opt(name).await.ok()??;
            let status = a.status?;
            (status.observed_generation == a.metadata.generation).then_some(())?;
            let c = status.conditions.into_iter().find(|c| c.type_ == "Ready")?;
            Some((c.status, c.reason))
        })
        .await
    }

    async fn login(&self, email: &str, password: &str) -> bool {
        let from: IpAddr = "192.0.2.1".parse().unwrap();
        matches!(self.auth.verify(email, password, from).await, AuthOutcome::Ok(_))
    }
}

async fn secret(ns: &TestNamespace, name: &str, key: &str, value: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {key: value}
    }))
    .unwrap();
    ns.api::<Secret>()
        .patch(name, &PatchParams::apply("accounts-test").force(), &Patch::Apply(&secret))
        .await
        .expect("secret");
}

fn account(name: &str, address: &str, secret: &str, policy: &str) -> serde_json::Value {
    json!({
        "apiVersion": "mailcluster.dev/v1alpha1", "kind": "MailAccount",
        "metadata": {"name": name},
        "spec": {
            "clusterRef": "mail",
            "address": address,
            "displayName": "Alice",
            "aliases": [format!("alias-{address}")],
            "sendAs": ["news@example.com"],
            "passwordSecretRef": {"name": secret, "key": "password"},
            "deletionPolicy": policy,
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_from_resources_log_in_change_password_and_are_retained_or_deleted() {
    // No DNS zone for the domain: every record is unpublished.
    let Some(setup) = Setup::new("acc", |_| String::new()).await else { return };
    let status = setup.example_domain().await;
    assert!(
        status.dns_records.iter().all(|r| r.published == "False" && r.last_checked.is_some()),
        "{status:?}"
    );
    let published = status.conditions.iter().find(|c| c.type_ == "DnsPublished").expect("DnsPublished");
    assert_eq!((published.status.as_str(), published.reason.as_str()), ("False", "NotPublished"));
    let purposes: Vec<&str> = status.dns_records.iter().map(|r| r.purpose.as_str()).collect();
    assert_eq!(purposes, ["MX", "SPF", "DMARC", "DKIM", "MTA-STS", "MTA-STS policy", "TLS-RPT"]);
    assert_eq!(status.dns_records[3].name, "s1._domainkey.example.com.");
    assert_eq!(status.dns_records[3].value, format!("\"{}\"", setup.dkim_txt), "the cluster's key");
    assert_eq!(status.dns_records[0].value, "10 mx.example.com.");
    assert_eq!(setup.store.domain_quota("example.com").await.unwrap(), Some(1_000_000));

    // Created from a plain password, hashed by the operator.
    secret(&setup.ns, "alice-pw", "password", "first-password").await;
    setup.apply("mailaccounts", "alice", &account("alice", "alice@example.com", "alice-pw", "Retain")).await;
    assert_eq!(setup.account_ready("alice").await, ("True".into(), "Stored".into()));
    let stored = setup.store.account_get("alice@example.com").await.unwrap().expect("in the store");
    assert!(stored.password_hash.starts_with("$argon2id$"), "hashed, never stored as given");
    assert_eq!(stored.display_name.as_deref(), Some("Alice"));
    assert!(setup.login("alice@example.com", "first-password").await);
    let runs = setup.auth.argon2_runs();
    assert!(setup.login("alice@example.com", "first-password").await);
    assert_eq!(setup.auth.argon2_runs(), runs, "the second login is answered from the credential cache");
    let rights = setup.store.sender_rights("alice@example.com").await.unwrap();
    assert_eq!(rights.aliases, ["alias-alice@example.com"]);
    assert_eq!(rights.allowed, ["news@example.com"]);

    // A changed Secret: the new password works within seconds (the Secret is
    // watched), the old one no longer does.
    let changed = tokio::time::Instant::now();
    secret(&setup.ns, "alice-pw", "password", "second-password").await;
    eventually("the new password", || async {
        setup.login("alice@example.com", "second-password").await.then_some(())
    })
    .await;
    let took = changed.elapsed();
    assert!(took < Duration::from_secs(5), "the new password took {took:?}");
    assert!(
        !setup.login("alice@example.com", "first-password").await,
        "the cached old password is not valid"
    );

    // An existing argon2 hash is stored as given.
    let hash = mailcluster_server::auth::hash_password("hashed-password").unwrap();
    secret(&setup.ns, "bob-pw", "password", &hash).await;
    setup.apply("mailaccounts", "bob", &account("bob", "bob@example.com", "bob-pw", "Delete")).await;
    assert_eq!(setup.account_ready("bob").await.0, "True");
    assert_eq!(setup.store.account_get("bob@example.com").await.unwrap().unwrap().password_hash, hash);
    assert!(setup.login("bob@example.com", "hashed-password").await);
    // Switched off and on again without deleting the object.
    let mut off = account("bob", "bob@example.com", "bob-pw", "Delete");
    off["spec"]["enabled"] = json!(false);
    setup.apply("mailaccounts", "bob", &off).await;
    assert_eq!(setup.account_ready("bob").await.0, "True");
    assert!(!setup.store.account_get("bob@example.com").await.unwrap().unwrap().enabled);
    assert!(!setup.login("bob@example.com", "hashed-password").await);
    setup.apply("mailaccounts", "bob", &account("bob", "bob@example.com", "bob-pw", "Delete")).await;
    eventually("bob enabled again", || async {
        setup.login("bob@example.com", "hashed-password").await.then_some(())
    })
    .await;

    // Hashes from other systems (made by glibc's crypt(3):
    // `crypt.crypt('migrated pass', '$6$saltsalt$')` and `'$2y$05$abcdefghijklmnopqrstuu'`)
    // are stored as given and log in with their password.
    for (name, hash) in [
        (
            "carol",
            "$6$saltsalt$UV8BYgqN7u34iPYiLihbOjmF22xo0X75SlnQFYRpDJsgJaXUiVT9jRyx4l4tz0FMJBBZGZbqw/l1xfhEu2dJa/",
        ),
        ("dave", "$2y$05$abcdefghijklmnopqrstuuVVzYGn6PXgpP3f4Lku9ALBvLuGFYlf2"),
    ] {
        let address = format!("{name}@example.com");
        secret(&setup.ns, &format!("{name}-pw"), "password", hash).await;
        setup.apply("mailaccounts", name, &account(name, &address, &format!("{name}-pw"), "Retain")).await;
        assert_eq!(setup.account_ready(name).await, ("True".into(), "Stored".into()), "{name}");
        assert_eq!(setup.store.account_get(&address).await.unwrap().unwrap().password_hash, hash);
        assert!(setup.login(&address, "migrated pass").await, "{name}");
        assert!(!setup.login(&address, "migrated pasS").await, "{name}");
    }

    // A hash the server cannot verify, or that asks more of each login than the
    // server allows: not Ready, with the reason, and no account.
    for (name, hash) in [
        ("erin", "$1$saltsalt$mzG3ctZmW7kUemff2nUxe."),
        ("frank", "$2b$15$abcdefghijklmnopqrstuuVVzYGn6PXgpP3f4Lku9ALBvLuGFYlf2"),
    ] {
        let address = format!("{name}@example.com");
        secret(&setup.ns, &format!("{name}-pw"), "password", hash).await;
        setup.apply("mailaccounts", name, &account(name, &address, &format!("{name}-pw"), "Retain")).await;
        assert_eq!(setup.account_ready(name).await, ("False".into(), "UnsupportedPassword".into()), "{name}");
        assert!(setup.store.account_get(&address).await.unwrap().is_none(), "{name}");
    }

    // Retain: the account is disabled, its mail kept.
    let alice = setup.store.account_get("alice@example.com").await.unwrap().unwrap();
    let inbox = setup.store.mailbox_get(alice.id, "INBOX").await.unwrap().unwrap();
    let raw = b"Subject: kept\r\n\r\nbody\r\n".to_vec();
    let raw_len = raw.len();
    let delivery = NewDelivery {
        meta: mailcluster_model::message::parse_meta(&raw),
        raw: raw.into(),
        targets: vec![inbox.id],
        internal_date: chrono::Utc::now(),
        flags: Default::default(),
    };
    setup.store.deliver_batch(&[delivery]).await.unwrap();
    // The status reports the usage and the last login, read at each reconcile
    // (here one made by a change of the object).
    let accounts = setup.ns.api::<MailAccount>();
    let touch = json!({"metadata": {"annotations": {"example.com/touched": "1"}}});
    accounts.patch("alice", &PatchParams::default(), &Patch::Merge(&touch)).await.unwrap();
    let status = eventually("alice's usage in status", || async {
        let status = accounts.get_opt("alice").await.ok()??.status?;
        (status.used_bytes? > 0).then_some(status)
    })
    .await;
    assert_eq!(status.used_bytes, Some(i64::try_from(raw_len).unwrap()));
    assert_eq!(status.quota_bytes, Some(1_000_000), "the domain's default");
    let last_login: chrono::DateTime<chrono::Utc> =
        status.last_login.as_deref().expect("alice logged in").parse().unwrap();
    assert!(chrono::Utc::now() - last_login < chrono::TimeDelta::minutes(2), "{last_login}");
    // A pod's cached "alice is a mailbox" answer, under the cluster's key prefix.
    let prefix = format!("mc:{}:mail:", setup.ns.name);
    let cache = mailcluster_server::cache::open(Some(&mailcluster_testkit::redis_url()), &prefix, WAIT)
        .await
        .unwrap();
    let key = mailcluster_server::directory::recipient_key("alice@example.com");
    cache.value_put(&key, b"cached", Duration::from_secs(300)).await.unwrap();
    accounts.delete("alice", &DeleteParams::default()).await.unwrap();
    eventually("alice's MailAccount gone", || async {
        accounts.get_opt("alice").await.unwrap().is_none().then_some(())
    })
    .await;
    let alice = setup.store.account_get("alice@example.com").await.unwrap().expect("retained");
    assert!(!alice.enabled);
    assert_eq!(cache.value_get(&key).await.unwrap(), None, "the pods' cached recipient entry is dropped");
    assert!(!setup.login("alice@example.com", "second-password").await);
    assert_eq!(setup.store.mailbox_status(inbox.id).await.unwrap().messages, 1, "mail kept");
    assert_eq!(
        setup.store.recipient("alice@example.com", None).await.unwrap(),
        mailcluster_model::Recipient::NoSuchUser,
        "no more delivery"
    );

    // Delete: the account is gone.
    accounts.delete("bob", &DeleteParams::default()).await.unwrap();
    eventually("bob's MailAccount gone", || async {
        accounts.get_opt("bob").await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(setup.store.account_get("bob@example.com").await.unwrap().is_none());
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_served_by_dns_are_published_and_a_missing_one_is_not() {
    // Everything the MailDomain lists except the TLS-RPT record, as an
    // operator of the zone would publish it.
    let Some(setup) = Setup::new("dns", |dkim| {
        format!(
            "@ 60 IN MX 10 mx.example.com.\n\
             @ 60 IN TXT \"v=spf1 mx -all\"\n\
             _dmarc 60 IN TXT \"v=DMARC1; p=quarantine; rua=mailto:postmaster@example.com\"\n\
             s1._domainkey 60 IN TXT \"{dkim}\"\n\
             _mta-sts 60 IN TXT \"v=STSv1; id=enforce\"\n\
             mta-sts 60 IN A 192.0.2.10\n\
             mx 60 IN A 192.0.2.25\n"
        )
    })
    .await
    else {
        return;
    };
    let status = setup.example_domain().await;
    let published: Vec<(&str, &str)> =
        status.dns_records.iter().map(|r| (r.purpose.as_str(), r.published.as_str())).collect();
    assert_eq!(
        published,
        [
            ("MX", "True"),
            ("SPF", "True"),
            ("DMARC", "True"),
            ("DKIM", "True"),
            ("MTA-STS", "True"),
            ("MTA-STS policy", "True"),
            ("TLS-RPT", "False"),
        ]
    );
    let condition = status.conditions.iter().find(|c| c.type_ == "DnsPublished").expect("DnsPublished");
    assert_eq!(condition.status, "False");
    assert_eq!(condition.message, "not seen in DNS: TLS-RPT");
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_without_a_mail_account_are_reported_and_disabled_only_when_managed() {
    let Some(setup) = Setup::new("unm", |_| String::new()).await else { return };
    setup.example_domain().await;
    secret(&setup.ns, "alice-pw", "password", "alice-password").await;
    setup.apply("mailaccounts", "alice", &account("alice", "alice@example.com", "alice-pw", "Retain")).await;
    assert_eq!(setup.account_ready("alice").await.0, "True");
    // Made as `mailcluster user add` makes them, with no MailAccount.
    for address in ["zed@example.com", "cli-made@example.com"] {
        let wanted = mailcluster_server::provision::WantedAccount {
            email: address.into(),
            password: Some(mailcluster_server::provision::PasswordSource::Plain("cli-password".into())),
            ..Default::default()
        };
        mailcluster_server::provision::apply_account(&*setup.store, &wanted).await.unwrap();
    }
    let clusters = setup.ns.api::<MailCluster>();
    let report = |count: u64, enabled: u64| {
        let clusters = clusters.clone();
        async move {
            eventually(&format!("{count} unmanaged, {enabled} enabled"), || async {
                let r = clusters.get_opt("mail").await.ok()??.status?.unmanaged_accounts?;
                (r.count == count && r.enabled == enabled).then_some(r)
            })
            .await
        }
    };
    // Shared (the default): reported, in address order, and left alone. The
    // MailAccount's change of another account brings the report up to date.
    setup.apply("mailaccounts", "alice", &account("alice", "alice@example.com", "alice-pw", "Delete")).await;
    let shared = report(2, 2).await;
    assert_eq!(shared.addresses, ["cli-made@example.com", "zed@example.com"]);
    assert!(setup.login("cli-made@example.com", "cli-password").await);

    // Managed: the MailAccounts are the whole truth; the others are disabled.
    clusters
        .patch("mail", &PatchParams::default(), &Patch::Merge(json!({"spec": {"accounts": "Managed"}})))
        .await
        .unwrap();
    report(2, 0).await;
    assert!(!setup.login("cli-made@example.com", "cli-password").await);
    assert!(!setup.store.account_get("zed@example.com").await.unwrap().unwrap().enabled);
    assert!(setup.login("alice@example.com", "alice-password").await, "described by a MailAccount");
    setup.stop().await;
}

/// The MailDomain's status once `done` holds for it.
async fn domain_status(
    api: &Api<MailDomain>,
    what: &str,
    done: impl Fn(&MailDomainStatus) -> bool,
) -> MailDomainStatus {
    eventually(what, || async {
        let status = api.get_opt("example-org").await.ok()??.status?;
        done(&status).then_some(status)
    })
    .await
}

/// The selector and record value of the key in `status` at `index`, and its TXT
/// value as the zone file gets it.
fn dkim_record(status: &MailDomainStatus, selector: &str) -> (String, String) {
    let record = status
        .dns_records
        .iter()
        .find(|r| r.name == format!("{selector}._domainkey.example.org."))
        .unwrap_or_else(|| panic!("no record for {selector}: {:?}", status.dns_records));
    (record.purpose.clone(), record.value.clone())
}

/// Signs a message from example.org with the keys in the store, as every mail
/// pod does, and checks the signature the way a receiving MX does: the
/// server's own inbound checks, asking the test DNS server for the record.
async fn signed_and_verified(setup: &Setup) -> (String, String) {
    let signer = mailcluster_server::dkim::Signer::default();
    signer.refresh(setup.store.domain_keys().await.unwrap());
    let message = "From: Alice <alice@example.org>\r\nTo: bob@example.net\r\nSubject: signed\r\n\
                   Date: Mon, 07 Dec 2026 12:00:00 +0000\r\nMessage-ID: <1@example.org>\r\n\r\nhello\r\n";
    let header = signer.sign("example.org", message.as_bytes()).expect("a key signs example.org");
    let signed = format!("{header}{message}");
    let config =
        mailcluster_server::config::DnsConfig { nameservers: vec![setup.dns.addr()], ..Default::default() };
    let dns = mailcluster_server::dns::Dns::from_config(&config).expect("resolver");
    let envelope = mailcluster_server::inbound::Envelope {
        remote_ip: "192.0.2.9".parse().unwrap(),
        helo: "mx.example.org",
        mail_from: "alice@example.org",
    };
    let verdict = mailcluster_server::inbound::check(
        &dns,
        &Default::default(),
        "mx.example.net",
        &envelope,
        signed.as_bytes(),
    )
    .await;
    let mailcluster_server::inbound::Verdict::Accept { header: results, .. } = verdict else {
        panic!("the signed message was not accepted: {verdict:?}");
    };
    (header, results)
}

/// A MailDomain with DKIM and no key of the cluster's: the operator makes a key
/// into a Secret the MailDomain owns, lists its record, and signs with it only
/// once DNS shows it; the key verifies against that record. Asked to rotate,
/// it lists the next key first, keeps signing with the old one until DNS shows
/// the new record, then signs with the new one and keeps the old record listed
/// as retired. `catchAll` routes unknown local parts to its account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_dkim_keys_sign_once_published_and_rotate() {
    let Some(setup) = Setup::with_dns_check("dkim", |_| String::new(), Duration::from_secs(1)).await else {
        return;
    };
    let domains = setup.ns.api::<MailDomain>();
    let domain = |rotation: Option<&str>, catch_all: Option<&str>| {
        json!({
            "apiVersion": "mailcluster.dev/v1alpha1", "kind": "MailDomain",
            "metadata": {"name": "example-org", "annotations": match rotation {
                Some(r) => json!({"mailcluster.dev/rotate-dkim": r}),
                None => json!({}),
            }},
            "spec": {"clusterRef": "mail", "domain": "example.org", "catchAll": catch_all,
                     "dkim": {"selector": "mc", "algorithm": "ed25519"}},
        })
    };
    // Someone's Secret already has the first key's name: the key takes the next one.
    let today = k8s_openapi::jiff::Timestamp::now().strftime("%Y%m%d").to_string();
    secret(&setup.ns, &format!("example-org-dkim-mc-{today}"), "note", "not a key").await;
    setup.apply("maildomains", "example-org", &domain(None, None)).await;
    let status = domain_status(&domains, "a key made and checked", |s| {
        s.dkim.as_ref().is_some_and(|d| d.keys.len() == 1)
            && s.dns_records.iter().any(|r| r.purpose == "DKIM (next)" && r.published == "False")
    })
    .await;
    let dkim = status.dkim.clone().unwrap();
    let first = dkim.keys[0].clone();
    assert_eq!((first.state.as_str(), dkim.signing.as_ref()), ("Pending", None), "{dkim:?}");
    assert_eq!(first.selector, format!("mc-{today}-2"), "{first:?}");
    let signing = status.conditions.iter().find(|c| c.type_ == "DkimSigning").expect("DkimSigning");
    assert_eq!((signing.status.as_str(), signing.reason.as_str()), ("False", "NotPublished"));
    let (purpose, first_value) = dkim_record(&status, &first.selector);
    assert_eq!(purpose, "DKIM (next)");
    assert!(setup.store.domain_keys().await.unwrap().is_empty(), "nothing signs before DNS shows the key");

    // The key's Secret: owned by the MailDomain, never changed.
    let key_secret = setup.ns.api::<Secret>().get(&first.secret_name).await.expect("the key's Secret");
    let owner = &key_secret.metadata.owner_references.as_ref().expect("owned")[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("MailDomain", "example-org"));
    assert_eq!(key_secret.immutable, Some(true));
    let pem = String::from_utf8(key_secret.data.as_ref().unwrap()["dkim.key"].0.clone()).unwrap();
    let txt = mailcluster_server::dkim::public_txt(pem.as_bytes(), "ed25519").unwrap();
    assert_eq!(first_value, format!("\"{txt}\""), "the record is the Secret's key's");

    // Published: it signs, and the signature verifies against DNS.
    let zone = |records: &[(&str, &str)]| {
        records
            .iter()
            .map(|(selector, value)| format!("{selector}._domainkey 60 IN TXT {value}\n"))
            .collect::<String>()
    };
    setup.dns.set_zones(&[("example.org.", &zone(&[(&first.selector, &first_value)]))]).await;
    let status = domain_status(&domains, "the first key signing", |s| {
        s.dkim.as_ref().and_then(|d| d.signing.as_deref()) == Some(first.selector.as_str())
    })
    .await;
    assert_eq!(dkim_record(&status, &first.selector).0, "DKIM");
    let signing = status.conditions.iter().find(|c| c.type_ == "DkimSigning").expect("DkimSigning");
    assert_eq!((signing.status.as_str(), signing.reason.as_str()), ("True", "Signing"));
    let stored = eventually("the key in the store", || async {
        setup.store.domain_keys().await.ok()?.into_iter().find(|k| k.domain == "example.org")
    })
    .await;
    assert_eq!(
        (stored.selector.as_str(), stored.private_pem.as_str()),
        (first.selector.as_str(), pem.as_str())
    );
    let (header, results) = signed_and_verified(&setup).await;
    assert!(header.contains(&format!("s={}", first.selector)), "{header}");
    assert!(results.contains("dkim=pass") && results.contains("header.d=example.org"), "{results}");

    // Rotation on request: the next key is listed; the first keeps signing.
    setup.apply("maildomains", "example-org", &domain(Some("compromised-1"), None)).await;
    let status = domain_status(&domains, "the next key listed", |s| {
        s.dkim.as_ref().is_some_and(|d| d.keys.len() == 2)
            && s.dns_records.iter().any(|r| r.purpose == "DKIM (next)" && r.published == "False")
    })
    .await;
    let dkim = status.dkim.clone().unwrap();
    let second = dkim.keys[1].clone();
    assert_eq!(dkim.signing.as_deref(), Some(first.selector.as_str()), "the old key signs meanwhile");
    assert_eq!(dkim.rotation_request.as_deref(), Some("compromised-1"));
    assert_ne!(second.selector, first.selector);
    let (_, second_value) = dkim_record(&status, &second.selector);
    let (header, _) = signed_and_verified(&setup).await;
    assert!(header.contains(&format!("s={}", first.selector)), "{header}");

    // The next key published: it signs, the first is retired and still listed.
    let both = zone(&[(&first.selector, &first_value), (&second.selector, &second_value)]);
    setup.dns.set_zones(&[("example.org.", &both)]).await;
    let status = domain_status(&domains, "the second key signing", |s| {
        s.dkim.as_ref().and_then(|d| d.signing.as_deref()) == Some(second.selector.as_str())
    })
    .await;
    let dkim = status.dkim.clone().unwrap();
    assert_eq!(dkim.keys[0].state, "Retired");
    let until: k8s_openapi::jiff::Timestamp = dkim.keys[0].retired_until.as_deref().unwrap().parse().unwrap();
    let grace = until.duration_since(k8s_openapi::jiff::Timestamp::now());
    assert!(grace > k8s_openapi::jiff::SignedDuration::from_hours(24 * 7 - 1), "{grace:?}");
    assert_eq!(dkim_record(&status, &first.selector).0, "DKIM (retired)");
    assert_eq!(dkim_record(&status, &second.selector).0, "DKIM");
    let _ = eventually("the second key in the store", || async {
        let keys = setup.store.domain_keys().await.ok()?;
        keys.into_iter().find(|k| k.domain == "example.org" && k.selector == second.selector)
    })
    .await;
    let (header, results) = signed_and_verified(&setup).await;
    assert!(header.contains(&format!("s={}", second.selector)), "{header}");
    assert!(results.contains("dkim=pass"), "{results}");

    // catchAll: to an account that is not there yet, then is.
    setup.apply("maildomains", "example-org", &domain(Some("compromised-1"), Some("all@example.org"))).await;
    let not_ready = domain_status(&domains, "catchAll not ready", |s| {
        s.conditions.iter().any(|c| c.type_ == "Ready" && c.reason == "CatchAllUnknown")
    })
    .await;
    assert!(not_ready.conditions.iter().any(|c| c.message.contains("all@example.org")), "{not_ready:?}");
    secret(&setup.ns, "all-pw", "password", "catch-all-password").await;
    setup.apply("mailaccounts", "all", &account("all", "all@example.org", "all-pw", "Retain")).await;
    assert_eq!(setup.account_ready("all").await.0, "True");
    domain_status(&domains, "catchAll applied", |s| {
        s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
    })
    .await;
    let Recipient::Alias(targets) = setup.store.recipient("anyone@example.org", None).await.unwrap() else {
        panic!("unknown local parts go to the catch-all");
    };
    assert_eq!(targets, ["all@example.org"]);
    setup.apply("maildomains", "example-org", &domain(Some("compromised-1"), None)).await;
    eventually("catchAll removed", || async {
        (setup.store.recipient("anyone@example.org", None).await.ok()? == Recipient::NoSuchUser).then_some(())
    })
    .await;
    // The rotation request was acted on once: still two keys.
    let keys = domains.get("example-org").await.unwrap().status.unwrap().dkim.unwrap().keys;
    assert_eq!(keys.len(), 2, "{keys:?}");
    setup.stop().await;
}

/// The SieveScript condition as (status, reason, message), once it
/// describes the object's current generation.
async fn sieve_condition(setup: &Setup, name: &str) -> Option<(String, String, String)> {
    let api = setup.ns.api::<MailAccount>();
    eventually(&format!("MailAccount {name} reconciled"), || async {
        let a = api.get_opt(name).await.ok()??;
        let status = a.status?;
        (status.observed_generation == a.metadata.generation).then_some(())?;
        Some(
            status
                .conditions
                .into_iter()
                .find(|c| c.type_ == "SieveScript")
                .map(|c| (c.status, c.reason, c.message)),
        )
    })
    .await
}

/// The account's active script, as delivery reads it.
async fn active_script(setup: &Setup, email: &str) -> Option<(String, String)> {
    let id = setup.store.account_get(email).await.unwrap()?.id;
    let (name, source) = setup.store.sieve_active(id).await.unwrap()?;
    Some((name, String::from_utf8(source).unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accounts_sieve_script_from_the_resource_or_a_config_map_is_checked_stored_and_removed() {
    let Some(setup) = Setup::new("sieve", |_| String::new()).await else { return };
    setup.example_domain().await;
    secret(&setup.ns, "carol-pw", "password", "carol's password").await;
    let mut obj = account("carol", "carol@example.com", "carol-pw", "Delete");
    let filing = "require \"fileinto\";\nif header :contains \"List-Id\" \"dev\" { fileinto \"Lists\"; }\n";
    obj["spec"]["sieve"] = json!({"inline": filing});
    setup.apply("mailaccounts", "carol", &obj).await;
    assert_eq!(setup.account_ready("carol").await, ("True".into(), "Stored".into()));
    let c = sieve_condition(&setup, "carol").await.expect("a SieveScript condition");
    assert_eq!((c.0.as_str(), c.1.as_str()), ("True", "Active"), "{c:?}");
    assert_eq!(active_script(&setup, "carol@example.com").await, Some(("kubernetes".into(), filing.into())));

    // A script the interpreter refuses is not stored; the condition quotes
    // the compiler, and the account stays ready with its last good script.
    obj["spec"]["sieve"] = json!({"inline": "require \"fileinto\";\nfileinto;\n"});
    setup.apply("mailaccounts", "carol", &obj).await;
    let c = eventually("the refusal", || async {
        sieve_condition(&setup, "carol").await.filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(c.1, "InvalidScript", "{c:?}");
    assert!(c.2.contains("line 2"), "the compiler's line: {c:?}");
    assert_eq!(setup.account_ready("carol").await.0, "True");
    assert_eq!(active_script(&setup, "carol@example.com").await.map(|s| s.1), Some(filing.into()));

    // From a ConfigMap: stored, and a change of the ConfigMap is stored
    // through its watch (the resync here is an hour).
    let config_map = |text: &str| -> ConfigMap {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "carol-sieve"}, "data": {"script": text}
        }))
        .unwrap()
    };
    let maps = setup.ns.api::<ConfigMap>();
    let v1 = "require \"vacation\";\nvacation \"Away this week\";\n";
    maps.patch("carol-sieve", &PatchParams::apply("accounts-test").force(), &Patch::Apply(&config_map(v1)))
        .await
        .expect("config map");
    obj["spec"]["sieve"] = json!({"configMapRef": {"name": "carol-sieve", "key": "script"}});
    setup.apply("mailaccounts", "carol", &obj).await;
    eventually("the ConfigMap's script active", || async {
        (active_script(&setup, "carol@example.com").await?.1 == v1).then_some(())
    })
    .await;
    let v2 = "require \"vacation\";\nvacation \"Away next week too\";\n";
    maps.patch("carol-sieve", &PatchParams::apply("accounts-test").force(), &Patch::Apply(&config_map(v2)))
        .await
        .expect("config map");
    eventually("the changed ConfigMap's script active", || async {
        (active_script(&setup, "carol@example.com").await?.1 == v2).then_some(())
    })
    .await;
    // A script the user uploaded beside it stays; removing spec.sieve
    // removes only the resource's script.
    let id = setup.store.account_get("carol@example.com").await.unwrap().unwrap().id;
    let quota = mailcluster_server::store::SieveQuota { max_scripts: 16, max_bytes: 65536 };
    setup.store.sieve_put(id, "mine", b"keep;", quota).await.unwrap();
    obj["spec"].as_object_mut().unwrap().remove("sieve");
    setup.apply("mailaccounts", "carol", &obj).await;
    eventually("the resource's script removed", || async {
        let names: Vec<String> = setup.store.sieve_list(id).await.ok()?.into_iter().map(|e| e.name).collect();
        (names == ["mine"]).then_some(())
    })
    .await;
    assert_eq!(active_script(&setup, "carol@example.com").await, None);
    assert_eq!(sieve_condition(&setup, "carol").await, None, "no condition without spec.sieve");
    setup.stop().await;
}
