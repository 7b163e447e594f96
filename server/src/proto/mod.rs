//! Protocol grammar and replies, no sockets: one module per protocol, and the
//! framing of client input they share ([`frame`]).

pub mod frame;
pub mod imap;
pub mod managesieve;
pub mod pop3;
pub mod smtp;
