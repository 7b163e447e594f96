//! The password hash formats the server verifies: argon2 (PHC strings, what it
//! writes itself), and the crypt(3) formats other mail systems wrote — bcrypt
//! (`$2b$`, `$2y$`, `$2a$`) and SHA-crypt (`$6$` SHA512-CRYPT, `$5$`
//! SHA256-CRYPT) — so that accounts move here with their hashes, without a
//! password reset.
//!
//! A hash's parameters are what each login of its account costs a pod (memory
//! and CPU of one verification before the credential cache holds it), so every
//! format has an upper bound, checked both when a hash is accepted from outside
//! ([`check`]) and before one is run ([`verify`]): a hash put into the store
//! some other way cannot make one login take gigabytes or minutes either.

use argon2::password_hash::phc::PasswordHash;
use argon2::{Argon2, PasswordVerifier};

/// The most an argon2 hash may ask of each login: 256 MiB, 10 passes, 8 lanes —
/// well above OWASP's configurations (19 MiB × 2, 46 MiB × 1) and what Dovecot
/// and others write, far below what would let one account's logins exhaust a pod.
pub const MAX_ARGON2_MEMORY_KIB: u32 = 256 * 1024;
pub const MAX_ARGON2_PASSES: u32 = 10;
pub const MAX_ARGON2_LANES: u32 = 8;
/// bcrypt's cost is log2 of its rounds: 14 is about a second of one core, four
/// times the 12 that current tools write (Dovecot, htpasswd -B and PHP use 5-12).
pub const MAX_BCRYPT_COST: u32 = 14;
/// SHA-crypt rounds: crypt(3) writes 5,000 by default and passlib 535,000-656,000
/// (about half a second); a million is the limit.
pub const MAX_SHA_CRYPT_ROUNDS: u32 = 1_000_000;
/// SHA-crypt hashes the password again in every round, so a round's cost grows
/// with the password's length, which the client chooses: a 4 KiB password
/// against a million rounds would be over ten times the cost of a short one.
/// Longer passwords do not verify against a SHA-crypt hash (no migrated system
/// is likely to hold one; argon2 and bcrypt cost the same for any length).
pub const MAX_SHA_CRYPT_PASSWORD: usize = 256;

/// A hash format the server verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Argon2,
    Bcrypt,
    ShaCrypt,
}

/// Why a hash cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HashError {
    #[error(
        "password hashes of scheme ${0}$ cannot be verified by the server (it verifies argon2id, argon2i, \
         argon2d, bcrypt $2b$/$2y$/$2a$ and SHA-crypt $6$/$5$)"
    )]
    Unsupported(String),
    #[error("the {0} hash does not parse: {1}")]
    Malformed(&'static str, String),
    #[error("the {0} hash asks {1}: at most {2} (each login runs it)")]
    TooCostly(&'static str, String, String),
    #[error("not a password hash")]
    NotAHash,
}

/// `argon2id` for `$argon2id$…`, `2b` for `$2b$…`, `6` for `$6$…`: the scheme of
/// a string shaped like a crypt(3) or PHC hash, else `None`.
pub fn scheme_name(value: &str) -> Option<&str> {
    let rest = value.strip_prefix('$')?;
    let (scheme, tail) = rest.split_once('$')?;
    let plausible = !scheme.is_empty()
        && scheme.len() <= 32
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && !tail.is_empty()
        && !value.contains(char::is_whitespace);
    plausible.then_some(scheme)
}

/// The scheme of `hash`, once it parses and its cost is within the bounds above.
pub fn check(hash: &str) -> Result<Scheme, HashError> {
    let name = scheme_name(hash).ok_or(HashError::NotAHash)?;
    match name {
        "argon2id" | "argon2i" | "argon2d" => {
            let parsed =
                PasswordHash::new(hash).map_err(|e| HashError::Malformed("argon2", e.to_string()))?;
            let params = argon2::Params::try_from(&parsed)
                .map_err(|e| HashError::Malformed("argon2", e.to_string()))?;
            if params.m_cost() > MAX_ARGON2_MEMORY_KIB
                || params.t_cost() > MAX_ARGON2_PASSES
                || params.p_cost() > MAX_ARGON2_LANES
            {
                return Err(HashError::TooCostly(
                    "argon2",
                    format!("m={} KiB, t={}, p={}", params.m_cost(), params.t_cost(), params.p_cost()),
                    format!("m={MAX_ARGON2_MEMORY_KIB}, t={MAX_ARGON2_PASSES}, p={MAX_ARGON2_LANES}"),
                ));
            }
            Ok(Scheme::Argon2)
        }
        // `$2x$` marks hashes of the old, broken implementation (a sign-extension
        // bug on 8-bit characters): verifying them as `$2b$` would refuse the
        // right password of some users, so they are not taken.
        "2b" | "2y" | "2a" => {
            let parts: bcrypt::HashParts = hash
                .parse()
                .map_err(|e: bcrypt::BcryptError| HashError::Malformed("bcrypt", e.to_string()))?;
            at_most("bcrypt", "cost", parts.get_cost(), MAX_BCRYPT_COST)?;
            Ok(Scheme::Bcrypt)
        }
        "6" | "5" => {
            at_most("SHA-crypt", "rounds", sha_crypt_rounds(hash)?, MAX_SHA_CRYPT_ROUNDS)?;
            Ok(Scheme::ShaCrypt)
        }
        other => Err(HashError::Unsupported(other.to_string())),
    }
}

/// `asked` of a hash's cost parameter, refused above `max`.
fn at_most(kind: &'static str, parameter: &str, asked: u32, max: u32) -> Result<(), HashError> {
    if asked > max {
        return Err(HashError::TooCostly(kind, format!("{parameter} {asked}"), format!("{parameter} {max}")));
    }
    Ok(())
}

/// The rounds of a `$6$[rounds=N$]salt$hash` string (5,000 when not given).
/// crypt(3) clamps rounds below 1,000 up to 1,000; such a hash is refused rather
/// than verified with rounds other than the ones written.
fn sha_crypt_rounds(hash: &str) -> Result<u32, HashError> {
    let malformed = |m: &str| HashError::Malformed("SHA-crypt", m.to_string());
    let fields: Vec<&str> = hash.split('$').collect();
    match fields.as_slice() {
        ["", _, rounds, _salt, digest] if !digest.is_empty() => {
            let n = rounds
                .strip_prefix("rounds=")
                .and_then(|n| n.parse::<u32>().ok())
                .ok_or_else(|| malformed("the rounds field is not rounds=N"))?;
            if n < sha_crypt::Params::ROUNDS_MIN {
                return Err(malformed("fewer than 1000 rounds"));
            }
            Ok(n)
        }
        ["", _, salt, digest] if !digest.is_empty() && !salt.starts_with("rounds=") => {
            Ok(sha_crypt::Params::RECOMMENDED_ROUNDS)
        }
        _ => Err(malformed("not $id$[rounds=N$]salt$hash")),
    }
}

/// Whether `password` is the one `hash` was made from. `Err` means the hash
/// itself cannot be used (unknown format, damaged, or over a cost bound), which
/// is not the user's fault.
pub fn verify(password: &str, hash: &str) -> Result<bool, HashError> {
    match check(hash)? {
        Scheme::Argon2 => {
            let parsed =
                PasswordHash::new(hash).map_err(|e| HashError::Malformed("argon2", e.to_string()))?;
            match Argon2::default().verify_password(password.as_bytes(), &parsed) {
                Ok(()) => Ok(true),
                Err(argon2::password_hash::Error::PasswordInvalid) => Ok(false),
                Err(e) => Err(HashError::Malformed("argon2", e.to_string())),
            }
        }
        Scheme::Bcrypt => {
            bcrypt::verify(password, hash).map_err(|e| HashError::Malformed("bcrypt", e.to_string()))
        }
        Scheme::ShaCrypt if password.len() > MAX_SHA_CRYPT_PASSWORD => Ok(false),
        Scheme::ShaCrypt => {
            use sha_crypt::password_hash::PasswordVerifier as _;
            match sha_crypt::ShaCrypt::default().verify_password(password.as_bytes(), hash) {
                Ok(()) => Ok(true),
                Err(sha_crypt::password_hash::Error::PasswordInvalid) => Ok(false),
                Err(e) => Err(HashError::Malformed("SHA-crypt", e.to_string())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Made by glibc's crypt(3) (libxcrypt), not by the crates verified here:
    //   python3 -c "import crypt; print(crypt.crypt('migrated pass', SETTING))"
    // with SETTING '$6$saltsalt$', '$6$rounds=10000$saltsalt$' and
    // '$2b$05$abcdefghijklmnopqrstuu' ('$2y$', '$2a$'), and by
    //   openssl passwd -6 -salt xyz 'migrated pass'
    const SHA512_DEFAULT: &str =
        "$6$saltsalt$UV8BYgqN7u34iPYiLihbOjmF22xo0X75SlnQFYRpDJsgJaXUiVT9jRyx4l4tz0FMJBBZGZbqw/l1xfhEu2dJa/";
    const SHA512_ROUNDS: &str = "$6$rounds=10000$saltsalt$LVf9L572n6vZisXo6j5K0j5ouggtat03Gjv9pozllbfE1SjnfKawk.\
                                 N4y2kUYLrpTrwxfFnwCiEG4JhwEskU2.";
    const SHA512_OPENSSL: &str =
        "$6$xyz$pQwBqNR7DpaKqBvDssur3Gp69y2GiJwLEbIxTviZczSmWZx4brtnENuDlMj.byd1cU8pOnwD/Vuu1d/UeWmWt0";
    const BCRYPT_2B: &str = "$2b$05$abcdefghijklmnopqrstuuVVzYGn6PXgpP3f4Lku9ALBvLuGFYlf2";
    const BCRYPT_2Y: &str = "$2y$05$abcdefghijklmnopqrstuuVVzYGn6PXgpP3f4Lku9ALBvLuGFYlf2";
    const BCRYPT_2A: &str = "$2a$05$abcdefghijklmnopqrstuuVVzYGn6PXgpP3f4Lku9ALBvLuGFYlf2";

    #[test]
    fn hashes_from_crypt3_verify_their_password_and_no_other() {
        for hash in [SHA512_DEFAULT, SHA512_ROUNDS, SHA512_OPENSSL, BCRYPT_2B, BCRYPT_2Y, BCRYPT_2A] {
            assert_eq!(verify("migrated pass", hash), Ok(true), "{hash}");
            assert_eq!(verify("migrated pasS", hash), Ok(false), "{hash}");
            assert_eq!(verify("", hash), Ok(false), "{hash}");
        }
        assert_eq!(check(SHA512_ROUNDS), Ok(Scheme::ShaCrypt));
        assert_eq!(check(BCRYPT_2Y), Ok(Scheme::Bcrypt));
        let argon2 = crate::auth::hash_password("migrated pass").unwrap();
        assert_eq!(verify("migrated pass", &argon2), Ok(true));
        assert_eq!(verify("other", &argon2), Ok(false));
    }

    #[test]
    fn sha_crypt_verifies_passwords_up_to_its_length_bound_only() {
        // perl -e 'print crypt("a" x N, q($6$rounds=1000$longpass$))' (glibc), N = 256, 257
        let at_bound = "$6$rounds=1000$longpass$8tAxPOjvAlTO06yRQzr8XZ5is1dzerhCKDHfPxKdiWq.\
                        Giv3xwPdRXZkRgNTGmFAtl7Urwat4iTCNosmsC34//";
        let over = "$6$rounds=1000$longpass$UUmDOVrgJPJP7DSkbDPepm0ru2VQMbNA66ptz1ol5BjyRXDKVx1uTh/\
                    2Fj9OqWEw10fDX4JRQTCHz.rR82FgX1";
        assert_eq!(verify(&"a".repeat(MAX_SHA_CRYPT_PASSWORD), at_bound), Ok(true));
        assert_eq!(verify(&"a".repeat(MAX_SHA_CRYPT_PASSWORD + 1), over), Ok(false), "never run");
        assert_eq!(verify(&"a".repeat(MAX_SHA_CRYPT_PASSWORD + 1), at_bound), Ok(false));
    }

    #[test]
    fn costs_over_the_bounds_are_refused_before_running() {
        // Only the parameters are read: these hashes' digests are never computed,
        // so the test is fast whatever they ask.
        let bcrypt_15 = "$2b$15$abcdefghijklmnopqrstuuVVzYGn6PXgpP3f4Lku9ALBvLuGFYlf2";
        let bcrypt_14 = "$2b$14$abcdefghijklmnopqrstuuVVzYGn6PXgpP3f4Lku9ALBvLuGFYlf2";
        let sha_over = "$6$rounds=1000001$saltsalt$LVf9L572n6vZisXo6j5K0j5ouggtat03Gjv9pozllbfE1SjnfKawk.\
                        N4y2kUYLrpTrwxfFnwCiEG4JhwEskU2.";
        let sha_at = sha_over.replace("1000001", "1000000");
        let argon2_memory =
            "$argon2id$v=19$m=4194304,t=2,p=1$c2FsdHNhbHRzYWx0$YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXoxMjM0NTY";
        let argon2_passes = "$argon2id$v=19$m=19456,t=1000000,p=1$c2FsdHNhbHRzYWx0$YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXoxMjM0NTY";
        for costly in [bcrypt_15, sha_over, argon2_memory, argon2_passes] {
            assert!(matches!(check(costly), Err(HashError::TooCostly(..))), "{costly}");
            assert!(matches!(verify("x", costly), Err(HashError::TooCostly(..))), "{costly}");
        }
        assert_eq!(check(bcrypt_14), Ok(Scheme::Bcrypt));
        assert_eq!(check(&sha_at), Ok(Scheme::ShaCrypt));
        let usual =
            "$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHRzYWx0$YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXoxMjM0NTY";
        assert_eq!(check(usual), Ok(Scheme::Argon2));
    }

    #[test]
    fn other_schemes_and_damaged_hashes_are_refused() {
        assert!(
            matches!(check("$1$salt$abcdefghijklmnopqrstu."), Err(HashError::Unsupported(s)) if s == "1")
        );
        // The broken implementation's bcrypt marker.
        assert!(matches!(check(&BCRYPT_2B.replace("$2b$", "$2x$")), Err(HashError::Unsupported(_))));
        for damaged in [
            "$2b$05$short",
            "$6$rounds=500$saltsalt$LVf9L572n6vZisXo6j5K0j5ouggtat03Gjv9pozllbfE1SjnfKawk",
            "$6$rounds=x$saltsalt$abc",
            "$6$saltonly",
            "$argon2id$broken",
        ] {
            assert!(matches!(check(damaged), Err(HashError::Malformed(..))), "{damaged}");
        }
        assert_eq!(check("plain words"), Err(HashError::NotAHash));
    }
}
