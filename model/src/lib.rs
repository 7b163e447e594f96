//! The mail vocabulary shared by the store, the protocol sessions, delivery, the
//! relay and the tools: plain data ([`Account`], [`Mailbox`], [`FlagSet`],
//! [`UidSet`], [`MessageMeta`], queue and DSN records), the metadata parsed once
//! from a message's bytes ([`message::parse_meta`]) and the sort keys SORT and
//! THREAD compare ([`sort_keys`]).
//!
//! No I/O and no dependency on another crate of the workspace: the store and
//! the protocol grammar both build on it, and the fuzz targets can link it alone.

pub mod message;
pub mod sort_keys;
mod types;

pub use types::*;
