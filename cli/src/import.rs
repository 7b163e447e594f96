//! `mailcluster user import`: accounts from another mail system, with their
//! password hashes (no password reset), in batches of one transaction each
//! (`Store::accounts_import`), and optionally the equivalent MailAccount
//! manifests for Git.
//!
//! The whole file is read and checked before anything is written: a migration
//! that stops at line 40,000 of 100,000 is harder to reason about than one that
//! names its bad lines and changes nothing.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context as _;
use mailcluster_model::ImportedAccount;
use mailcluster_server::provision::{self, PasswordSource};
use mailcluster_server::store::Store;
use serde_json::json;

use crate::args::{ImportFormat, QuotaSetting, parse_quota};
use crate::failure::Failure;

/// One account as read, before its password is hashed (for a plain one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadAccount {
    pub line: usize,
    pub email: String,
    pub password: PasswordSource,
    pub quota: Option<u64>,
    pub aliases: Vec<String>,
}

/// Bad lines shown, at most: the rest are counted.
const ERRORS_SHOWN: usize = 20;

/// The password field of a Dovecot passwd-file: `{SCHEME}value`. Hash schemes
/// are kept as hashes (checked against what the server verifies), the plain
/// ones hashed here; a value without a scheme must itself be a hash, since
/// Dovecot reads it with a configured default scheme this file does not tell.
fn dovecot_password(field: &str) -> Result<PasswordSource, String> {
    let Some(rest) = field.strip_prefix('{') else {
        return match PasswordSource::from_secret(field) {
            Ok(hash @ PasswordSource::Hash(_)) => Ok(hash),
            Ok(PasswordSource::Plain(_)) => {
                Err("a password without {SCHEME} that is no hash (write {PLAIN} for a plain one)".into())
            }
            Err(e) => Err(e.to_string()),
        };
    };
    let (scheme, value) = rest.split_once('}').ok_or("an unclosed {SCHEME}")?;
    match scheme.to_ascii_uppercase().as_str() {
        "PLAIN" | "CLEAR" | "CLEARTEXT" | "PLAINTEXT" if !value.is_empty() => {
            Ok(PasswordSource::Plain(value.to_string()))
        }
        "SHA512-CRYPT" | "SHA256-CRYPT" | "BLF-CRYPT" | "CRYPT" | "ARGON2I" | "ARGON2ID" => {
            match mailcluster_server::password::check(value) {
                Ok(_) => Ok(PasswordSource::Hash(value.to_string())),
                Err(e) => Err(e.to_string()),
            }
        }
        other => Err(format!("password scheme {{{other}}} cannot be verified by the server")),
    }
}

/// A quota as Dovecot writes it in `quota_rule=*:storage=SIZE` (k, M, G, T of
/// 1024, as ours).
fn dovecot_quota(extra: &str) -> Result<Option<u64>, String> {
    for field in extra.split_whitespace() {
        let Some(rule) =
            field.strip_prefix("userdb_quota_rule=").or_else(|| field.strip_prefix("quota_rule="))
        else {
            continue;
        };
        if let Some(size) = rule.strip_prefix("*:storage=") {
            return quota_octets(size);
        }
    }
    Ok(None)
}

/// An account's own limit from a size: `None` for the domain's default.
fn quota_octets(size: &str) -> Result<Option<u64>, String> {
    Ok(match parse_quota(size)? {
        QuotaSetting::Limit(n) => Some(n),
        QuotaSetting::Unlimited => Some(mailcluster_model::Quota::UNLIMITED),
        QuotaSetting::Default => None,
    })
}

/// Reads a Dovecot passwd-file: `user:password:uid:gid:gecos:home:shell:extra`,
/// the user a full address. Blank lines and `#` comments are skipped.
pub fn read_passwd_file(text: &str) -> (Vec<ReadAccount>, Vec<String>) {
    let mut accounts = Vec::new();
    let mut errors = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.splitn(8, ':').collect();
        let parsed = (|| {
            let email = provision::normalized(fields[0]);
            provision::check_email(&email).map_err(|e| e.to_string())?;
            let password = dovecot_password(fields.get(1).copied().unwrap_or_default())?;
            let quota = dovecot_quota(fields.get(7).copied().unwrap_or_default())?;
            Ok::<_, String>(ReadAccount { line: n, email, password, quota, aliases: Vec::new() })
        })();
        match parsed {
            Ok(account) => accounts.push(account),
            Err(e) => errors.push(format!("line {n}: {e}")),
        }
    }
    (accounts, errors)
}

/// Reads `address,password-hash,quota,aliases` (a header line naming `address`
/// first is skipped; quoted fields as RFC 4180, which argon2 hashes with their
/// commas need). The hash takes the forms of the passwd-file's password field;
/// the quota is a size (`500M`, `2G`) or empty for the domain's default; aliases
/// are separated by spaces or semicolons.
pub fn read_csv(text: &str) -> (Vec<ReadAccount>, Vec<String>) {
    let mut accounts = Vec::new();
    let mut errors = Vec::new();
    let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(text.as_bytes());
    for (i, record) in reader.records().enumerate() {
        let parsed = (|| {
            let record = record.map_err(|e| e.to_string())?;
            let n = record.position().map_or(i + 1, |p| p.line() as usize);
            let field = |k: usize| record.get(k).unwrap_or_default().trim();
            if n == 1 && field(0).eq_ignore_ascii_case("address") {
                return Ok(None);
            }
            let email = provision::normalized(field(0));
            provision::check_email(&email).map_err(|e| e.to_string())?;
            let password = dovecot_password(field(1))?;
            let quota = match field(2) {
                "" => None,
                size => quota_octets(size)?,
            };
            let aliases: Vec<String> =
                field(3).split([' ', ';']).filter(|a| !a.is_empty()).map(provision::normalized).collect();
            for alias in &aliases {
                provision::check_email(alias).map_err(|e| e.to_string())?;
            }
            Ok::<_, String>(Some(ReadAccount { line: n, email, password, quota, aliases }))
        })();
        match parsed {
            Ok(Some(account)) => accounts.push(account),
            Ok(None) => {}
            Err(e) => errors.push(format!("record {}: {e}", i + 1)),
        }
    }
    (accounts, errors)
}

/// A Kubernetes object name for an address: `alice-at-example.com`; an address
/// with characters a name cannot hold gets them replaced and a hash of the
/// address appended, so that two such addresses do not share a name.
pub fn object_name(address: &str) -> String {
    let base = address.to_ascii_lowercase().replacen('@', "-at-", 1);
    let mut name: String = base
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '-' })
        .collect();
    let lossy = name != base || name.starts_with(['-', '.']) || name.len() > 200;
    if lossy {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(address.as_bytes());
        let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
        name = name.trim_matches(['-', '.']).chars().take(200).collect();
        name = format!("{name}-{hex}");
    }
    name
}

/// The MailAccount manifest of `account`, naming the Secret its password is in.
fn manifest(account: &ImportedAccount, cluster: &str, namespace: Option<&str>) -> serde_json::Value {
    let name = object_name(&account.email);
    let mut spec = json!({
        "clusterRef": cluster,
        "address": account.email,
        "passwordSecretRef": {"name": format!("{name}-password"), "key": "password"},
    });
    if let Some(q) = account.quota {
        spec["quotaBytes"] = json!(q);
    }
    if !account.aliases.is_empty() {
        spec["aliases"] = json!(account.aliases);
    }
    let mut metadata = json!({"name": name});
    if let Some(ns) = namespace {
        metadata["namespace"] = json!(ns);
    }
    json!({"apiVersion": "mailcluster.dev/v1alpha1", "kind": "MailAccount", "metadata": metadata, "spec": spec})
}

/// The password Secret a manifest names, holding the stored hash.
fn secret(account: &ImportedAccount, namespace: Option<&str>) -> serde_json::Value {
    let mut metadata = json!({"name": format!("{}-password", object_name(&account.email))});
    if let Some(ns) = namespace {
        metadata["namespace"] = json!(ns);
    }
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": "Opaque",
           "stringData": {"password": account.password_hash}})
}

/// Writes `DIR/<name>.yaml` for each MailAccount and `DIR/secrets/<name>-password.yaml`
/// for each Secret: the Secrets hold password hashes, which belong in Git only
/// sealed or as references to an external secret store.
fn emit_manifests(
    dir: &Path,
    accounts: &[ImportedAccount],
    cluster: &str,
    namespace: Option<&str>,
) -> anyhow::Result<()> {
    let secrets = dir.join("secrets");
    std::fs::create_dir_all(&secrets).with_context(|| format!("cannot create {}", secrets.display()))?;
    for account in accounts {
        let name = object_name(&account.email);
        let write = |path: PathBuf, value: serde_json::Value| {
            let text = serde_yaml_ng::to_string(&value)?;
            std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
        };
        write(dir.join(format!("{name}.yaml")), manifest(account, cluster, namespace))?;
        write(secrets.join(format!("{name}-password.yaml")), secret(account, namespace))?;
    }
    Ok(())
}

/// What `user import` was asked.
pub struct ImportRequest<'a> {
    pub file: &'a Path,
    pub format: ImportFormat,
    pub batch: usize,
    pub emit_manifests: Option<&'a Path>,
    pub cluster: &'a str,
    pub namespace: Option<&'a str>,
}

/// Reads and checks the file, hashes plain passwords, adds the domains not
/// served yet, imports batch by batch with a progress line each, and writes the
/// manifests. Returns the addresses created (whose cached "no such user" entries
/// the caller drops).
pub async fn run(store: &dyn Store, req: &ImportRequest<'_>) -> Result<Vec<String>, Failure> {
    let text = std::fs::read_to_string(req.file)
        .with_context(|| format!("cannot read {}", req.file.display()))
        .map_err(Failure::usage)?;
    let format = match req.format {
        ImportFormat::Auto if req.file.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv")) => {
            ImportFormat::Csv
        }
        ImportFormat::Auto => ImportFormat::Passwd,
        f => f,
    };
    let (read, errors) = match format {
        ImportFormat::Csv => read_csv(&text),
        _ => read_passwd_file(&text),
    };
    if !errors.is_empty() {
        for e in errors.iter().take(ERRORS_SHOWN) {
            eprintln!("{}: {e}", req.file.display());
        }
        if errors.len() > ERRORS_SHOWN {
            eprintln!("… and {} more", errors.len() - ERRORS_SHOWN);
        }
        return Err(Failure::usage(anyhow::anyhow!(
            "{} of {} entries cannot be imported; nothing was imported",
            errors.len(),
            errors.len() + read.len()
        )));
    }
    let accounts = hashed(read).await?;
    let mut domains: Vec<&str> = accounts
        .iter()
        .flat_map(|a| std::iter::once(&a.email).chain(&a.aliases))
        .filter_map(|a| a.rsplit_once('@').map(|(_, d)| d))
        .collect();
    domains.sort_unstable();
    domains.dedup();
    for domain in domains {
        if provision::ensure_domain(store, domain)
            .await
            .with_context(|| format!("cannot add domain {domain}"))?
        {
            eprintln!("domain {domain} added");
        }
    }
    let started = Instant::now();
    let (mut created, mut existing) = (Vec::new(), 0usize);
    let mut done = 0usize;
    for chunk in accounts.chunks(req.batch.max(1)) {
        let outcome = store
            .accounts_import(chunk)
            .await
            .with_context(|| format!("cannot import the batch starting with {}", chunk[0].email))?;
        existing += outcome.existing.len();
        created.extend(chunk.iter().map(|a| a.email.clone()).filter(|e| !outcome.existing.contains(e)));
        done += chunk.len();
        let rate = done as f64 / started.elapsed().as_secs_f64().max(1e-3);
        eprint!(
            "\rimported {done}/{} ({} created, {existing} existing) {rate:.0}/s",
            accounts.len(),
            created.len()
        );
        let _ = std::io::stderr().flush();
    }
    eprintln!(
        "\n{} accounts created, {existing} existed already, in {:.1} s",
        created.len(),
        started.elapsed().as_secs_f64()
    );
    if let Some(dir) = req.emit_manifests {
        emit_manifests(dir, &accounts, req.cluster, req.namespace)?;
        eprintln!(
            "{} MailAccount manifests in {}, their password Secrets in {}/secrets (seal them before committing)",
            accounts.len(),
            dir.display(),
            dir.display()
        );
    }
    Ok(created)
}

/// The accounts with stored hashes: plain passwords hashed with the server's
/// argon2id, on the blocking pool, as many at once as there are cores.
async fn hashed(read: Vec<ReadAccount>) -> anyhow::Result<Vec<ImportedAccount>> {
    use futures::StreamExt as _;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    futures::stream::iter(read)
        .map(|a| async move {
            let password_hash = a.password.stored_hash().await?;
            anyhow::Ok(ImportedAccount { email: a.email, password_hash, quota: a.quota, aliases: a.aliases })
        })
        .buffered(cores)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Made by glibc's crypt(3): crypt.crypt('migrated pass', '$6$saltsalt$') and
    // crypt.crypt('migrated pass', '$2y$05$abcdefghijklmnopqrstuu').
    const SHA512: &str =
        "$6$saltsalt$UV8BYgqN7u34iPYiLihbOjmF22xo0X75SlnQFYRpDJsgJaXUiVT9jRyx4l4tz0FMJBBZGZbqw/l1xfhEu2dJa/";
    const BCRYPT: &str = "$2y$05$abcdefghijklmnopqrstuuVVzYGn6PXgpP3f4Lku9ALBvLuGFYlf2";

    #[test]
    fn dovecot_passwd_files_are_read_with_their_schemes_and_quotas() {
        let text = format!(
            "# users\n\
             Alice@Example.com:{{SHA512-CRYPT}}{SHA512}:1000:1000::/home/alice::userdb_quota_rule=*:storage=1G\n\
             \n\
             bob@example.com:{{BLF-CRYPT}}{BCRYPT}::::::\n\
             carol@example.com:{{PLAIN}}secret\n\
             dave@example.com:{BCRYPT}\n\
             eve@example.com:{{MD5-CRYPT}}$1$x$y\n\
             frank@example.com:plainpassword\n\
             nobody:{{PLAIN}}x\n\
             gina@example.com:{{SHA512-CRYPT}}$6$rounds=2000000$salt$abc\n"
        );
        let (accounts, errors) = read_passwd_file(&text);
        let got: Vec<(&str, usize, Option<u64>)> =
            accounts.iter().map(|a| (a.email.as_str(), a.line, a.quota)).collect();
        assert_eq!(
            got,
            [
                ("alice@example.com", 2, Some(1 << 30)),
                ("bob@example.com", 4, None),
                ("carol@example.com", 5, None),
                ("dave@example.com", 6, None),
            ]
        );
        assert_eq!(accounts[0].password, PasswordSource::Hash(SHA512.into()));
        assert_eq!(accounts[1].password, PasswordSource::Hash(BCRYPT.into()));
        assert_eq!(accounts[2].password, PasswordSource::Plain("secret".into()));
        assert_eq!(errors.len(), 4, "{errors:?}");
        assert!(errors[0].starts_with("line 7:") && errors[0].contains("MD5-CRYPT"), "{errors:?}");
        assert!(errors[1].starts_with("line 8:") && errors[1].contains("{PLAIN}"), "{errors:?}");
        assert!(errors[2].starts_with("line 9:"), "{errors:?}");
        assert!(
            errors[3].starts_with("line 10:") && errors[3].contains("1000000"),
            "over the bound: {errors:?}"
        );
    }

    #[test]
    fn csv_rows_carry_quota_and_aliases_and_quoted_argon2_hashes() {
        let argon2 = "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXoxMjM0NTY";
        let text = format!(
            "address,password-hash,quota,aliases\n\
             alice@example.com,{SHA512},500M,sales@example.com;Info@example.com\n\
             bob@example.com,\"{argon2}\",,\n\
             carol@example.com,notahash,,\n"
        );
        let (accounts, errors) = read_csv(&text);
        assert_eq!(accounts.len(), 2, "{errors:?}");
        assert_eq!(accounts[0].quota, Some(500 << 20));
        assert_eq!(accounts[0].aliases, ["sales@example.com", "info@example.com"]);
        assert_eq!(accounts[1].password, PasswordSource::Hash(argon2.into()));
        assert_eq!(accounts[1].quota, None);
        assert_eq!(errors.len(), 1);
        assert!(errors[0].contains("no hash"), "{errors:?}");
    }

    #[test]
    fn object_names_are_valid_and_distinct() {
        assert_eq!(object_name("alice@example.com"), "alice-at-example.com");
        let odd = object_name("a+b@example.com");
        assert!(
            odd.starts_with("a-b-at-example.com-") && odd.len() == "a-b-at-example.com-".len() + 8,
            "{odd}"
        );
        assert_ne!(object_name("a+b@example.com"), object_name("a_b@example.com"));
        let account = ImportedAccount {
            email: "alice@example.com".into(),
            password_hash: SHA512.into(),
            quota: Some(1024),
            aliases: vec!["sales@example.com".into()],
        };
        let m = manifest(&account, "mail", Some("mail-ns"));
        assert_eq!(m["spec"]["passwordSecretRef"]["name"], "alice-at-example.com-password");
        assert_eq!(m["spec"]["quotaBytes"], 1024);
        assert_eq!(m["metadata"]["namespace"], "mail-ns");
        assert_eq!(secret(&account, None)["stringData"]["password"], SHA512);
    }
}
