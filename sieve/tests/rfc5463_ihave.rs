//! RFC 5463, ihave: testing for extensions, blocks that use what is not
//! there, and the `error` command.

mod common;

use common::*;
use mailcluster_sieve::RuntimeError;

#[test]
fn section_4_ihave_is_true_only_when_every_extension_is_there() {
    let m = simple_message();
    assert!(holds(", \"ihave\"", "ihave \"fileinto\"", &m));
    assert!(holds(", \"ihave\"", "ihave [\"body\", \"date\"]", &m));
    assert!(!holds(", \"ihave\"", "ihave [\"body\", \"x-teleport\"]", &m));
    assert!(holds(", \"ihave\"", "not ihave \"x-teleport\"", &m));
    compile_error("if ihave \"fileinto\" { keep; }");
}

#[test]
fn section_4_a_block_for_a_missing_extension_compiles_and_is_skipped() {
    let s = r#"require ["ihave", "fileinto"];
        if ihave "x-teleport" { teleport :now "mars"; } elsif true { fileinto "here"; }"#;
    assert_eq!(actions(s, &simple_message()), vec![fileinto("here")]);
}

#[test]
fn section_4_a_block_for_a_present_extension_may_use_it_without_require() {
    let s = r#"require ["ihave"];
        if ihave ["fileinto", "variables"] { set "b" "box"; fileinto "${b}"; }"#;
    assert_eq!(actions(s, &simple_message()), vec![fileinto("box")]);
    // Only within that block.
    compile_error(r#"require "ihave"; if ihave "fileinto" { keep; } fileinto "x";"#);
    // And the block is still checked.
    compile_error(r#"require "ihave"; if ihave "fileinto" { fileinto; }"#);
}

#[test]
fn section_5_error_ends_the_run() {
    let s = r#"require ["ihave", "fileinto"]; fileinto "a"; error "no way";"#;
    assert_eq!(try_run(s, &simple_message()), Err(RuntimeError::Script("no way".into())));
    compile_error("error \"x\";");
}
