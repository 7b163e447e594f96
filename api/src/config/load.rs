//! Loading: file, then environment, then validation.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::Config;

/// Prefix of every environment variable that configures the server.
pub const ENV_PREFIX: &str = "MAILCLUSTER_";

/// Variables with the prefix that are not configuration keys: they are read by the
/// command line (`--config`) and must not be reported as unknown.
const ENV_NOT_CONFIG: &[&str] = &["MAILCLUSTER_CONFIG"];

/// Why a configuration could not be loaded. Every variant names where the bad value
/// came from (file and line, or variable) in one line, so an operator reading a pod's
/// last log line knows what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}:{line}:{column}: {message}", path.display())]
    File { path: PathBuf, line: usize, column: usize, message: String },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The file formats `--config` accepts, chosen by extension (`.yaml`/`.yml` → YAML,
/// anything else TOML, the documented format).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileFormat {
    Toml,
    Yaml,
}

impl FileFormat {
    fn of(path: &Path) -> FileFormat {
        match path.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase()).as_deref() {
            Some("yaml" | "yml") => FileFormat::Yaml,
            _ => FileFormat::Toml,
        }
    }
}

impl Config {
    /// Loads the effective configuration: defaults, then the file at `path` (if
    /// any), then every `MAILCLUSTER_*` variable in `env`. The result is validated.
    ///
    /// `env` is passed in (normally `std::env::vars()`) so tests need not mutate the
    /// process environment.
    pub fn load(
        path: Option<&Path>,
        env: impl Iterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let config = Config::parse(path, env)?;
        config.validate()?;
        Ok(config)
    }

    /// [`Config::load`] without the validation: what the file and the variables
    /// say, on top of the defaults.
    pub fn parse(
        path: Option<&Path>,
        env: impl Iterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut table = match path {
            Some(path) => read_file(path)?,
            None => toml::Table::new(),
        };
        apply_env(&mut table, env)?;
        from_table(table).map_err(|e| ConfigError::Invalid(one_line(e.message())))
    }
}

fn one_line(message: &str) -> String {
    message.trim().replace('\n', "; ")
}

fn from_table(table: toml::Table) -> Result<Config, toml::de::Error> {
    toml::Value::Table(table).try_into()
}

/// Reads and checks the file, returning it as a table for the environment to
/// override. The file is deserialized into `Config` once here so that its errors
/// point at its own line, before any variable could be blamed.
fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
    let at = |line: usize, column: usize, message: &str| ConfigError::File {
        path: path.to_path_buf(),
        line,
        column,
        message: one_line(message),
    };
    match FileFormat::of(path) {
        FileFormat::Toml => {
            if let Err(e) = toml::from_str::<Config>(&text) {
                let (line, column) = e.span().map(|s| line_col(&text, s.start)).unwrap_or((1, 1));
                return Err(at(line, column, e.message()));
            }
            text.parse::<toml::Table>().map_err(|e| at(1, 1, e.message()))
        }
        FileFormat::Yaml => {
            let yaml_at = |e: serde_yaml_ng::Error| {
                let (line, column) = e.location().map(|l| (l.line(), l.column())).unwrap_or((1, 1));
                // The location is carried separately; drop the " at line …" suffix.
                let message = e.to_string();
                let message = message.split(" at line ").next().unwrap_or(&message).to_string();
                at(line, column, &message)
            };
            if text.trim().is_empty() {
                return Ok(toml::Table::new());
            }
            serde_yaml_ng::from_str::<Config>(&text).map_err(yaml_at)?;
            serde_yaml_ng::from_str::<toml::Table>(&text).map_err(yaml_at)
        }
    }
}

/// 1-based line and column of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
    (line, column)
}

/// Where a documented variable goes. Everything else follows the generic rule
/// `MAILCLUSTER_SECTION__KEY` → `section.key`.
fn documented_key(name: &str) -> Option<&'static [&'static str]> {
    Some(match name {
        "DATABASE_URL" => &["database", "url"],
        "REDIS_URL" => &["redis", "url"],
        "DATA_DIR" => &["data_dir"],
        "TLS_CERT" => &["tls", "cert"],
        "TLS_KEY" => &["tls", "key"],
        "PROTOCOLS" => &["protocols"],
        "LISTEN_ADDR" => &["listen_addr"],
        "HOSTNAME" => &["hostname"],
        "LOG_LEVEL" => &["log", "level"],
        "LOG_FORMAT" => &["log", "format"],
        "SMTP_PORT" => &["ports", "smtp"],
        "SUBMISSION_PORT" => &["ports", "submission"],
        "SUBMISSIONS_PORT" => &["ports", "submissions"],
        "IMAP_PORT" => &["ports", "imap"],
        "IMAPS_PORT" => &["ports", "imaps"],
        "POP3_PORT" => &["ports", "pop3"],
        "POP3S_PORT" => &["ports", "pop3s"],
        "MANAGESIEVE_PORT" => &["ports", "managesieve"],
        "ADMIN_PORT" => &["ports", "admin"],
        _ => return None,
    })
}

/// Secrets that may instead be read from a file (a mounted Kubernetes Secret):
/// `MAILCLUSTER_<NAME>_FILE`.
const FILE_SECRETS: &[&str] =
    &["DATABASE_URL", "REDIS_URL", "RELAY__SMARTHOST_PASSWORD", "CACHE__MAC_KEY", "FILTER__RSPAMD__PASSWORD"];

/// Kubernetes injects `<SERVICE>_SERVICE_HOST`, `<SERVICE>_PORT=tcp://…` and
/// `<SERVICE>_PORT_<n>_TCP…` for every Service in the namespace ("service links"),
/// so a Service named `mailcluster-smtp` would otherwise collide with our variables.
/// Such variables are never configuration; they are ignored.
fn is_service_link(name: &str, value: &str) -> bool {
    if name.ends_with("_SERVICE_HOST") || name.ends_with("_SERVICE_PORT") || name.contains("_SERVICE_PORT_") {
        return true;
    }
    if name.ends_with("_PORT") && ["tcp://", "udp://", "sctp://"].iter().any(|p| value.starts_with(p)) {
        return true;
    }
    // `<SERVICE>_PORT_<number>_<PROTO>[_ADDR|_PORT|_PROTO]`
    if let Some(idx) = name.find("_PORT_") {
        let after = &name[idx + "_PORT_".len()..];
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        if digits > 0 {
            let proto = &after[digits..];
            return ["_TCP", "_UDP", "_SCTP"].iter().any(|p| proto.starts_with(p));
        }
    }
    false
}

/// One override taken from the environment, ready to be applied to the table.
struct Override {
    var: String,
    path: Vec<String>,
    /// `None` removes the key (an empty variable means "unset").
    raw: Option<String>,
    /// The documented list variables are comma-separated.
    list: bool,
}

fn collect_overrides(env: impl Iterator<Item = (String, String)>) -> Result<Vec<Override>, ConfigError> {
    let vars: BTreeMap<String, String> = env.filter(|(k, _)| k.starts_with(ENV_PREFIX)).collect();
    let mut out = Vec::new();
    for (var, value) in &vars {
        if ENV_NOT_CONFIG.contains(&var.as_str()) || is_service_link(var, value) {
            continue;
        }
        let name = &var[ENV_PREFIX.len()..];
        let env_err = |message: String| ConfigError::Env { var: var.clone(), message };

        if let Some(secret) = name.strip_suffix("_FILE").filter(|s| FILE_SECRETS.contains(s)) {
            if vars.get(&format!("{ENV_PREFIX}{secret}")).is_some_and(|v| !v.is_empty()) {
                return Err(env_err(format!("both {ENV_PREFIX}{secret} and {var} are set; use one")));
            }
            if value.is_empty() {
                continue;
            }
            let content =
                std::fs::read_to_string(value).map_err(|e| env_err(format!("cannot read {value}: {e}")))?;
            // Secret files usually end with a newline that is not part of the value.
            let content = content.trim_end_matches(['\n', '\r']).to_string();
            let path = match documented_key(secret) {
                Some(path) => path.iter().map(|s| s.to_string()).collect(),
                None => secret.split("__").map(|s| s.to_ascii_lowercase()).collect(),
            };
            out.push(Override { var: var.clone(), path, raw: Some(content), list: false });
            continue;
        }

        let (path, list): (Vec<String>, bool) = match documented_key(name) {
            Some(path) => (path.iter().map(|s| s.to_string()).collect(), name == "PROTOCOLS"),
            None => {
                let path: Vec<String> = name.split("__").map(|s| s.to_ascii_lowercase()).collect();
                if path.iter().any(|s| s.is_empty()) {
                    return Err(env_err("malformed name (empty section or key between '__')".into()));
                }
                (path, false)
            }
        };
        let raw = if value.is_empty() { None } else { Some(value.clone()) };
        out.push(Override { var: var.clone(), path, raw, list });
    }
    Ok(out)
}

/// Applies the `MAILCLUSTER_*` variables to `table`, one at a time, so that an
/// unknown key or a value of the wrong type is reported with the variable's name.
fn apply_env(
    table: &mut toml::Table,
    env: impl Iterator<Item = (String, String)>,
) -> Result<(), ConfigError> {
    // The defaults, as TOML, tell which type each known key has: environment values
    // are strings and must be converted before `Config` will accept them.
    let reference = toml::Table::try_from(Config::default()).unwrap_or_default();

    for ov in collect_overrides(env)? {
        let env_err = |message: String| ConfigError::Env { var: ov.var.clone(), message };
        let candidates = match &ov.raw {
            None => vec![None],
            Some(raw) => typed_candidates(raw, lookup(&reference, &ov.path), ov.list)
                .map_err(env_err)?
                .into_iter()
                .map(Some)
                .collect(),
        };
        let mut last_err = String::new();
        let mut applied = false;
        for candidate in candidates {
            let mut attempt = table.clone();
            set_path(&mut attempt, &ov.path, candidate).map_err(env_err)?;
            match from_table(attempt.clone()) {
                Ok(_) => {
                    *table = attempt;
                    applied = true;
                    break;
                }
                Err(e) => last_err = one_line(e.message()),
            }
        }
        if !applied {
            let message = if last_err.starts_with("unknown field") {
                format!("not a configuration setting ({last_err})")
            } else {
                format!("malformed value: {last_err}")
            };
            return Err(env_err(message));
        }
    }
    Ok(())
}

fn lookup<'a>(table: &'a toml::Table, path: &[String]) -> Option<&'a toml::Value> {
    let (first, rest) = path.split_first()?;
    let value = table.get(first)?;
    if rest.is_empty() { Some(value) } else { lookup(value.as_table()?, rest) }
}

/// Converts an environment string to the TOML values to try, best first. The
/// reference value (the default) decides the type; keys without one (optional
/// settings) are tried as a TOML literal and then as a plain string.
fn typed_candidates(
    raw: &str,
    reference: Option<&toml::Value>,
    list: bool,
) -> Result<Vec<toml::Value>, String> {
    use toml::Value;
    let trimmed = raw.trim();
    let scalar = |kind: Option<&Value>, s: &str| -> Result<Value, String> {
        match kind {
            Some(Value::Integer(_)) => {
                s.parse::<i64>().map(Value::Integer).map_err(|_| format!("expected an integer, got {s:?}"))
            }
            Some(Value::Float(_)) => {
                s.parse::<f64>().map(Value::Float).map_err(|_| format!("expected a number, got {s:?}"))
            }
            Some(Value::Boolean(_)) => match s.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => Ok(Value::Boolean(true)),
                "false" | "0" | "no" | "off" => Ok(Value::Boolean(false)),
                _ => Err(format!("expected true or false, got {s:?}")),
            },
            _ => Ok(Value::String(s.to_string())),
        }
    };
    match reference {
        Some(Value::Table(_)) => Err("names a section, not a setting; set its keys with SECTION__KEY".into()),
        Some(Value::Array(items)) if !trimmed.starts_with('[') || list => {
            let element = items.first();
            let values = trimmed
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| scalar(element, s))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(vec![Value::Array(values)])
        }
        Some(Value::String(_)) => Ok(vec![Value::String(raw.to_string())]),
        Some(kind @ (Value::Integer(_) | Value::Float(_) | Value::Boolean(_))) => {
            Ok(vec![scalar(Some(kind), trimmed)?])
        }
        _ if list => Ok(vec![Value::Array(
            trimmed
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.into()))
                .collect(),
        )]),
        _ => {
            let mut out = Vec::new();
            if let Ok(mut t) = format!("v = {trimmed}").parse::<toml::Table>()
                && let Some(v) = t.remove("v")
                && !v.is_str()
            {
                out.push(v);
            }
            out.push(Value::String(raw.to_string()));
            Ok(out)
        }
    }
}

fn set_path(table: &mut toml::Table, path: &[String], value: Option<toml::Value>) -> Result<(), String> {
    let Some((last, parents)) = path.split_last() else { return Err("empty key".into()) };
    let mut current = table;
    for (i, key) in parents.iter().enumerate() {
        let entry = current.entry(key.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = entry
            .as_table_mut()
            .ok_or_else(|| format!("{} is a setting, not a section", parents[..=i].join(".")))?;
    }
    match value {
        Some(v) => {
            current.insert(last.clone(), v);
        }
        None => {
            current.remove(last);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::Listener;
    use crate::config::Secret;

    fn env(vars: &[(&str, &str)]) -> impl Iterator<Item = (String, String)> {
        vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>().into_iter()
    }

    fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write test file");
        path
    }

    fn load_env(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::load(None, env(vars))
    }

    #[test]
    fn no_file_no_env_is_the_embedded_default() {
        let config = load_env(&[]).expect("defaults load");
        assert_eq!(config, Config::default());
        assert_eq!(config.enabled_listeners(), Listener::ALL.to_vec());
        assert_eq!(config.ports.get(Listener::Imaps), 10993);
        assert!(config.database.url.is_none() && config.redis.url.is_none());
    }

    #[test]
    fn file_values_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            &dir,
            "mc.toml",
            "hostname = \"mx.example.com\"\nprotocols = [\"smtp\", \"imap\"]\n\n[ports]\nsmtp = 2525\n\n[database]\nurl = \"postgres://u:pw@db/mail\"\npool_size = 7\n",
        );
        let config = Config::load(Some(&path), env(&[])).unwrap();
        assert_eq!(config.hostname, "mx.example.com");
        assert_eq!(config.enabled_listeners(), vec![Listener::Smtp, Listener::Imap]);
        assert_eq!(config.ports.smtp, 2525);
        assert_eq!(config.ports.imap, 10143);
        assert_eq!(config.database.pool_size, 7);
        assert_eq!(config.database.url.as_ref().map(Secret::expose), Some("postgres://u:pw@db/mail"));
    }

    #[test]
    fn unknown_file_key_names_key_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "mc.toml", "hostname = \"a\"\n\n[database]\npool_sise = 3\n");
        let err = Config::load(Some(&path), env(&[])).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ConfigError::File { line: 4, .. }), "{msg}");
        assert!(msg.contains("pool_sise") && msg.contains("mc.toml:4:"), "{msg}");
        assert!(!msg.contains('\n'), "one line: {msg}");
    }

    #[test]
    fn wrong_type_in_file_names_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "mc.toml", "[ports]\nsmtp = \"twenty-five\"\n");
        let err = Config::load(Some(&path), env(&[])).unwrap_err();
        assert!(matches!(err, ConfigError::File { line: 2, .. }), "{err}");
    }

    #[test]
    fn toml_syntax_error_names_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "mc.toml", "hostname = \"a\"\nports = [\n");
        let err = Config::load(Some(&path), env(&[])).unwrap_err();
        assert!(matches!(err, ConfigError::File { .. }), "{err}");
    }

    #[test]
    fn missing_file_is_a_read_error() {
        let err = Config::load(Some(Path::new("/nonexistent/mc.toml")), env(&[])).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }));
        assert!(err.to_string().contains("/nonexistent/mc.toml"));
    }

    #[test]
    fn yaml_file_is_accepted_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "mc.yaml", "hostname: mx.example.org\nports:\n  imap: 1143\n");
        let config = Config::load(Some(&path), env(&[])).unwrap();
        assert_eq!((config.hostname.as_str(), config.ports.imap), ("mx.example.org", 1143));
        let bad = write(&dir, "bad.yml", "hostname: a\nport: {imap: 1}\n");
        let err = Config::load(Some(&bad), env(&[])).unwrap_err();
        assert!(matches!(err, ConfigError::File { line: 2, .. }), "{err}");
        assert!(err.to_string().contains("port"), "{err}");
    }

    #[test]
    fn documented_variables_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "mc.toml", "hostname = \"from-file\"\n[ports]\nimap = 1\n");
        let config = Config::load(
            Some(&path),
            env(&[
                ("MAILCLUSTER_HOSTNAME", "from-env"),
                ("MAILCLUSTER_IMAP_PORT", "2143"),
                ("MAILCLUSTER_SMTP_PORT", "2525"),
                ("MAILCLUSTER_SUBMISSION_PORT", "2587"),
                ("MAILCLUSTER_SUBMISSIONS_PORT", "2465"),
                ("MAILCLUSTER_IMAPS_PORT", "2993"),
                ("MAILCLUSTER_POP3_PORT", "2110"),
                ("MAILCLUSTER_POP3S_PORT", "2995"),
                ("MAILCLUSTER_ADMIN_PORT", "2090"),
                ("MAILCLUSTER_DATABASE_URL", "postgres://u:secret@db:5432/mail"),
                ("MAILCLUSTER_REDIS_URL", "redis://:pw@cache:6379"),
                ("MAILCLUSTER_DATA_DIR", "/var/lib/mc"),
                ("MAILCLUSTER_TLS_CERT", "/tls/tls.crt"),
                ("MAILCLUSTER_TLS_KEY", "/tls/tls.key"),
                ("MAILCLUSTER_PROTOCOLS", " smtp, imaps ,"),
                ("MAILCLUSTER_LISTEN_ADDR", "127.0.0.1"),
                ("MAILCLUSTER_LOG_LEVEL", "debug"),
                ("MAILCLUSTER_LOG_FORMAT", "json"),
                ("UNRELATED", "ignored"),
            ]),
        )
        .unwrap();
        assert_eq!(config.hostname, "from-env");
        let ports = &config.ports;
        assert_eq!(
            [
                ports.smtp,
                ports.submission,
                ports.submissions,
                ports.imap,
                ports.imaps,
                ports.pop3,
                ports.pop3s
            ],
            [2525, 2587, 2465, 2143, 2993, 2110, 2995]
        );
        assert_eq!(ports.admin, 2090);
        assert_eq!(config.database.url.as_ref().unwrap().expose(), "postgres://u:secret@db:5432/mail");
        assert_eq!(config.redis.url.as_ref().unwrap().expose(), "redis://:pw@cache:6379");
        assert_eq!(config.data_dir, PathBuf::from("/var/lib/mc"));
        assert_eq!(config.tls.cert, Some(PathBuf::from("/tls/tls.crt")));
        assert_eq!(config.tls.key, Some(PathBuf::from("/tls/tls.key")));
        assert_eq!(config.protocols, vec![Listener::Smtp, Listener::Imaps]);
        assert_eq!(config.listen_addr, IpAddr::from([127, 0, 0, 1]));
        assert_eq!((config.log.level.as_str(), config.log.format.as_str()), ("debug", "json"));
        assert_eq!(
            config.listen_addrs(),
            vec![
                (Listener::Smtp, "127.0.0.1:2525".parse().unwrap()),
                (Listener::Imaps, "127.0.0.1:2993".parse().unwrap())
            ]
        );
    }

    #[test]
    fn generic_double_underscore_rule() {
        let config = load_env(&[
            ("MAILCLUSTER_DATABASE__POOL_SIZE", "42"),
            ("MAILCLUSTER_DATABASE__MIGRATE_ON_START", "false"),
            ("MAILCLUSTER_NET__PROXY_PROTOCOL__ENABLED", "true"),
            ("MAILCLUSTER_NET__PROXY_PROTOCOL__TRUSTED_CIDRS", "10.0.0.0/8, 192.168.0.0/16"),
            ("MAILCLUSTER_TLS__ALLOW_PLAINTEXT_AUTH", "yes"),
            ("MAILCLUSTER_REDIS__KEY_PREFIX", "prod:"),
            ("MAILCLUSTER_SHUTDOWN_GRACE_SECS", "5"),
        ])
        .unwrap();
        assert_eq!(config.database.pool_size, 42);
        assert!(!config.database.migrate_on_start);
        assert!(config.net.proxy_protocol.enabled);
        assert_eq!(config.net.proxy_protocol.trusted_cidrs.len(), 2);
        assert!(config.tls.allow_plaintext_auth);
        assert_eq!(config.redis.key_prefix, "prod:");
        assert_eq!(config.shutdown_grace_secs, 5);
    }

    #[test]
    fn worker_threads_default_to_every_cpu_and_refuse_a_millicore_value() {
        assert_eq!(load_env(&[]).unwrap().worker_threads, 0);
        assert_eq!(load_env(&[("MAILCLUSTER_WORKER_THREADS", "3")]).unwrap().worker_threads, 3);
        // What a CPU request of "1500m" would read as without the divisor.
        let err = load_env(&[("MAILCLUSTER_WORKER_THREADS", "1500")]).unwrap_err();
        assert!(err.to_string().contains("worker_threads must be at most 1024"), "{err}");
        assert!(load_env(&[("MAILCLUSTER_WORKER_THREADS", "-1")]).is_err());
    }

    #[test]
    fn unknown_variable_is_named() {
        for var in ["MAILCLUSTER_DATABSE_URL", "MAILCLUSTER_DATABASE__POOLSIZE", "MAILCLUSTER_NOPE__X__Y"] {
            let err = load_env(&[(var, "1")]).unwrap_err();
            assert!(matches!(&err, ConfigError::Env { var: v, .. } if v == var), "{var}: {err}");
            assert!(err.to_string().contains(var), "{err}");
        }
        let err = load_env(&[("MAILCLUSTER_DATABASE____X", "1")]).unwrap_err();
        assert!(err.to_string().contains("MAILCLUSTER_DATABASE____X"), "{err}");
    }

    #[test]
    fn malformed_value_is_named() {
        for (var, value) in [
            ("MAILCLUSTER_IMAP_PORT", "abc"),
            ("MAILCLUSTER_IMAP_PORT", "70000"),
            ("MAILCLUSTER_LISTEN_ADDR", "not-an-ip"),
            ("MAILCLUSTER_DATABASE__MIGRATE_ON_START", "maybe"),
            ("MAILCLUSTER_NET__PROXY_PROTOCOL__TRUSTED_CIDRS", "10.0.0.0/99"),
            ("MAILCLUSTER_DATABASE", "x"),
        ] {
            let err = load_env(&[(var, value)]).unwrap_err();
            assert!(matches!(&err, ConfigError::Env { var: v, .. } if v == var), "{var}={value}: {err}");
            assert!(err.to_string().contains(var), "{err}");
        }
    }

    #[test]
    fn empty_variable_means_unset() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(&dir, "mc.toml", "[database]\nurl = \"postgres://db/x\"\n");
        let config = Config::load(Some(&path), env(&[("MAILCLUSTER_DATABASE_URL", "")])).unwrap();
        assert!(config.database.url.is_none());
    }

    #[test]
    fn secrets_from_files() {
        let dir = tempfile::tempdir().unwrap();
        let db = write(&dir, "db", "postgres://u:pw@db/mail\n");
        let redis = write(&dir, "redis", "redis://cache:6379");
        let config = load_env(&[
            ("MAILCLUSTER_DATABASE_URL_FILE", db.to_str().unwrap()),
            ("MAILCLUSTER_REDIS_URL_FILE", redis.to_str().unwrap()),
        ])
        .unwrap();
        assert_eq!(config.database.url.unwrap().expose(), "postgres://u:pw@db/mail");
        assert_eq!(config.redis.url.unwrap().expose(), "redis://cache:6379");

        let err = load_env(&[("MAILCLUSTER_DATABASE_URL_FILE", "/nonexistent/secret")]).unwrap_err();
        assert!(err.to_string().contains("MAILCLUSTER_DATABASE_URL_FILE"), "{err}");

        let err = load_env(&[
            ("MAILCLUSTER_DATABASE_URL_FILE", db.to_str().unwrap()),
            ("MAILCLUSTER_DATABASE_URL", "postgres://other/x"),
        ])
        .unwrap_err();
        assert!(matches!(err, ConfigError::Env { .. }), "{err}");
    }

    #[test]
    fn kubernetes_service_links_are_ignored() {
        let config = load_env(&[
            ("MAILCLUSTER_SMTP_PORT", "tcp://10.0.0.7:25"),
            ("MAILCLUSTER_SMTP_SERVICE_HOST", "10.0.0.7"),
            ("MAILCLUSTER_SMTP_SERVICE_PORT", "25"),
            ("MAILCLUSTER_SMTP_SERVICE_PORT_SMTP", "25"),
            ("MAILCLUSTER_SMTP_PORT_25_TCP", "tcp://10.0.0.7:25"),
            ("MAILCLUSTER_SMTP_PORT_25_TCP_ADDR", "10.0.0.7"),
            ("MAILCLUSTER_CONFIG", "/etc/mc.toml"),
        ])
        .unwrap();
        assert_eq!(config.ports.smtp, 10025);
    }

    #[test]
    fn validate_rejects_port_clash_among_enabled_listeners() {
        let err = load_env(&[("MAILCLUSTER_IMAP_PORT", "10025")]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("10025") && msg.contains("smtp") && msg.contains("imap"), "{msg}");
        // A clash with a disabled listener does not matter.
        load_env(&[("MAILCLUSTER_IMAP_PORT", "10025"), ("MAILCLUSTER_PROTOCOLS", "imap")]).unwrap();
        // Port 0 asks the kernel for a free port and may repeat.
        load_env(&[("MAILCLUSTER_IMAP_PORT", "0"), ("MAILCLUSTER_SMTP_PORT", "0")]).unwrap();
        let err = load_env(&[("MAILCLUSTER_ADMIN_PORT", "10143")]).unwrap_err();
        assert!(err.to_string().contains("admin"), "{err}");
    }

    #[test]
    fn validate_checks_names_tls_pools_and_urls() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("MAILCLUSTER_PROTOCOLS", "smtp,smtp")], "twice"),
            (&[("MAILCLUSTER_TLS_CERT", "/c.pem")], "tls.key"),
            (&[("MAILCLUSTER_TLS_KEY", "/k.pem")], "tls.cert"),
            (&[("MAILCLUSTER_DATABASE__POOL_SIZE", "0")], "database.pool_size"),
            (&[("MAILCLUSTER_REDIS__POOL_SIZE", "0")], "redis.pool_size"),
            (&[("MAILCLUSTER_NET__MAX_CONNECTIONS", "0")], "net.max_connections"),
            (&[("MAILCLUSTER_DATABASE_URL", "mysql://u:hunter2@x/y")], "database.url"),
            (&[("MAILCLUSTER_LOG_FORMAT", "xml")], "log.format"),
            (&[("MAILCLUSTER_HOSTNAME", " ")], "hostname"),
            (&[("MAILCLUSTER_NET__PROXY_PROTOCOL__ENABLED", "true")], "trusted_cidrs"),
            (
                &[("MAILCLUSTER_SMTP__GROUP_COMMIT_SECRET", "hunter2")],
                "group_commit_secret must be at least 16",
            ),
        ];
        for (vars, needle) in cases {
            let err = load_env(vars).unwrap_err();
            assert!(matches!(err, ConfigError::Invalid(_)), "{vars:?}: {err}");
            let msg = err.to_string();
            assert!(msg.contains(needle), "{vars:?}: {msg}");
            assert!(!msg.contains("hunter2"), "secret leaked: {msg}");
        }
        // A listener this server does not have is named with its variable.
        let err = load_env(&[("MAILCLUSTER_PROTOCOLS", "smtp,imap4")]).unwrap_err();
        assert!(matches!(&err, ConfigError::Env { var, .. } if var == "MAILCLUSTER_PROTOCOLS"), "{err}");
        assert!(err.to_string().contains("imap4"), "{err}");
        // Both problems at once are both reported.
        let err =
            load_env(&[("MAILCLUSTER_PROTOCOLS", "smtp,smtp"), ("MAILCLUSTER_DATABASE__POOL_SIZE", "0")])
                .unwrap_err();
        assert!(err.to_string().contains("twice") && err.to_string().contains("pool_size"), "{err}");
        // Valid URLs pass.
        load_env(&[
            ("MAILCLUSTER_DATABASE_URL", "sqlite:///tmp/x.db"),
            ("MAILCLUSTER_REDIS_URL", "rediss://h:6380/0"),
            ("MAILCLUSTER_TLS_CERT", "/c.pem"),
            ("MAILCLUSTER_TLS_KEY", "/k.pem"),
        ])
        .unwrap();
    }

    #[test]
    fn print_config_redacts_secrets_and_round_trips() {
        let config = load_env(&[
            ("MAILCLUSTER_DATABASE_URL", "postgres://mail:hunter2@db:5432/mail"),
            ("MAILCLUSTER_REDIS_URL", "redis://:s3cret@cache:6379"),
            ("MAILCLUSTER_SMTP__GROUP_COMMIT_SECRET", "group-commit-key-0123456789"),
        ])
        .unwrap();
        let text = config.to_redacted_toml();
        assert!(!text.contains("hunter2") && !text.contains("s3cret"), "{text}");
        assert!(!text.contains("group-commit-key") && !format!("{config:?}").contains("group-commit-key"));
        assert!(text.contains("<redacted>"), "{text}");
        // The printed file is itself a valid configuration (with the secrets blanked).
        let reparsed: Config = toml::from_str(&text).expect("printed config parses");
        assert_eq!(reparsed.ports, config.ports);
        assert_eq!(reparsed.hostname, config.hostname);
    }

    #[test]
    fn line_col_counts_from_one() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
    }
}
