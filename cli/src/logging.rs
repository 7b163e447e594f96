//! Log output: `tracing` events to stderr, JSON for machines and text for people.
//!
//! Logs go to stderr, not stdout, so that commands whose output is data
//! (`user list`, `serve --print-config`) can be piped; in a container both streams
//! end up in the same log. `log.format = "auto"` therefore looks at stderr: JSON
//! when it is not a terminal (a pod, a file, a pipe), human text when a person is
//! watching.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Which filter wins: `--log-level`, then `RUST_LOG`, then `log.level` from the
/// configuration (file or `MAILCLUSTER_LOG_LEVEL`).
pub fn filter(flag: Option<&str>, rust_log: Option<&str>, configured: &str) -> anyhow::Result<EnvFilter> {
    let (source, directive) = match (flag, rust_log.filter(|s| !s.trim().is_empty())) {
        (Some(flag), _) => ("--log-level", flag),
        (None, Some(env)) => ("RUST_LOG", env),
        (None, None) => ("log.level", configured),
    };
    EnvFilter::builder()
        .parse(directive)
        .map_err(|e| anyhow::anyhow!("{source} {directive:?} is not a valid log filter: {e}"))
}

/// Whether `format` (`auto`, `json`, `text`) means JSON given where logs go.
pub fn use_json(format: &str, stderr_is_terminal: bool) -> bool {
    match format {
        "json" => true,
        "text" => false,
        _ => !stderr_is_terminal,
    }
}

/// Installs the global subscriber. Calling it twice is harmless (the first wins),
/// which keeps tests that run several commands in one process simple.
pub fn init(filter: EnvFilter, format: &str) {
    let json = use_json(format, std::io::stderr().is_terminal());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = if json {
        builder.json().flatten_event(true).with_current_span(false).try_init()
    } else {
        builder.try_init()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_flag_then_rust_log_then_config() {
        assert_eq!(filter(Some("debug"), Some("warn"), "info").unwrap().to_string(), "debug");
        assert_eq!(filter(None, Some("warn"), "info").unwrap().to_string(), "warn");
        assert_eq!(filter(None, Some(" "), "info").unwrap().to_string(), "info");
        assert_eq!(filter(None, None, "error").unwrap().to_string(), "error");
    }

    #[test]
    fn bad_filter_names_its_source() {
        let err = filter(Some("=[x"), None, "info").unwrap_err().to_string();
        assert!(err.contains("--log-level"), "{err}");
        let err = filter(None, Some("=[x"), "info").unwrap_err().to_string();
        assert!(err.contains("RUST_LOG"), "{err}");
    }

    #[test]
    fn auto_format_follows_the_terminal() {
        assert!(use_json("auto", false));
        assert!(!use_json("auto", true));
        assert!(use_json("json", true));
        assert!(!use_json("text", false));
    }
}
