//! Scripts and messages written to hurt: every limit in `Limits` is reached
//! and holds, deep nesting ends in an error rather than a deep stack, and
//! `:matches` does not blow up. Time bounds are generous (slow CI machines);
//! they catch exponential or quadratic work, not small regressions.

mod common;

use std::time::{Duration, Instant};

use common::*;
use mailcluster_sieve::{Action, Limits, RuntimeError, Script, run};

const SLOW: Duration = Duration::from_secs(20);

fn limits() -> Limits {
    Limits::default()
}

#[test]
fn defaults_are_the_documented_ones() {
    let l = limits();
    assert_eq!(
        (l.max_script_bytes, l.max_nesting, l.max_instructions, l.max_actions, l.max_redirects),
        (64 * 1024, 32, 200_000, 32, 4)
    );
    assert_eq!(
        (l.max_variable_bytes, l.max_variables, l.max_include_depth, l.max_header_edits),
        (4096, 128, 4, 32)
    );
}

#[test]
fn script_larger_than_max_script_bytes_is_refused() {
    let fits = format!("#{}\nkeep;", "x".repeat(64 * 1024 - 8));
    assert!(fits.len() <= 64 * 1024);
    Script::compile(fits.as_bytes(), &limits()).unwrap();
    let over = format!("#{}\nkeep;", "x".repeat(64 * 1024));
    let e = Script::compile(over.as_bytes(), &limits()).unwrap_err();
    assert!(e.message.contains("larger"), "{e}");
}

#[test]
fn hundred_thousand_nested_ifs_fail_fast_without_overflowing_the_stack() {
    let deep = format!("{}keep;{}", "if true {".repeat(100_000), "}".repeat(100_000));
    let big = Limits { max_script_bytes: usize::MAX, ..limits() };
    let started = Instant::now();
    let e = Script::compile(deep.as_bytes(), &big).unwrap_err();
    assert!(e.message.contains("nested"), "{e}");
    assert!(started.elapsed() < SLOW);
}

#[test]
fn hundred_thousand_nots_fail_fast_without_overflowing_the_stack() {
    let deep = format!("if {}true {{ keep; }}", "not ".repeat(100_000));
    let big = Limits { max_script_bytes: usize::MAX, ..limits() };
    let started = Instant::now();
    let e = Script::compile(deep.as_bytes(), &big).unwrap_err();
    assert!(e.message.contains("nested"), "{e}");
    assert!(started.elapsed() < SLOW);
    let deep = format!("if {}true{} {{ keep; }}", "anyof(".repeat(100_000), ")".repeat(100_000));
    assert!(Script::compile(deep.as_bytes(), &big).unwrap_err().message.contains("nested"));
}

#[test]
fn nesting_up_to_max_nesting_compiles_and_runs_one_more_does_not() {
    let nested = |n: usize| format!("{}discard;{}", "if true {".repeat(n), "}".repeat(n));
    let ok = Script::compile(nested(32).as_bytes(), &limits()).unwrap();
    let out =
        run(&ok, &simple_message(), &context(FROM, TO, &[]), &mut TestHost::default(), &limits()).unwrap();
    assert_eq!(out.actions, vec![Action::Discard]);
    let e = Script::compile(nested(33).as_bytes(), &limits()).unwrap_err();
    assert!(e.message.contains("nested more than 32"), "{e}");
    // Tests count with blocks: 31 nots inside one if reach the limit.
    let nots = |n: usize| format!("if {}true {{ keep; }}", "not not ".repeat(n / 2));
    Script::compile(nots(30).as_bytes(), &limits()).unwrap();
    Script::compile(nots(34).as_bytes(), &limits()).unwrap_err();
}

#[test]
fn matches_with_many_stars_against_64_kib_is_linear() {
    let subject = "a".repeat(64 * 1024);
    let m = message(&[&format!("Subject: {subject}")], "");
    let started = Instant::now();
    for pattern in ["*a*a*a*a*a*b", "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b*", "a*?*?*?*?*?*?*?*?*c"] {
        let test = format!("header :matches \"subject\" \"{pattern}\"");
        assert!(!holds("", &test, &m), "{pattern}");
    }
    assert!(holds("", "header :matches \"subject\" \"*a*a*a*a*a*a\"", &m));
    assert!(started.elapsed() < SLOW, "{:?}", started.elapsed());
}

#[test]
fn long_failing_segments_run_out_of_instructions_instead_of_time() {
    // Each start position compares thousands of bytes before failing: the
    // comparisons are charged, so the run ends at max_instructions.
    let subject = "a".repeat(60 * 1024);
    let m = message(&[&format!("Subject: {subject}")], "");
    let pattern = format!("*{}b*", "a".repeat(8000));
    let source = format!("if header :matches \"subject\" \"{pattern}\" {{ discard; }}");
    let started = Instant::now();
    assert_eq!(try_run(&source, &m), Err(RuntimeError::TooManyInstructions));
    assert!(started.elapsed() < SLOW, "{:?}", started.elapsed());
}

#[test]
fn max_instructions_stops_a_long_run() {
    let source = "keep;\n".repeat(150);
    let small = Limits { max_instructions: 100, ..limits() };
    let script = Script::compile(source.as_bytes(), &small).unwrap();
    let r = run(&script, &simple_message(), &context(FROM, TO, &[]), &mut TestHost::default(), &small);
    assert_eq!(r, Err(RuntimeError::TooManyInstructions));
    let script = Script::compile("keep;\n".repeat(40).as_bytes(), &small).unwrap();
    run(&script, &simple_message(), &context(FROM, TO, &[]), &mut TestHost::default(), &small).unwrap();
}

#[test]
fn body_searches_over_a_large_body_are_charged_by_size() {
    let body = "x".repeat(1024 * 1024);
    let m = message(&["Subject: big"], &body);
    let source = format!("require \"body\";\n{}", "if body :raw :is \"needle\" { discard; }\n".repeat(300));
    let started = Instant::now();
    assert_eq!(try_run(&source, &m), Err(RuntimeError::TooManyInstructions));
    assert!(started.elapsed() < SLOW * 3, "{:?}", started.elapsed());
}

#[test]
fn max_actions_and_max_redirects() {
    let files = |n: usize| {
        let mut s = String::from("require \"fileinto\";\n");
        for i in 0..n {
            s.push_str(&format!("fileinto \"box{i}\";\n"));
        }
        s
    };
    assert_eq!(actions(&files(32), &simple_message()).len(), 32);
    assert_eq!(try_run(&files(33), &simple_message()), Err(RuntimeError::TooManyActions));
    let redirects =
        |n: usize| (0..n).map(|i| format!("redirect \"r{i}@example.com\";\n")).collect::<String>();
    assert_eq!(actions(&redirects(4), &simple_message()).len(), 4);
    assert_eq!(try_run(&redirects(5), &simple_message()), Err(RuntimeError::TooManyRedirects));
    // The same redirect again is not another one.
    assert_eq!(actions(&"redirect \"a@example.com\";\n".repeat(10), &simple_message()).len(), 1);
}

#[test]
fn doubling_a_variable_stops_at_max_variable_bytes() {
    let source = format!(
        "require [\"variables\", \"reject\"];\nset \"a\" \"xy\";\n{}reject \"${{a}}\";",
        "set \"a\" \"${a}${a}\";\n".repeat(40)
    );
    let started = Instant::now();
    let out = actions(&source, &simple_message());
    let [Action::Reject { reason, .. }] = out.as_slice() else { panic!("{out:?}") };
    assert_eq!(reason.len(), 4096);
    assert!(started.elapsed() < SLOW);
}

#[test]
fn one_string_of_many_references_is_capped() {
    let source = format!(
        "require [\"variables\", \"reject\"];\nset \"a\" \"{}\";\nreject \"{}\";",
        "z".repeat(4096),
        "${a}".repeat(5000)
    );
    let out = actions(&source, &simple_message());
    let [Action::Reject { reason, .. }] = out.as_slice() else { panic!("{out:?}") };
    assert_eq!(reason.len(), 64 * 1024);
}

#[test]
fn max_variables_is_a_compile_error() {
    let vars = |n: usize| {
        let mut s = String::from("require \"variables\";\n");
        for i in 0..n {
            s.push_str(&format!("set \"v{i}\" \"x\";\n"));
        }
        s
    };
    compile(&vars(128));
    let e = compile_error(&vars(129));
    assert!(e.message.contains("128 variables"), "{e}");
    assert_eq!(e.line, 130);
}

#[test]
fn include_depth_and_loops_are_runtime_errors() {
    let mut host = TestHost::default();
    for (name, next) in [("a", "b"), ("b", "c"), ("c", "d"), ("d", "e"), ("e", "f")] {
        host = host.with_script(name, false, &format!("require \"include\"; include \"{next}\";"));
    }
    host = host.with_script("f", false, "discard;");
    let ctx = context(FROM, TO, &[]);
    let top = "require \"include\"; include \"a\";";
    let r = run_with(top, &simple_message(), &ctx, &mut host);
    assert!(matches!(r, Err(RuntimeError::Include(ref m)) if m.contains("deep")), "{r:?}");
    let r = run_with("require \"include\"; include \"c\";", &simple_message(), &ctx, &mut host).unwrap();
    assert_eq!(r.actions, vec![Action::Discard]);

    let mut host = TestHost::default()
        .with_script("ping", false, "require \"include\"; include \"pong\";")
        .with_script("pong", false, "require \"include\"; include \"ping\";");
    let r = run_with("require \"include\"; include \"ping\";", &simple_message(), &ctx, &mut host);
    assert!(matches!(r, Err(RuntimeError::Include(ref m)) if m.contains("itself")), "{r:?}");
    assert!(host.include_calls <= 4);
}

#[test]
fn max_header_edits() {
    let edits = |n: usize| {
        format!(
            "require \"editheader\";\n{}",
            (0..n).map(|i| format!("addheader \"X-N{i}\" \"v\";\n")).collect::<String>()
        )
    };
    assert!(try_run(&edits(32), &simple_message()).unwrap().edited_message.is_some());
    assert_eq!(try_run(&edits(33), &simple_message()), Err(RuntimeError::TooManyHeaderEdits));
}

#[test]
fn huge_string_literals_and_lists_within_the_size_limit() {
    let source = format!("require \"reject\"; reject \"{}\";", "s".repeat(60 * 1024));
    assert_eq!(actions(&source, &simple_message()).len(), 1);
    let list = (0..5000).map(|i| format!("\"{i}\"")).collect::<Vec<_>>().join(",");
    let source = format!("if header :is \"subject\" [{list}] {{ discard; }}");
    assert_eq!(actions(&source, &simple_message()), vec![keep()]);
}

#[test]
fn garbage_never_panics() {
    let mut seed: u64 = 0x5eed;
    let pieces = [
        "if",
        "elsif",
        "else",
        "{",
        "}",
        "(",
        ")",
        "[",
        "]",
        ",",
        ";",
        "\"",
        "text:\n",
        "\n.\n",
        ":is",
        ":matches",
        "header",
        "allof",
        "not",
        "true",
        "\"*?*\"",
        "${",
        "}",
        "${1}",
        "require",
        "\"variables\"",
        "set",
        "12K",
        "#",
        "/*",
        "*/",
        "\\",
        "keep",
        "fileinto",
        ":count",
        "\"ge\"",
        "address",
        ":domain",
        "string",
    ];
    for _ in 0..3000 {
        let mut s = String::new();
        for _ in 0..(seed % 40) {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            s.push_str(pieces[(seed >> 33) as usize % pieces.len()]);
            s.push(' ');
        }
        if let Ok(script) = Script::compile(s.as_bytes(), &limits()) {
            let _ =
                run(&script, &simple_message(), &context(FROM, TO, &[]), &mut TestHost::default(), &limits());
        }
    }
}

#[test]
fn header_tests_over_a_huge_header_are_charged_by_its_size() {
    // 200,000 fields: each test scans them all, so a thousand tests are
    // more work than one run may do.
    let fields: Vec<String> = (0..200_000).map(|i| format!("X-F{i}: v")).collect();
    let m = message(&fields.iter().map(String::as_str).collect::<Vec<_>>(), "");
    let source =
        "if exists \"subject\" { discard; }\nif header :is \"x-none\" \"v\" { discard; }\n".repeat(500);
    let started = Instant::now();
    assert_eq!(try_run(&source, &m), Err(RuntimeError::TooManyInstructions));
    assert!(started.elapsed() < SLOW * 3, "{:?}", started.elapsed());
    // One long value read by many tests: each read is charged by its length.
    let m = message(&[&format!("Subject: {}", "w ".repeat(512 * 1024))], "");
    let source = "if header :is \"subject\" \"w\" { discard; }\n".repeat(1000);
    let started = Instant::now();
    assert_eq!(try_run(&source, &m), Err(RuntimeError::TooManyInstructions));
    assert!(started.elapsed() < SLOW * 3, "{:?}", started.elapsed());
}

#[test]
fn the_body_is_parsed_once_per_run_and_that_parse_is_charged() {
    let m = message(&["Content-Type: text/plain"], &"word ".repeat(400 * 1024));
    // Many body tests with short keys: the matching costs little, the parse
    // of a 2 MiB message is paid once.
    let source = format!("require \"body\";\n{}", "if body :text :is \"x\" { discard; }\n".repeat(150));
    let started = Instant::now();
    assert_eq!(actions(&source, &m), vec![keep()]);
    assert!(started.elapsed() < SLOW, "{:?}", started.elapsed());
}

#[test]
fn the_deepest_legal_scripts_compile_and_run_on_a_small_stack() {
    // 32 levels of blocks and tests in each of five scripts, each including
    // the next (as deep as includes go): what the limits allow must fit a 1 MiB thread stack (tokio's
    // workers have 2 MiB), even unoptimised.
    let worker = std::thread::Builder::new().stack_size(1 << 20).spawn(|| {
        let level = |next: &str| {
            format!(
                "require [\"include\", \"fileinto\"];\n{}if {}true {{ include :optional \"{next}\"; fileinto \"deep\"; }}{}",
                "if true {".repeat(29),
                "not not ",
                "}".repeat(29)
            )
        };
        let nots = format!("require \"fileinto\"; if {}true {{ fileinto \"bottom\"; }}", "not not ".repeat(15));
        let mut host = TestHost::default().with_script("l3", false, &nots);
        for (name, next) in [("l2", "l3"), ("l1", "l2"), ("l0", "l1")] {
            host = host.with_script(name, false, &level(next));
        }
        let top = Script::compile(level("l0").as_bytes(), &limits()).unwrap();
        let out = run(&top, &simple_message(), &context(FROM, TO, &[]), &mut host, &limits()).unwrap();
        assert_eq!(out.actions, vec![fileinto("bottom"), fileinto("deep")]);
        Script::compile(nots.as_bytes(), &limits()).unwrap();
    });
    worker.unwrap().join().unwrap();
}
