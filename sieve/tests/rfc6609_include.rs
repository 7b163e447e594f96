//! RFC 6609, include: personal and global scripts through the host, `:once`,
//! `:optional`, `return`, and global variables.

mod common;

use common::*;
use mailcluster_sieve::{Include, RuntimeError};

#[test]
fn section_3_2_include_runs_the_other_script_and_its_actions_count() {
    let mut host = TestHost::default()
        .with_script(
            "spam",
            true,
            "require \"fileinto\"; if header :contains \"subject\" \"present\" { fileinto \"Junk\"; stop; }",
        )
        .with_script("lists", false, "require \"fileinto\"; fileinto \"Lists\";");
    let s = r#"require ["include", "fileinto"];
        include :global "spam";
        include :personal "lists";
        fileinto "after";"#;
    let ctx = context(FROM, TO, &[]);
    assert_eq!(run_with(s, &simple_message(), &ctx, &mut host).unwrap().actions, vec![fileinto("Junk")]);
    let other = message(&["Subject: hello"], "");
    assert_eq!(
        run_with(s, &other, &ctx, &mut host).unwrap().actions,
        vec![fileinto("Lists"), fileinto("after")]
    );
}

#[test]
fn section_3_2_once_optional_and_missing_scripts() {
    let mut host = TestHost::default().with_script("x", false, "require \"fileinto\"; fileinto \"x\";");
    let ctx = context(FROM, TO, &[]);
    let s = "require \"include\"; include :once \"x\"; include :once \"x\"; include :optional \"absent\";";
    assert_eq!(run_with(s, &simple_message(), &ctx, &mut host).unwrap().actions, vec![fileinto("x")]);
    assert_eq!(host.include_calls, 2);
    let r = run_with("require \"include\"; include \"absent\";", &simple_message(), &ctx, &mut host);
    assert!(matches!(r, Err(RuntimeError::Include(_))), "{r:?}");
    // A personal script is not the global one of the same name.
    let r = run_with("require \"include\"; include :global \"x\";", &simple_message(), &ctx, &mut host);
    assert!(matches!(r, Err(RuntimeError::Include(_))), "{r:?}");
}

#[test]
fn section_3_3_return_ends_only_the_included_script() {
    let mut host = TestHost::default().with_script(
        "r",
        false,
        "require [\"include\", \"fileinto\"]; fileinto \"a\"; return; fileinto \"b\";",
    );
    let s = "require [\"include\", \"fileinto\"]; include \"r\"; fileinto \"c\";";
    let out = run_with(s, &simple_message(), &context(FROM, TO, &[]), &mut host).unwrap();
    assert_eq!(out.actions, vec![fileinto("a"), fileinto("c")]);
    let s = "require [\"include\", \"fileinto\"]; fileinto \"a\"; return; fileinto \"b\";";
    assert_eq!(actions(s, &simple_message()), vec![fileinto("a")]);
}

#[test]
fn section_3_5_global_variables_are_shared_and_others_are_not() {
    let mut host = TestHost::default().with_script(
        "setter",
        false,
        "require [\"include\", \"variables\"]; global \"shared\"; set \"shared\" \"from setter\"; set \"private\" \"hidden\";",
    );
    let s = r#"require ["include", "variables", "reject"];
        global "shared";
        set "private" "mine";
        include "setter";
        reject "${shared}|${private}|${global.shared}";"#;
    let out = run_with(s, &simple_message(), &context(FROM, TO, &[]), &mut host).unwrap();
    assert_eq!(
        out.actions,
        vec![mailcluster_sieve::Action::Reject {
            reason: "from setter|mine|from setter".into(),
            extended: false
        }]
    );
}

#[test]
fn includes_lists_what_the_script_includes() {
    let s = compile(
        "require \"include\"; include :global :once \"a\"; if true { include :optional \"b\"; } include :global :once \"a\";",
    );
    assert_eq!(
        s.includes(),
        vec![
            Include { name: "a".into(), global: true, optional: false, once: true },
            Include { name: "b".into(), global: false, optional: true, once: false },
        ]
    );
    compile_error("require \"include\"; include \"../x\";");
    compile_error("require \"include\"; include :global :personal \"x\";");
    compile_error("include \"x\";");
}
