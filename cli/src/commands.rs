//! What each subcommand does. Commands that touch accounts or domains open the
//! store from the same configuration as `serve`, so they work against the embedded
//! SQLite default and against PostgreSQL (`MAILCLUSTER_DATABASE_URL`) alike.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use mailcluster_model::{DomainKey, Quota};
use mailcluster_server::config::Config;
use mailcluster_server::provision::{self, PasswordSource, ProvisionError, WantedAccount};
use mailcluster_server::store::{Store, StoreError};
use mailcluster_stress::StressArgs;

use crate::args::{
    AliasCommand, ConfigArg, DkimCommand, DomainCommand, PasswordArgs, QueueCommand, QuotaSetting,
    SendersCommand, ServeArgs, SieveCommand, UserCommand,
};
use crate::failure::Failure;

/// Loads the configuration from `--config` and the process environment.
pub fn load_config(arg: &ConfigArg) -> Result<Config, Failure> {
    mailcluster_server::config::load(arg.config.as_deref(), std::env::vars()).map_err(Failure::usage)
}

pub async fn serve(args: &ServeArgs, config: Config) -> Result<(), Failure> {
    if args.print_config {
        print!("{}", config.to_redacted_toml());
        return Ok(());
    }
    mailcluster_server::serve::run(config).await?;
    Ok(())
}

/// Applies the schema migrations, then makes sure `domains` are served: each is
/// added when missing and none is ever removed (deleting a domain is an explicit
/// `domain del`, never a side effect of a list that changed).
pub async fn migrate(config: &Config, domains: &[String]) -> Result<(), Failure> {
    let store = mailcluster_server::serve::open_store(config).await?;
    store.migrate().await.context("migration failed")?;
    tracing::info!(backend = store.backend(), "schema is up to date");
    for domain in domains {
        let domain = checked_domain(domain)?;
        let added = provision::ensure_domain(&*store, &domain)
            .await
            .map_err(|e| failure(e, format!("cannot add domain {domain}")))?;
        if added {
            tracing::info!(%domain, "domain added");
        }
    }
    Ok(())
}

/// `mailcluster stress`, and with `--provision-accounts` the accounts it logs in as:
/// created when missing, given a password made for this run, and locked with another
/// one nobody knows once the run is over, whatever its outcome.
pub async fn stress(mut args: StressArgs) -> Result<i32, Failure> {
    if !args.provision_accounts || args.print || args.sink.is_some() {
        return Ok(mailcluster_stress::run(args).await);
    }
    let users = mailcluster_stress::args::planned_users(&args).map_err(Failure::usage)?;
    let config = mailcluster_server::config::load(None, std::env::vars()).map_err(Failure::usage)?;
    let store = admin_store(&config).await?;
    let password = random_password();
    let emails: Vec<&str> = users.list.iter().map(|(email, _)| email.as_str()).collect();
    // One hash for every account: the password is the same and argon2 is slow by design.
    set_passwords(&config, &*store, &emails, &hash(&password).await?, true).await?;
    eprintln!("{} stress accounts ready", emails.len());
    args.password = Some(password);
    let code = mailcluster_stress::run(args).await;
    set_passwords(&config, &*store, &emails, &hash(&random_password()).await?, false).await?;
    eprintln!("{} stress accounts locked", emails.len());
    Ok(code)
}

async fn set_passwords(
    config: &Config,
    store: &dyn Store,
    emails: &[&str],
    hash: &str,
    create: bool,
) -> Result<(), Failure> {
    let mut ids = Vec::with_capacity(emails.len());
    for email in emails {
        check_email(email)?;
        let existing = store.account_get(email).await.with_context(|| format!("cannot look up {email}"))?;
        let id = match existing {
            Some(account) => {
                store
                    .account_set_password(email, hash)
                    .await
                    .with_context(|| format!("cannot set the password of {email}"))?;
                account.id
            }
            None if create => {
                store
                    .account_create(email, hash)
                    .await
                    .with_context(|| format!("cannot create stress account {email}"))?
                    .id
            }
            None => continue,
        };
        ids.push(id);
    }
    forget_cached(config, &ids, &[]).await;
    Ok(())
}

/// 24 random bytes, hex: a password for one run, never shown.
fn random_password() -> String {
    let mut bytes = [0u8; 24];
    rand::fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Opens the store for an admin command, applying migrations first when the
/// configuration says the server would (the embedded default), so that a fresh
/// install can be populated before it is ever served.
async fn admin_store(config: &Config) -> Result<Arc<dyn Store>, Failure> {
    let store = mailcluster_server::serve::open_store(config).await?;
    if config.database.migrate_on_start {
        store.migrate().await.context("migration failed")?;
    }
    Ok(store)
}

pub async fn sieve(config: &Config, command: &SieveCommand) -> Result<(), Failure> {
    use mailcluster_server::scripts;
    let store = admin_store(config).await?;
    // A refusal of the input (a name, a script, a limit) is the operator's to
    // fix (exit 2); a missing user or script, or the store failing, is not.
    let fail = |e: StoreError, doing: String| match e {
        StoreError::Invalid(_) | StoreError::OverQuota(_) => {
            Failure::usage(anyhow::Error::from(e).context(doing))
        }
        e => Failure::runtime(anyhow::Error::from(e).context(doing)),
    };
    match command {
        SieveCommand::Put { user, name, file, activate } => {
            let source = if file.as_os_str() == "-" {
                let mut buf = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut buf)
                    .context("cannot read stdin")?;
                buf
            } else {
                std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?
            };
            // The pods' own interpreter: a script stored here is one delivery runs.
            let checker = mailcluster_server::scripts::Filters::from_config(config);
            scripts::put(&*store, &checker, scripts::quota_of(config), user, name, &source, *activate)
                .await
                .map_err(|e| fail(e, format!("cannot store script {name} of {user}")))?;
            eprintln!("script {name} of {user} stored{}", if *activate { " and active" } else { "" });
        }
        SieveCommand::List { user } => {
            let list = scripts::list(&*store, user)
                .await
                .map_err(|e| fail(e, format!("cannot list {user}'s scripts")))?;
            let mut out = std::io::stdout().lock();
            for entry in list {
                writeln!(out, "{}{}", entry.name, if entry.active { " ACTIVE" } else { "" })?;
            }
        }
        SieveCommand::Activate { user, name, .. } => {
            scripts::activate(&*store, user, name.as_deref())
                .await
                .map_err(|e| fail(e, format!("cannot activate a script of {user}")))?;
            match name {
                Some(name) => eprintln!("script {name} of {user} active"),
                None => eprintln!("no script of {user} active"),
            }
        }
        SieveCommand::Get { user, name } => {
            let source = scripts::get(&*store, user, name)
                .await
                .map_err(|e| fail(e, format!("cannot read script {name} of {user}")))?;
            std::io::stdout().lock().write_all(&source)?;
        }
        SieveCommand::Delete { user, name } => {
            scripts::delete(&*store, user, name)
                .await
                .map_err(|e| fail(e, format!("cannot delete script {name} of {user}")))?;
            eprintln!("script {name} of {user} deleted");
        }
    }
    Ok(())
}

pub async fn alias(config: &Config, command: &AliasCommand) -> Result<(), Failure> {
    let store = admin_store(config).await?;
    match command {
        AliasCommand::Add { address, targets } => {
            // said back as stored: addresses are kept lower-cased
            let address = address.trim().to_lowercase();
            for target in targets.iter().map(|t| provision::normalized(t)) {
                let added = provision::alias_add(&*store, &address, &target)
                    .await
                    .map_err(|e| failure(e, format!("cannot add alias {address} → {target}")))?;
                if !added {
                    return Err(anyhow::anyhow!("alias {address} → {target} already exists").into());
                }
                eprintln!("alias {address} → {target} added");
            }
            forget_cached(config, &[], &[&address]).await;
        }
        AliasCommand::Del { address, target } => {
            let address = address.trim().to_lowercase();
            let target = target.as_deref().map(|t| t.trim().to_lowercase());
            store
                .alias_del(&address, target.as_deref())
                .await
                .with_context(|| format!("cannot delete alias {address}"))?;
            forget_cached(config, &[], &[&address]).await;
            match target {
                Some(target) => eprintln!("alias {address} → {target} deleted"),
                None => eprintln!("alias {address} deleted"),
            }
        }
        AliasCommand::List { domain } => {
            let mut out = std::io::stdout().lock();
            for (address, target) in
                store.alias_list(domain.as_deref()).await.context("cannot list aliases")?
            {
                writeln!(out, "{address} {target}")?;
            }
        }
    }
    Ok(())
}

pub async fn domain(config: &Config, command: &DomainCommand) -> Result<(), Failure> {
    let store = admin_store(config).await?;
    match command {
        DomainCommand::Add { domain } => {
            let domain = checked_domain(domain)?;
            let added = provision::ensure_domain(&*store, &domain)
                .await
                .map_err(|e| failure(e, format!("cannot add domain {domain}")))?;
            if added {
                eprintln!("domain {domain} added");
            } else {
                eprintln!("domain {domain} already served");
            }
        }
        DomainCommand::Del { domain } => {
            store.domain_del(domain).await.with_context(|| format!("cannot delete domain {domain}"))?;
            eprintln!("domain {domain} deleted");
        }
        DomainCommand::List => {
            let mut out = std::io::stdout().lock();
            for domain in store.domain_list().await.context("cannot list domains")? {
                writeln!(out, "{domain}")?;
            }
        }
        DomainCommand::Quota { domain, size: None } => {
            let limit =
                store.domain_quota(domain).await.with_context(|| format!("cannot look up {domain}"))?;
            println!("{domain}: default limit {}", describe_limit(limit));
        }
        DomainCommand::Quota { domain, size: Some(setting) } => {
            let limit = match setting {
                QuotaSetting::Limit(n) => Some(*n),
                QuotaSetting::Default | QuotaSetting::Unlimited => None,
            };
            store
                .domain_set_quota(domain, limit)
                .await
                .with_context(|| format!("cannot set the quota of {domain}"))?;
            eprintln!("default quota of {domain}: {}", describe_limit(limit));
        }
        DomainCommand::CatchAll { domain, account: None, none: false } => {
            let target =
                store.domain_catch_all(domain).await.with_context(|| format!("cannot look up {domain}"))?;
            println!("{domain}: catch-all {}", target.as_deref().unwrap_or("none"));
        }
        DomainCommand::CatchAll { domain, account, .. } => {
            provision::set_catch_all(&*store, domain, account.as_deref())
                .await
                .map_err(|e| failure(e, format!("cannot set the catch-all of {domain}")))?;
            eprintln!("catch-all of {domain}: {}", account.as_deref().unwrap_or("none"));
        }
        DomainCommand::Key { domain, selector: None, none: false, .. } => {
            let domain = checked_domain(domain)?;
            let keys = store.domain_keys().await.context("cannot read the DKIM keys")?;
            match keys.iter().find(|k| k.domain == domain) {
                Some(k) => {
                    let txt = mailcluster_server::dkim::public_txt(k.private_pem.as_bytes(), &k.algorithm)?;
                    println!("{}._domainkey.{domain}. IN TXT \"{txt}\"", k.selector);
                }
                None => println!("{domain}: no DKIM key in the store"),
            }
        }
        DomainCommand::Key { domain, selector, key_file, algorithm, .. } => {
            let key = match (selector, key_file) {
                (Some(selector), Some(file)) => Some(DomainKey {
                    domain: domain.clone(),
                    selector: selector.clone(),
                    algorithm: algorithm.clone(),
                    private_pem: std::fs::read_to_string(file)
                        .with_context(|| format!("cannot read {}", file.display()))?,
                }),
                _ => None,
            };
            provision::set_domain_key(&*store, domain, key.as_ref())
                .await
                .map_err(|e| failure(e, format!("cannot set the DKIM key of {domain}")))?;
            match key {
                Some(k) => eprintln!("{domain} is signed with selector {} from now on", k.selector),
                None => eprintln!("{domain}: no DKIM key in the store"),
            }
        }
    }
    Ok(())
}

pub async fn user(config: &Config, command: &UserCommand) -> Result<(), Failure> {
    // Read and check the password before touching the store: a usage error should
    // not depend on the database being up.
    let password = match command {
        UserCommand::Add { email, password } | UserCommand::Passwd { email, password } => {
            check_email(email)?;
            Some(read_password(password)?)
        }
        _ => None,
    };
    let store = admin_store(config).await?;
    match (command, password) {
        (UserCommand::Add { email, .. }, Some(password)) => {
            // `add` never changes an existing account's password: that is `passwd`.
            if store.account_get(email).await.with_context(|| format!("cannot look up {email}"))?.is_some() {
                return Err(anyhow::anyhow!("cannot add user {email}: it already exists").into());
            }
            let wanted = WantedAccount {
                email: email.clone(),
                password: Some(PasswordSource::Plain(password)),
                ..Default::default()
            };
            let change = provision::apply_account(&*store, &wanted)
                .await
                .map_err(|e| failure(e, format!("cannot add user {email}")))?;
            let recipients: Vec<&str> = change.changed_recipients.iter().map(String::as_str).collect();
            forget_cached(config, &[], &recipients).await;
            eprintln!("user {} added", change.account.email);
        }
        (UserCommand::Passwd { email, .. }, Some(password)) => {
            let hash = hash(&password).await?;
            let account = existing_account(&*store, email).await?;
            store
                .account_set_password(email, &hash)
                .await
                .with_context(|| format!("cannot change the password of {email}"))?;
            forget_cached(config, &[account.id], &[]).await;
            eprintln!("password of {email} changed");
        }
        (UserCommand::Del { email }, _) => {
            let account = existing_account(&*store, email).await?;
            store.account_delete(email).await.with_context(|| format!("cannot delete user {email}"))?;
            forget_cached(config, &[account.id], &[&account.email]).await;
            eprintln!("user {email} deleted");
        }
        (UserCommand::Import { file, format, batch, emit_manifests, cluster, namespace }, _) => {
            let request = crate::import::ImportRequest {
                file,
                format: *format,
                batch: *batch,
                emit_manifests: emit_manifests.as_deref(),
                cluster,
                namespace: namespace.as_deref(),
            };
            let created = crate::import::run(&*store, &request).await?;
            let recipients: Vec<&str> = created.iter().map(String::as_str).collect();
            forget_cached(config, &[], &recipients).await;
        }
        (UserCommand::List { domain }, _) => {
            let accounts = store.account_list(domain.as_deref()).await.context("cannot list users")?;
            let mut out = std::io::stdout().lock();
            for account in accounts {
                writeln!(out, "{}", account.email)?;
            }
        }
        (UserCommand::Quota { email, size: None }, _) => {
            let account = existing_account(&*store, email).await?;
            let quota =
                store.quota(account.id).await.with_context(|| format!("cannot read the quota of {email}"))?;
            let source = match (quota.account_limit, quota.domain_limit) {
                (Some(_), _) => "",
                (None, Some(_)) => " (domain default)",
                (None, None) => "",
            };
            println!(
                "{}: used {} of {}{source}",
                account.email,
                describe_octets(quota.used),
                describe_limit(quota.limit())
            );
        }
        (UserCommand::Quota { email, size: Some(setting) }, _) => {
            let account = existing_account(&*store, email).await?;
            let limit = match setting {
                QuotaSetting::Limit(n) => Some(*n),
                QuotaSetting::Default => None,
                // "No limit" even where the domain has one.
                QuotaSetting::Unlimited => Some(Quota::UNLIMITED),
            };
            store
                .account_set_quota(email, limit)
                .await
                .with_context(|| format!("cannot set the quota of {email}"))?;
            forget_cached(config, &[], &[&account.email]).await;
            let quota =
                store.quota(account.id).await.with_context(|| format!("cannot read the quota of {email}"))?;
            eprintln!("quota of {}: {}", account.email, describe_limit(quota.limit()));
        }
        (UserCommand::Senders { command }, _) => senders(&*store, command).await?,
        (UserCommand::Add { .. } | UserCommand::Passwd { .. }, None) => {
            unreachable!("the password is read above for add and passwd")
        }
    }
    Ok(())
}

async fn senders(store: &dyn Store, command: &SendersCommand) -> Result<(), Failure> {
    match command {
        SendersCommand::Add { email, addresses } => {
            let account = existing_account(store, email).await?;
            // said back as stored: addresses are kept lower-cased
            for address in addresses.iter().map(|a| provision::normalized(a)) {
                let added = provision::sender_add(store, &account.email, &address).await.map_err(|e| {
                    failure(e, format!("cannot allow {} to send as {address}", account.email))
                })?;
                if !added {
                    return Err(anyhow::anyhow!("{} may already send as {address}", account.email).into());
                }
                eprintln!("{} may send as {address}", account.email);
            }
        }
        SendersCommand::Del { email, addresses } => {
            let account = existing_account(store, email).await?;
            for address in addresses.iter().map(|a| a.trim().to_lowercase()) {
                store
                    .account_sender_del(&account.email, &address)
                    .await
                    .with_context(|| format!("cannot withdraw {address} from {}", account.email))?;
                eprintln!("{} may no longer send as {address}", account.email);
            }
        }
        SendersCommand::List { email } => {
            let account = existing_account(store, email).await?;
            let rights = store
                .sender_rights(&account.email)
                .await
                .with_context(|| format!("cannot read the senders of {email}"))?;
            let mut out = std::io::stdout().lock();
            for alias in rights.aliases {
                writeln!(out, "alias {alias}")?;
            }
            for allowed in rights.allowed {
                writeln!(out, "allowed {allowed}")?;
            }
        }
    }
    Ok(())
}

async fn existing_account(store: &dyn Store, email: &str) -> Result<mailcluster_model::Account, Failure> {
    match store.account_get(email).await.with_context(|| format!("cannot look up {email}"))? {
        Some(account) => Ok(account),
        None => Err(anyhow::anyhow!("no such user: {email}").into()),
    }
}

/// Drops what the servers cached about an admin change, over one Redis
/// connection: the verified credentials of `account_ids` (so that an old
/// password stops working at once), and the SMTP recipient entries of
/// `recipients` (an account, with a quota to check or not, or an alias and its
/// targets), and with those every pod's copy (Redis tracks them). The
/// in-process cache of a running embedded server is out of reach and expires
/// by itself (`smtp.recipient_cache_ttl_secs` for recipients). Failing here is
/// a warning: the change itself is already stored.
async fn forget_cached(config: &Config, account_ids: &[i64], recipients: &[&str]) {
    if config.redis.url.is_none() || (account_ids.is_empty() && recipients.is_empty()) {
        return;
    }
    let forget = async {
        let cache = mailcluster_server::serve::open_cache(config).await?;
        mailcluster_server::provision::forget_cached(cache.as_ref(), account_ids, recipients).await?;
        anyhow::Ok(())
    };
    if let Err(e) = forget.await {
        tracing::warn!(error = %format!("{e:#}"), "cannot clear cached entries; they expire by themselves");
    }
}

/// `1.5 GiB`, `512 KiB`, `700 B`.
fn describe_octets(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

fn describe_limit(limit: Option<u64>) -> String {
    match limit {
        Some(n) if n < Quota::UNLIMITED => describe_octets(n),
        _ => "no limit".into(),
    }
}

fn checked_domain(domain: &str) -> Result<String, Failure> {
    provision::checked_domain(domain).map_err(|e| Failure::usage(anyhow::Error::from(e)))
}

fn check_email(email: &str) -> Result<(), Failure> {
    provision::check_email(email).map_err(|e| Failure::usage(anyhow::Error::from(e)))
}

/// A provisioning error with what was being done; the input's own faults are
/// usage errors (exit code 2), the rest runtime ones.
fn failure(e: ProvisionError, doing: String) -> Failure {
    match e {
        ProvisionError::Invalid(_) => Failure::usage(anyhow::Error::from(e).context(doing)),
        e => Failure::runtime(anyhow::Error::from(e).context(doing)),
    }
}

/// argon2id is deliberately slow; keep it off the async workers.
async fn hash(password: &str) -> Result<String, Failure> {
    let password = password.to_string();
    let hash = tokio::task::spawn_blocking(move || mailcluster_server::auth::hash_password(&password))
        .await
        .context("password hashing task failed")?
        .context("cannot hash the password")?;
    Ok(hash)
}

/// `--password` (insecure), `--password-file FILE`, or the first line of stdin.
fn read_password(args: &PasswordArgs) -> Result<String, Failure> {
    let password = if let Some(password) = &args.password {
        password.clone()
    } else if let Some(path) = &args.password_file {
        first_line(path)?
    } else {
        let stdin = std::io::stdin();
        if stdin.is_terminal() {
            eprint!("Password: ");
            let _ = std::io::stderr().flush();
        }
        let mut line = String::new();
        stdin.lock().read_line(&mut line).context("cannot read the password from stdin")?;
        line.trim_end_matches(['\n', '\r']).to_string()
    };
    if password.is_empty() {
        return Err(Failure::usage(anyhow::anyhow!(
            "empty password (give it on stdin, with --password-file FILE or --password VALUE)"
        )));
    }
    Ok(password)
}

fn first_line(path: &Path) -> Result<String, Failure> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read password file {}", path.display()))
        .map_err(Failure::usage)?;
    Ok(text.lines().next().unwrap_or("").to_string())
}

pub async fn queue(config: &Config, command: &QueueCommand) -> Result<(), Failure> {
    let store = admin_store(config).await?;
    let mut out = std::io::stdout().lock();
    match command {
        QueueCommand::List { limit, json } => {
            let entries = store.queue_list(*limit).await.context("cannot list the queue")?;
            if *json {
                for e in &entries {
                    writeln!(out, "{}", serde_json::to_string(e).context("cannot encode")?)?;
                }
            } else if entries.is_empty() {
                writeln!(out, "queue is empty")?;
            } else {
                writeln!(
                    out,
                    "{:>8}  {:>8}  {:>3}  {:<20}  {:<30}  recipients / last error",
                    "id", "size", "try", "next attempt", "sender"
                )?;
                for e in &entries {
                    let sender = if e.sender.is_empty() { "<>" } else { e.sender.as_str() };
                    writeln!(
                        out,
                        "{:>8}  {:>8}  {:>3}  {:<20}  {:<30}  {}",
                        e.id,
                        e.size,
                        e.attempts,
                        e.next_attempt.format("%Y-%m-%d %H:%M:%S"),
                        sender,
                        e.recipients.join(", ")
                    )?;
                    if let Some(err) = &e.last_error {
                        writeln!(out, "{:>58}{err}", "")?;
                    }
                }
            }
        }
        QueueCommand::Show { id, json } => {
            let Some((entry, raw)) = store.queue_get(*id).await.context("cannot read the queue")? else {
                return Err(Failure::runtime(anyhow::anyhow!("no queue item {id}")));
            };
            if *json {
                writeln!(out, "{}", serde_json::to_string_pretty(&entry).context("cannot encode")?)?;
                return Ok(());
            }
            writeln!(out, "id:           {}", entry.id)?;
            writeln!(out, "sender:       <{}>", entry.sender)?;
            writeln!(out, "to deliver:   {}", entry.recipients.join(", "))?;
            writeln!(out, "size:         {} octets", entry.size)?;
            writeln!(out, "queued:       {}", entry.created_at)?;
            writeln!(out, "attempts:     {}", entry.attempts)?;
            writeln!(out, "next attempt: {}", entry.next_attempt)?;
            writeln!(out, "expires:      {}", entry.expires_at)?;
            if let Some(worker) = &entry.locked_by {
                writeln!(out, "in delivery:  by {worker}")?;
            }
            if let Some(err) = &entry.last_error {
                writeln!(out, "last error:   {err}")?;
            }
            for o in &entry.outcomes {
                writeln!(
                    out,
                    "  {}  {:<8}  {}  {}",
                    o.at,
                    format!("{:?}", o.status).to_lowercase(),
                    o.recipient,
                    o.reply
                )?;
            }
            writeln!(out)?;
            out.write_all(mailcluster_server::relay::dsn::header_section(&raw))?;
        }
        QueueCommand::Retry { id, all: _ } => {
            let n = store.queue_retry(*id).await.context("cannot reschedule")?;
            writeln!(out, "{n} message(s) due now")?;
        }
        QueueCommand::Delete { id } => {
            if !store.queue_delete(*id).await.context("cannot delete")? {
                return Err(Failure::runtime(anyhow::anyhow!("no queue item {id}")));
            }
            writeln!(out, "queue item {id} deleted")?;
        }
    }
    Ok(())
}

pub fn dkim(command: &DkimCommand) -> Result<(), Failure> {
    match command {
        DkimCommand::Generate { domain, selector, algorithm, out } => {
            let domain = checked_domain(domain)?;
            let key = mailcluster_server::dkim::generate(algorithm)?;
            let path = out.clone().unwrap_or_else(|| PathBuf::from(format!("{domain}.{selector}.key")));
            mailcluster_server::dkim::write_key_file(&path, &key.private_pem)?;
            let mut stdout = std::io::stdout().lock();
            writeln!(
                stdout,
                "private key written to {} (keep it secret; mount it as a Secret)",
                path.display()
            )?;
            writeln!(stdout, "publish this TXT record:")?;
            writeln!(stdout, "{selector}._domainkey.{domain}. IN TXT {}", key.zone_value())?;
            writeln!(stdout, "and add to the configuration:")?;
            writeln!(stdout, "[[dkim.keys]]")?;
            writeln!(
                stdout,
                "domain = \"{domain}\"\nselector = \"{selector}\"\nkey_file = \"{}\"\nalgorithm = \"{algorithm}\"",
                path.display()
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_checked() {
        assert!(check_email("a@b.c").is_ok());
        for bad in ["a", "@b", "a@", "a b@c", ""] {
            assert_eq!(check_email(bad).unwrap_err().code, 2, "{bad}");
        }
    }

    #[test]
    fn password_file_takes_the_first_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "s3cret\r\nsecond\n").unwrap();
        let args = PasswordArgs { password_file: Some(path), password: None };
        assert_eq!(read_password(&args).unwrap(), "s3cret");
        let args = PasswordArgs { password_file: Some(dir.path().join("missing")), password: None };
        assert_eq!(read_password(&args).unwrap_err().code, 2);
        let args = PasswordArgs { password_file: None, password: Some(String::new()) };
        assert_eq!(read_password(&args).unwrap_err().code, 2);
    }
}
