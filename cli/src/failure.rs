//! How a command fails: the exit code and one line for the operator.
//!
//! 0 ok, 1 runtime error (a service unreachable, a store refusal), 2 usage or
//! configuration error (the same command will fail again until the input changes).

use std::process::ExitCode;

#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub error: anyhow::Error,
}

impl Failure {
    pub fn usage(error: impl Into<anyhow::Error>) -> Self {
        Failure { code: 2, error: error.into() }
    }

    /// A runtime failure (exit 1): the thing asked for is not there.
    pub fn runtime(error: impl Into<anyhow::Error>) -> Self {
        Failure { code: 1, error: error.into() }
    }

    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.code)
    }

    /// The whole cause chain on one line (`context: cause: cause`), never a
    /// backtrace: this is the last line a pod logs before it restarts.
    pub fn message(&self) -> String {
        format!("{:#}", self.error).replace('\n', " ")
    }
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(error: E) -> Self {
        let error = error.into();
        // A configuration problem found deep inside a runtime step is still the
        // operator's input to fix.
        let code =
            if error.chain().any(|c| c.is::<mailcluster_server::config::ConfigError>()) { 2 } else { 1 };
        Failure { code, error }
    }
}
