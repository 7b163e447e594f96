//! The Mailcluster mail pod: SMTP, IMAP and POP3 over a shared store and cache.
//!
//! Data flows one way: [`net`] accepts, [`proto`] parses, the protocol session
//! ([`smtp`], [`imap`], [`pop3`]) decides, [`store`] and [`cache`] persist.
// One audited exception: store/postgres/nodelay.rs.
#![deny(unsafe_code)]

pub mod accept;
pub mod admin;
pub mod app;
pub mod auth;
pub mod cache;
pub mod config;
pub mod delivery;
pub mod directory;
pub mod dkim;
pub mod dns;
pub mod filter;
pub mod imap;
pub mod inbound;
pub mod managesieve;
pub mod metrics;
pub mod net;
pub mod password;
pub mod pop3;
pub mod proto;
pub mod provision;
pub mod relay;
pub mod scripts;
pub mod serve;
pub mod smtp;
pub mod store;
pub mod view;
