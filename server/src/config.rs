//! The server's configuration. Its types, defaults, file and environment rules are
//! `mailcluster_api::config`, shared with the operator that writes the pods' files;
//! here are the checks only a server can make, with its own parsers.

use std::path::Path;

pub use mailcluster_api::config::*;

/// Loads the effective configuration ([`Config::parse`]: defaults, the file at
/// `path`, then every `MAILCLUSTER_*` variable in `env`) and validates it, reporting
/// every problem at once.
///
/// `env` is passed in (normally `std::env::vars()`) so tests need not mutate the
/// process environment.
pub fn load(path: Option<&Path>, env: impl Iterator<Item = (String, String)>) -> Result<Config, ConfigError> {
    let config = Config::parse(path, env)?;
    let mut problems = config.problems();
    problems.extend(server_problems(&config));
    if problems.is_empty() { Ok(config) } else { Err(ConfigError::Invalid(problems.join("; "))) }
}

/// What [`Config::problems`] cannot see: values only the server's parsers judge.
fn server_problems(config: &Config) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(url) = &config.redis.url {
        let url = url.expose();
        if let Err(e) = crate::cache::target::RedisTarget::parse(url) {
            problems.push(format!("redis.url: {e} (got {})", redact_url(url)));
        }
    }
    if let Err(e) = tracing_subscriber::EnvFilter::builder().parse(&config.log.level) {
        problems.push(format!("log.level {:?} is not a valid filter: {e}", config.log.level));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_env(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        load(None, vars.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn redis_urls_and_log_filters_are_checked_with_the_other_problems() {
        for (vars, needle) in [
            (&[("MAILCLUSTER_REDIS_URL", "memcached://x")][..], "redis.url"),
            (&[("MAILCLUSTER_LOG_LEVEL", "debug,=[")], "log.level"),
        ] {
            let err = load_env(vars).unwrap_err().to_string();
            assert!(err.contains(needle), "{vars:?}: {err}");
        }
        let err =
            load_env(&[("MAILCLUSTER_REDIS_URL", "memcached://x"), ("MAILCLUSTER_DATABASE__POOL_SIZE", "0")])
                .unwrap_err()
                .to_string();
        assert!(err.contains("redis.url") && err.contains("database.pool_size"), "{err}");
        let ok = load_env(&[
            ("MAILCLUSTER_REDIS_URL", "redis+sentinel://s1:26379,s2:26379/mymaster"),
            ("MAILCLUSTER_LOG_LEVEL", "info,mailcluster_server=debug"),
        ]);
        assert!(ok.is_ok(), "{ok:?}");
    }
}
