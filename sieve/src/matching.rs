//! Comparators (RFC 4790: i;octet, i;ascii-casemap, i;ascii-numeric), match
//! types (RFC 5228 §2.7.1, RFC 5231) and the evaluation budget they charge.
//!
//! `:matches` never backtracks: a pattern is split at its `*`s into segments of
//! fixed length (in characters); the first is anchored at the start, the last
//! at the end, and each one between is placed at its leftmost occurrence, which
//! is where any match may put it. The cost is one pass over the value per
//! segment, so `*a*a*a*a*a*b` against 64 KiB is a few hundred thousand steps,
//! not an exponential search. The wildcards before the last thereby match as
//! little as they can, as RFC 5229 §3.2 asks of match variables.

use std::cmp::Ordering;

use memchr::memmem;

use crate::RuntimeError;
use crate::ast::{Comparator, Match, MatchKind, Relation};

/// Comparison steps that cost one instruction.
const STEPS_PER_INSTRUCTION: u64 = 1024;

pub(crate) struct Budget {
    pub used: u64,
    pub max: u64,
}

impl Budget {
    pub fn charge(&mut self, n: u64) -> Result<(), RuntimeError> {
        self.used = self.used.saturating_add(n);
        if self.used > self.max { Err(RuntimeError::TooManyInstructions) } else { Ok(()) }
    }

    /// One instruction for the comparison and one more per KiB it examines.
    fn charge_scan(&mut self, bytes: usize) -> Result<(), RuntimeError> {
        self.charge(1 + bytes as u64 / STEPS_PER_INSTRUCTION)
    }
}

/// Whether `value` matches `key` under `m` (all kinds but `:count`, which the
/// caller counts). On a `:matches` success, `captures` receives `${0}` (the
/// whole value) and then what each wildcard matched.
pub(crate) fn compare(
    m: &Match,
    value: &str,
    key: &str,
    budget: &mut Budget,
    captures: Option<&mut Vec<String>>,
) -> Result<bool, RuntimeError> {
    match m.kind {
        MatchKind::Is => {
            budget.charge_scan(value.len().min(key.len()))?;
            Ok(order(m.comparator, value, key) == Ordering::Equal)
        }
        MatchKind::Contains => {
            budget.charge_scan(value.len())?;
            Ok(match m.comparator {
                Comparator::Octet => memmem::find(value.as_bytes(), key.as_bytes()).is_some(),
                _ => {
                    let (v, k) = (value.to_ascii_lowercase(), key.to_ascii_lowercase());
                    memmem::find(v.as_bytes(), k.as_bytes()).is_some()
                }
            })
        }
        MatchKind::Matches => glob(key, value, m.comparator != Comparator::Octet, budget, captures),
        MatchKind::Value(rel) | MatchKind::Count(rel) => {
            budget.charge_scan(value.len().min(key.len()))?;
            Ok(relate(m.comparator, rel, value, key))
        }
    }
}

pub(crate) fn relate(comparator: Comparator, rel: Relation, a: &str, b: &str) -> bool {
    let o = order(comparator, a, b);
    match rel {
        Relation::Gt => o == Ordering::Greater,
        Relation::Ge => o != Ordering::Less,
        Relation::Lt => o == Ordering::Less,
        Relation::Le => o != Ordering::Greater,
        Relation::Eq => o == Ordering::Equal,
        Relation::Ne => o != Ordering::Equal,
    }
}

fn order(comparator: Comparator, a: &str, b: &str) -> Ordering {
    match comparator {
        Comparator::Octet => a.as_bytes().cmp(b.as_bytes()),
        Comparator::Casemap => {
            a.bytes().map(|c| c.to_ascii_lowercase()).cmp(b.bytes().map(|c| c.to_ascii_lowercase()))
        }
        Comparator::Numeric => match (numeric(a), numeric(b)) {
            (None, None) => Ordering::Equal,
            (None, Some(_)) => Ordering::Greater,
            (Some(_), None) => Ordering::Less,
            (Some(x), Some(y)) => x.len().cmp(&y.len()).then_with(|| x.cmp(y)),
        },
    }
}

/// RFC 4790 §9.1: the value of the leading digits, leading zeros dropped; a
/// string that does not start with a digit is positive infinity (`None`).
fn numeric(s: &str) -> Option<&str> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    (digits > 0).then(|| s[..digits].trim_start_matches('0'))
}

#[derive(Clone, Copy, PartialEq)]
enum Tok {
    Byte(u8),
    /// `?`: one character.
    One,
}

/// The pattern's segments between `*`s; escapes (`\*`, `\?`, `\\`) resolved.
fn segments(pattern: &str, fold: bool) -> Vec<Vec<Tok>> {
    let mut segs = vec![Vec::new()];
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        let literal = match c {
            '*' => {
                segs.push(Vec::new());
                continue;
            }
            '?' => {
                if let Some(s) = segs.last_mut() {
                    s.push(Tok::One);
                }
                continue;
            }
            '\\' => chars.next().unwrap_or('\\'),
            c => c,
        };
        let mut buf = [0u8; 4];
        let seg = segs.last_mut().expect("segments start non-empty");
        for &b in literal.encode_utf8(&mut buf).as_bytes() {
            seg.push(Tok::Byte(if fold { b.to_ascii_lowercase() } else { b }));
        }
    }
    segs
}

fn char_len(lead: u8) -> usize {
    match lead {
        0xF0.. => 4,
        0xE0.. => 3,
        0xC0.. => 2,
        _ => 1,
    }
}

/// Where `seg` ends when matched forward from `at`, if it matches there.
fn forward(seg: &[Tok], t: &[u8], mut at: usize) -> Option<usize> {
    for tok in seg {
        match *tok {
            Tok::Byte(b) => {
                if t.get(at) != Some(&b) {
                    return None;
                }
                at += 1;
            }
            Tok::One => {
                let lead = *t.get(at)?;
                at = (at + char_len(lead)).min(t.len());
            }
        }
    }
    Some(at)
}

/// Where `seg` starts when matched backward so that it ends at `end`.
fn backward(seg: &[Tok], t: &[u8], mut end: usize) -> Option<usize> {
    for tok in seg.iter().rev() {
        match *tok {
            Tok::Byte(b) => {
                if end == 0 || t[end - 1] != b {
                    return None;
                }
                end -= 1;
            }
            Tok::One => {
                if end == 0 {
                    return None;
                }
                end -= 1;
                while end > 0 && t[end] & 0xC0 == 0x80 {
                    end -= 1;
                }
            }
        }
    }
    Some(end)
}

/// The characters the `?`s of `seg`, matched at `at`, took.
fn ones<'t>(seg: &[Tok], text: &'t str, mut at: usize, out: &mut Vec<&'t str>) {
    let t = text.as_bytes();
    for tok in seg {
        match tok {
            Tok::Byte(_) => at += 1,
            Tok::One => {
                let end = (at + char_len(t[at])).min(t.len());
                out.push(&text[at..end]);
                at = end;
            }
        }
    }
}

/// `:matches` (RFC 5228 §2.7.1): `*` any run of characters, `?` one, `\`
/// escapes the next; `fold` for i;ascii-casemap.
pub(crate) fn glob(
    pattern: &str,
    value: &str,
    fold: bool,
    budget: &mut Budget,
    captures: Option<&mut Vec<String>>,
) -> Result<bool, RuntimeError> {
    let segs = segments(pattern, fold);
    let lowered;
    let t: &[u8] = if fold {
        lowered = value.to_ascii_lowercase();
        lowered.as_bytes()
    } else {
        value.as_bytes()
    };
    budget.charge(1)?;
    let mut steps: u64 = 0;
    let first = &segs[0];
    let Some(mut pos) = forward(first, t, 0) else { return Ok(false) };
    if segs.len() == 1 {
        if pos != t.len() {
            return Ok(false);
        }
        if let Some(out) = captures {
            let mut found = Vec::new();
            ones(first, value, 0, &mut found);
            out.clear();
            out.push(value.to_string());
            out.extend(found.into_iter().map(str::to_string));
        }
        return Ok(true);
    }
    // (start, end) of each segment after the first.
    let mut placed = Vec::with_capacity(segs.len() - 1);
    for seg in &segs[1..segs.len() - 1] {
        let mut at = pos;
        let found = loop {
            if at + seg.len() > t.len() && !seg.contains(&Tok::One) {
                break None;
            }
            // Jump to the next place the segment's first literal byte occurs.
            if let Some(Tok::Byte(b)) = seg.first() {
                match memchr::memchr(*b, &t[at.min(t.len())..]) {
                    Some(skip) => at += skip,
                    None => break None,
                }
            }
            steps += seg.len() as u64 + 1;
            if steps >= 64 * STEPS_PER_INSTRUCTION {
                budget.charge(steps / STEPS_PER_INSTRUCTION)?;
                steps %= STEPS_PER_INSTRUCTION;
            }
            if let Some(end) = forward(seg, t, at) {
                break Some((at, end));
            }
            if at >= t.len() {
                break None;
            }
            at += 1;
            while at < t.len() && t[at] & 0xC0 == 0x80 {
                at += 1;
            }
        };
        let Some((start, end)) = found else {
            budget.charge(steps / STEPS_PER_INSTRUCTION)?;
            return Ok(false);
        };
        placed.push((start, end));
        pos = end;
    }
    budget.charge(steps / STEPS_PER_INSTRUCTION)?;
    let last = &segs[segs.len() - 1];
    let Some(start) = backward(last, t, t.len()) else { return Ok(false) };
    if start < pos {
        return Ok(false);
    }
    placed.push((start, t.len()));
    if let Some(out) = captures {
        let mut found: Vec<&str> = Vec::new();
        ones(first, value, 0, &mut found);
        let mut prev_end = segs_end(first, value);
        for (seg, &(start, _)) in segs[1..].iter().zip(&placed) {
            found.push(&value[prev_end..start]);
            ones(seg, value, start, &mut found);
            prev_end = forward_end(seg, value, start);
        }
        out.clear();
        out.push(value.to_string());
        out.extend(found.into_iter().map(str::to_string));
    }
    Ok(true)
}

fn segs_end(seg: &[Tok], value: &str) -> usize {
    forward_end(seg, value, 0)
}

/// Where `seg` (known to match at `at`) ends in `value`; folding changes no
/// byte offsets, so the original value serves.
fn forward_end(seg: &[Tok], value: &str, mut at: usize) -> usize {
    let t = value.as_bytes();
    for tok in seg {
        at = match tok {
            Tok::Byte(_) => at + 1,
            Tok::One => (at + char_len(t[at])).min(t.len()),
        };
    }
    at
}
