//! Protocol grammar and replies, no sockets: one module per protocol.

pub mod imap;
pub mod pop3;
pub mod smtp;
