//! The handshake that opens every follower's connection: the leader's greeting
//! with its instance id and a nonce, and the proofs of the cluster's key each
//! side gives over both nonces. Kept apart from the frames because it is the
//! one place the key is used: a peer that does not prove it gets no frame.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::CONNECT_TIMEOUT;
use crate::cache::hex;

pub(super) const GREETING: &str = "MCGC2";

/// A random id of this process, to tell a pod that resolved its own address.
pub fn instance_id() -> String {
    let mut id = [0u8; 8];
    rand::fill(&mut id);
    hex(&id)
}

/// Which side of the handshake a proof is from: part of what is signed, so a
/// proof made by one side is never accepted from the other.
#[derive(Clone, Copy)]
pub(super) enum Role {
    Leader,
    Follower,
}

/// HMAC-SHA256 over the role and both nonces (fields separated by a NUL,
/// which a hex nonce never contains).
fn proof(key: &[u8], role: Role, leader_nonce: &str, follower_nonce: &str) -> Option<Hmac<Sha256>> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).ok()?;
    mac.update(match role {
        Role::Leader => b"leader",
        Role::Follower => b"follower",
    });
    for nonce in [leader_nonce, follower_nonce] {
        mac.update(b"\0");
        mac.update(nonce.as_bytes());
    }
    Some(mac)
}

pub(super) fn proof_hex(key: &[u8], role: Role, leader_nonce: &str, follower_nonce: &str) -> Option<String> {
    proof(key, role, leader_nonce, follower_nonce).map(|mac| hex(&mac.finalize().into_bytes()))
}

/// Whether `given` (hex) is `role`'s proof over the two nonces; constant time.
pub(super) fn proven(key: &[u8], role: Role, leader_nonce: &str, follower_nonce: &str, given: &str) -> bool {
    decode_hex(given)
        .and_then(|given| {
            proof(key, role, leader_nonce, follower_nonce).map(|mac| mac.verify_slice(&given).is_ok())
        })
        .unwrap_or(false)
}

/// A fresh challenge: 16 random bytes in hex.
fn nonce() -> String {
    let mut nonce = [0u8; 16];
    rand::fill(&mut nonce);
    hex(&nonce)
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

/// The follower's side: reads the greeting, proves the key and checks the
/// leader's proof back. False when the greeting shows this very process (the
/// pod resolved its own address), and nothing was sent.
pub(super) async fn as_follower(
    read: &mut BufReader<OwnedReadHalf>,
    write: &mut OwnedWriteHalf,
    key: &[u8],
    instance: &str,
) -> std::io::Result<bool> {
    let refused = |why: &str| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why.to_string());
    let mut line = String::new();
    (&mut *read).take(256).read_line(&mut line).await?;
    let mut words = line.trim_end().split(' ');
    let (Some(GREETING), Some(leader), Some(nonce), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Err(refused("not a group-commit leader"));
    };
    if leader == instance {
        return Ok(false);
    }
    let (theirs, ours) = (nonce.to_string(), self::nonce());
    let mine = proof_hex(key, Role::Follower, &theirs, &ours).ok_or_else(|| refused("unusable key"))?;
    write.write_all(format!("{instance} {ours} {mine}\n").as_bytes()).await?;
    line.clear();
    (&mut *read).take(256).read_line(&mut line).await?;
    match line.trim_end().split_once(' ') {
        Some(("OK", proof)) if proven(key, Role::Leader, &theirs, &ours, proof) => Ok(true),
        // Deliveries go only to a pod that holds the key too: whoever answers
        // on the leader's address without it gets none.
        Some(("OK", _)) => Err(refused("the leader did not prove the cluster's key")),
        _ => Err(refused("the leader refused this pod's key")),
    }
}

/// The leader's side: greets, checks the follower's proof and proves the key
/// back, or says `NO` and fails.
pub(super) async fn as_leader(
    read: &mut BufReader<OwnedReadHalf>,
    write: &mut OwnedWriteHalf,
    key: &[u8],
    instance: &str,
) -> std::io::Result<()> {
    let nonce = self::nonce();
    write.write_all(format!("{GREETING} {instance} {nonce}\n").as_bytes()).await?;
    let mut line = String::new();
    tokio::time::timeout(CONNECT_TIMEOUT * 5, (&mut *read).take(256).read_line(&mut line))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer to the greeting"))??;
    let mut words = line.trim_end().split(' ');
    let answer = match (words.next(), words.next(), words.next(), words.next()) {
        (Some(_), Some(theirs), Some(given), None)
            if !theirs.is_empty() && proven(key, Role::Follower, &nonce, theirs, given) =>
        {
            proof_hex(key, Role::Leader, &nonce, theirs)
        }
        _ => None,
    };
    let Some(answer) = answer else {
        let _ = write.write_all(b"NO\n").await;
        return Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, "wrong group-commit key"));
    };
    write.write_all(format!("OK {answer}\n").as_bytes()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_binds_the_role_and_both_nonces() {
        let p = |key: &[u8], role, l: &str, f: &str| proof_hex(key, role, l, f).unwrap();
        let follower = p(b"k", Role::Follower, "aa", "bb");
        assert!(proven(b"k", Role::Follower, "aa", "bb", &follower));
        assert!(!proven(b"k", Role::Leader, "aa", "bb", &follower), "a follower's proof is no leader's");
        assert!(!proven(b"other", Role::Follower, "aa", "bb", &follower), "another key");
        assert!(!proven(b"k", Role::Follower, "aa", "bc", &follower), "another follower nonce");
        assert!(!proven(b"k", Role::Follower, "ab", "bb", &follower), "another leader nonce");
        // The separator keeps ("a", "abb") and ("aa", "bb") apart.
        assert_ne!(p(b"k", Role::Follower, "a", "abb"), follower);
        assert!(!proven(b"k", Role::Follower, "aa", "bb", ""), "no proof");
        assert!(!proven(b"k", Role::Follower, "aa", "bb", "zz"), "not hex");
    }

    #[test]
    fn hex_decodes_pairs_of_digits_only() {
        assert_eq!(decode_hex("00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(decode_hex("0"), None);
        assert_eq!(decode_hex("zz"), None);
    }
}
