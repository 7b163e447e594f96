//! SIGTERM starts the drain. In its own test binary: once the handler is installed,
//! SIGTERM no longer terminates this process, which other tests should not inherit.

use std::time::Duration;

use mailcluster_server::net::ShutdownController;

#[tokio::test]
async fn sigterm_triggers_the_drain() {
    let shutdown = ShutdownController::new(Duration::from_secs(1));
    let handler = shutdown.spawn_signal_handler().expect("install handlers");
    assert!(!shutdown.is_draining());
    let status = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    tokio::time::timeout(Duration::from_secs(10), shutdown.triggered()).await.expect("drain triggered");
    assert!(shutdown.is_draining());
    tokio::time::timeout(Duration::from_secs(10), handler).await.expect("handler ends").expect("task");
}
