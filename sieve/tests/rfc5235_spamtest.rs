//! RFC 5235: spamtest, spamtestplus (`:percent`) and virustest, from the
//! values the caller's scanner put in the context.

mod common;

use common::*;
use mailcluster_sieve::Context;

fn holds_with(ctx: &Context, test: &str) -> bool {
    let s = format!(
        "require [\"spamtest\", \"spamtestplus\", \"virustest\", \"relational\", \"comparator-i;ascii-numeric\", \"fileinto\"];\n\
         if {test} {{ fileinto \"yes\"; }}"
    );
    run_with(&s, &simple_message(), ctx, &mut TestHost::default()).unwrap().actions == vec![fileinto("yes")]
}

#[test]
fn section_3_1_spamtest_example_files_likely_spam() {
    let mut ctx = context(FROM, TO, &[]);
    let test = "spamtest :value \"ge\" :comparator \"i;ascii-numeric\" \"6\"";
    ctx.spam = Some(8);
    assert!(holds_with(&ctx, test));
    ctx.spam = Some(3);
    assert!(!holds_with(&ctx, test));
    // Not tested reads as "0".
    ctx.spam = None;
    assert!(holds_with(&ctx, "spamtest :is \"0\""));
}

#[test]
fn section_3_2_percent() {
    let mut ctx = context(FROM, TO, &[]);
    ctx.spam_percent = Some(75);
    assert!(holds_with(&ctx, "spamtest :percent :value \"gt\" :comparator \"i;ascii-numeric\" \"50\""));
    assert!(!holds_with(&ctx, "spamtest :percent :value \"gt\" :comparator \"i;ascii-numeric\" \"80\""));
    compile_error("require \"spamtest\"; if spamtest :percent \"1\" { keep; }");
}

#[test]
fn section_3_3_virustest() {
    let mut ctx = context(FROM, TO, &[]);
    ctx.virus = Some(5);
    assert!(holds_with(&ctx, "virustest :value \"ge\" :comparator \"i;ascii-numeric\" \"4\""));
    ctx.virus = Some(1);
    assert!(!holds_with(&ctx, "virustest :value \"ge\" :comparator \"i;ascii-numeric\" \"4\""));
    compile_error("if virustest \"1\" { keep; }");
}
