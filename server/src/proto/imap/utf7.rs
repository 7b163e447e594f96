//! Modified UTF-7 for mailbox names (RFC 3501 §5.1.3): printable ASCII stands for
//! itself, `&` is `&-`, every other run is `&` + base64 of UTF-16BE with `,` for
//! `/` and no padding + `-`. Names are UTF-8 in the store and UTF-7 on the wire.

use base64::Engine as _;
use base64::alphabet::Alphabet;
use base64::engine::{GeneralPurpose, GeneralPurposeConfig};

fn engine() -> GeneralPurpose {
    // The IMAP alphabet is standard base64 with ',' in place of '/'.
    let alphabet = Alphabet::new("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+,")
        .unwrap_or(base64::alphabet::STANDARD);
    GeneralPurpose::new(
        &alphabet,
        GeneralPurposeConfig::new()
            .with_encode_padding(false)
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::RequireNone),
    )
}

/// UTF-8 → modified UTF-7.
pub fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut pending: Vec<u16> = Vec::new();
    let flush = |pending: &mut Vec<u16>, out: &mut String| {
        if pending.is_empty() {
            return;
        }
        let bytes: Vec<u8> = pending.iter().flat_map(|u| u.to_be_bytes()).collect();
        out.push('&');
        out.push_str(&engine().encode(bytes));
        out.push('-');
        pending.clear();
    };
    for c in name.chars() {
        if (' '..='~').contains(&c) {
            flush(&mut pending, &mut out);
            if c == '&' {
                out.push_str("&-");
            } else {
                out.push(c);
            }
        } else {
            let mut buf = [0u16; 2];
            pending.extend_from_slice(c.encode_utf16(&mut buf));
        }
    }
    flush(&mut pending, &mut out);
    out
}

/// Modified UTF-7 → UTF-8. `None` when the name is not valid modified UTF-7 (the
/// client then gets NO rather than a mailbox with a mangled name).
pub fn decode(name: &str) -> Option<String> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(pos) = rest.find('&') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        let end = after.find('-')?;
        let chunk = &after[..end];
        if chunk.is_empty() {
            out.push('&');
        } else {
            let bytes = engine().decode(chunk).ok()?;
            if bytes.len() % 2 != 0 {
                return None;
            }
            let units: Vec<u16> = bytes.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
            out.push_str(&String::from_utf16(&units).ok()?);
        }
        rest = &after[end + 1..];
    }
    if rest.bytes().any(|b| !(0x20..0x7f).contains(&b)) {
        // Raw 8-bit names are not modified UTF-7; accept UTF-8 as-is since some
        // clients send it (UTF8=ACCEPT style) and it is unambiguous.
        out.push_str(rest);
        return Some(out);
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_examples_round_trip() {
        // RFC 3501 §5.1.3 example.
        assert_eq!(encode("~peter/mail/台北/日本語"), "~peter/mail/&U,BTFw-/&ZeVnLIqe-");
        assert_eq!(decode("~peter/mail/&U,BTFw-/&ZeVnLIqe-").as_deref(), Some("~peter/mail/台北/日本語"));
        assert_eq!(encode("A&B"), "A&-B");
        assert_eq!(decode("A&-B").as_deref(), Some("A&B"));
        assert_eq!(encode("Entwürfe"), "Entw&APw-rfe");
        assert_eq!(decode("Entw&APw-rfe").as_deref(), Some("Entwürfe"));
        assert_eq!(decode("&Jjo-!").as_deref(), Some("☺!"));
        for bad in ["&", "&ZeVnLIqe", "&A-"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }
}
