//! `:matches` (RFC 5228 §2.7.1) and its match variables (RFC 5229 §3.2)
//! against a plain backtracking matcher on small random cases: the linear
//! matcher must agree on every verdict and every `${n}`.

mod common;

use common::*;
use mailcluster_sieve::Action;

#[derive(Clone, Copy)]
enum P {
    Lit(char),
    One,
    Star,
}

fn pattern(p: &str) -> Vec<P> {
    let mut out = Vec::new();
    let mut chars = p.chars();
    while let Some(c) = chars.next() {
        out.push(match c {
            '*' => P::Star,
            '?' => P::One,
            '\\' => P::Lit(chars.next().unwrap_or('\\')),
            c => P::Lit(c),
        });
    }
    out
}

/// Every wildcard as short as it can be, left to right.
fn reference(p: &[P], t: &[char], caps: &mut Vec<String>) -> bool {
    match p.first() {
        None => t.is_empty(),
        Some(P::Lit(c)) => {
            t.first().is_some_and(|x| x.eq_ignore_ascii_case(c)) && reference(&p[1..], &t[1..], caps)
        }
        Some(P::One) => {
            if t.is_empty() {
                return false;
            }
            caps.push(t[0].to_string());
            reference(&p[1..], &t[1..], caps) || {
                caps.pop();
                false
            }
        }
        Some(P::Star) => {
            for k in 0..=t.len() {
                caps.push(t[..k].iter().collect());
                if reference(&p[1..], &t[k..], caps) {
                    return true;
                }
                caps.pop();
            }
            false
        }
    }
}

fn quoted(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

#[test]
fn linear_matcher_agrees_with_backtracking_on_random_cases() {
    let text_alphabet = ['a', 'A', 'b', 'é', '*', '?'];
    let pattern_alphabet = ["a", "b", "B", "é", "*", "*", "?", "\\*", "\\?", "\\\\"];
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let mut matched = 0;
    for _ in 0..1500 {
        let text: String = (0..next(9)).map(|_| text_alphabet[next(text_alphabet.len())]).collect();
        let pat: String = (0..next(7)).map(|_| pattern_alphabet[next(pattern_alphabet.len())]).collect();
        let chars: Vec<char> = text.chars().collect();
        let mut caps = vec![text.clone()];
        let want = reference(&pattern(&pat), &chars, &mut caps).then(|| {
            caps.resize(10, String::new());
            caps[..10].join("|")
        });
        let source = format!(
            "require [\"variables\", \"reject\"];\n\
             if string :matches \"{}\" \"{}\" {{ reject \"${{0}}|${{1}}|${{2}}|${{3}}|${{4}}|${{5}}|${{6}}|${{7}}|${{8}}|${{9}}\"; }}",
            quoted(&text),
            quoted(&pat)
        );
        let got = match actions(&source, &simple_message()).as_slice() {
            [Action::Reject { reason, .. }] => Some(reason.clone()),
            _ => None,
        };
        assert_eq!(got, want, "text {text:?} pattern {pat:?}");
        matched += usize::from(got.is_some());
    }
    // The cases are not all trivial misses.
    assert!(matched > 80, "{matched}");
}
