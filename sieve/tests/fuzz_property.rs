//! The `sieve` fuzz target's property (`fuzz/sieve_checks.rs`) over its seed
//! corpus and mutations of it, bounded in time, with the ordinary tests.
//! `MAILCLUSTER_FUZZ_SEED` repeats a run, `MAILCLUSTER_FUZZ_SECS` lengthens it.

#[path = "../../fuzz/sieve_checks.rs"]
mod sieve_checks;

use std::time::{Duration, Instant};

/// Fragments worth splicing in: tokens of the language and its limits.
const PIECES: &[&str] = &[
    "if ",
    "elsif ",
    "else ",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    ",",
    ";",
    "\"",
    "text:\r\n",
    "\r\n.\r\n",
    ":matches ",
    ":count \"ge\" ",
    "\"*?*\"",
    "${",
    "${1}",
    "${a}",
    "not ",
    "allof(",
    "anyof(",
    "include \"x\";",
    "stop;",
    "return;",
    "set \"a\" \"${a}${a}\";",
    "redirect \"r@example.com\";",
    "fileinto \"f\";",
    "reject \"r\";",
    "vacation \"v\";",
    "addheader \"X\" \"y\";",
    "deleteheader \"subject\";",
    "keep;",
    "discard;",
    "99999999999G",
    "\\",
    "/*",
    "*/",
    "#",
    "\u{e9}",
];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut data = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(6) {
        let at = rng.below(data.len() + 1);
        match rng.below(4) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] = rng.next() as u8;
            }
            1 if !data.is_empty() => {
                let end = (at + rng.below(16)).min(data.len());
                data.drain(at.min(end)..end);
            }
            2 => {
                let other = &seeds[rng.below(seeds.len())];
                let from = rng.below(other.len());
                let to = (from + rng.below(64)).min(other.len());
                data.splice(at..at, other[from..to].iter().copied());
            }
            _ => {
                let piece = PIECES[rng.below(PIECES.len())].as_bytes();
                data.splice(at..at, piece.iter().copied());
            }
        }
    }
    data
}

#[test]
fn sieve_property_over_seeds_and_mutations() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/corpus/sieve");
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .expect("the seed corpus")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("seed-"))
        .map(|e| std::fs::read(e.path()).expect("a seed"))
        .collect();
    assert!(seeds.len() >= 3, "seeds in {dir}");
    seeds.sort();
    for seed in &seeds {
        let compiled = mailcluster_sieve::Script::compile(seed, &mailcluster_sieve::Limits::default());
        assert!(compiled.is_ok(), "{compiled:?}: {}", String::from_utf8_lossy(seed));
        sieve_checks::sieve(seed);
    }
    let seed =
        std::env::var("MAILCLUSTER_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        }) | 1;
    let secs = std::env::var("MAILCLUSTER_FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    eprintln!("MAILCLUSTER_FUZZ_SEED={seed}");
    let mut rng = Rng(seed);
    let until = Instant::now() + Duration::from_secs(secs);
    let mut runs = 0;
    while Instant::now() < until && runs < 200_000 {
        sieve_checks::sieve(&mutate(&mut rng, &seeds));
        runs += 1;
    }
    eprintln!("{runs} mutated scripts");
}
