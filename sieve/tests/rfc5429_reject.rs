//! RFC 5429, reject and ereject: the message is refused, and nothing may
//! deliver or answer it as well.

mod common;

use common::*;
use mailcluster_sieve::{Action, RuntimeError};

#[test]
fn section_2_reject_and_ereject_cancel_the_implicit_keep() {
    assert_eq!(
        actions("require \"reject\"; reject \"no thanks\";", &simple_message()),
        vec![Action::Reject { reason: "no thanks".into(), extended: false }]
    );
    assert_eq!(
        actions("require \"ereject\"; ereject \"no thanks\";", &simple_message()),
        vec![Action::Reject { reason: "no thanks".into(), extended: true }]
    );
    // Discard adds nothing to a refusal.
    let out = actions("require \"reject\"; reject \"x\"; discard;", &simple_message());
    assert!(out.iter().all(|a| matches!(a, Action::Reject { .. } | Action::Discard)), "{out:?}");
}

#[test]
fn section_2_1_reject_with_keep_fileinto_redirect_or_vacation_is_an_error() {
    for other in [
        "keep;",
        "fileinto \"x\";",
        "redirect \"a@example.com\";",
        "vacation \"away\";",
        "fileinto :copy \"x\";",
    ] {
        let s = format!(
            "require [\"reject\", \"ereject\", \"fileinto\", \"vacation\", \"copy\"]; {other} reject \"no\";"
        );
        assert!(matches!(try_run(&s, &simple_message()), Err(RuntimeError::Conflict(_))), "{other}");
        let s = format!(
            "require [\"reject\", \"ereject\", \"fileinto\", \"vacation\", \"copy\"]; ereject \"no\"; {other}"
        );
        assert!(matches!(try_run(&s, &simple_message()), Err(RuntimeError::Conflict(_))), "{other}");
    }
}

#[test]
fn reject_needs_its_require() {
    compile_error("ereject \"x\";");
    compile_error("require \"ereject\"; reject \"x\";");
}
