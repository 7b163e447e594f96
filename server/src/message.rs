//! Parse a message once, at delivery or APPEND, into the [`MessageMeta`] the store
//! keeps beside the body.

use crate::store::MessageMeta;

/// Computes the stored metadata of a raw RFC 5322 message.
pub fn parse_meta(raw: &[u8]) -> MessageMeta {
    let header_size = find_header_end(raw).unwrap_or(raw.len());
    MessageMeta { size: raw.len() as u32, header_size: header_size as u32, ..MessageMeta::default() }
}

/// Offset just past the blank line ending the header block.
fn find_header_end(raw: &[u8]) -> Option<usize> {
    raw.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}
