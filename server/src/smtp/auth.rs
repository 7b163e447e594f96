//! AUTH PLAIN and AUTH LOGIN (RFC 4954, RFC 4616), with or without an initial
//! response. Password checks, their cache and failure rate limits are the
//! [`crate::auth::Authenticator`]'s business; this file only speaks SASL.

use super::session::{Session, Step};
use crate::auth::AuthOutcome;
use crate::proto::smtp::{Reply, SaslMechanism, SaslPlain, replies, sasl_decode, sasl_encode, sasl_plain};

/// An AUTH exchange waiting for the client's next line.
#[derive(Debug)]
pub(super) enum AuthExchange {
    /// `AUTH PLAIN` without initial response: waiting for the PLAIN message.
    Plain,
    /// `AUTH LOGIN`: waiting for the user name.
    LoginUser,
    /// `AUTH LOGIN`: waiting for the password of this user.
    LoginPassword(String),
}

impl Session {
    pub(super) async fn cmd_auth(&mut self, mechanism: u64, initial: &str) -> Step {
        if !self.kind.is_submission() {
            self.reply(Reply::new(502, "5.5.1", "AUTH not available on this service"));
            return Step::Continue;
        }
        if !self.esmtp {
            self.reply(replies::bad_sequence("Send EHLO first"));
            return Step::Continue;
        }
        if self.account.is_some() {
            self.reply(replies::bad_sequence("Already authenticated"));
            return Step::Continue;
        }
        if self.envelope.is_some() {
            self.reply(replies::bad_sequence("AUTH not allowed during a mail transaction"));
            return Step::Continue;
        }
        if !self.auth_allowed() {
            self.reply(Reply::new(
                538,
                "5.7.11",
                "Encryption required for requested authentication mechanism",
            ));
            return Step::Continue;
        }
        let Some(mechanism) = SaslMechanism::from_smtp_proto(mechanism) else {
            self.reply(Reply::new(504, "5.5.4", "Unrecognized authentication type"));
            return Step::Continue;
        };
        let initial = initial.trim();
        match (mechanism, initial.is_empty()) {
            (SaslMechanism::Plain, true) => {
                self.auth_exchange = Some(AuthExchange::Plain);
                self.reply(Reply::new(334, "", ""));
                Step::Continue
            }
            (SaslMechanism::Login, true) => {
                self.auth_exchange = Some(AuthExchange::LoginUser);
                self.reply(Reply::new(334, "", sasl_encode("Username:")));
                Step::Continue
            }
            (_, false) => self.auth_step(mechanism_start(mechanism), initial).await,
        }
    }

    /// The client's answer to a 334 challenge.
    pub(super) async fn auth_continue(&mut self, exchange: AuthExchange, line: &[u8]) -> Step {
        let Ok(text) = std::str::from_utf8(line) else {
            self.reply(Reply::new(501, "5.5.2", "Invalid base64 data"));
            return Step::Continue;
        };
        self.auth_step(exchange, text.trim()).await
    }

    async fn auth_step(&mut self, exchange: AuthExchange, text: &str) -> Step {
        if text == "*" {
            self.reply(Reply::new(501, "5.0.0", "Authentication cancelled"));
            return Step::Continue;
        }
        let Some(decoded) = sasl_decode(text) else {
            self.reply(Reply::new(501, "5.5.2", "Invalid base64 data"));
            return Step::Continue;
        };
        match exchange {
            AuthExchange::Plain => match sasl_plain(&decoded) {
                Some(SaslPlain::Credentials(user, password)) => self.auth_verify(&user, &password).await,
                // RFC 4954 §6: the identity may not act as another.
                Some(SaslPlain::OtherIdentity) => {
                    self.reply(Reply::new(
                        535,
                        "5.7.8",
                        "Authorization as another identity is not supported",
                    ));
                    Step::Continue
                }
                None => {
                    self.reply(Reply::new(501, "5.5.2", "Invalid PLAIN message"));
                    Step::Continue
                }
            },
            AuthExchange::LoginUser => match String::from_utf8(decoded) {
                Ok(user) if !user.is_empty() => {
                    self.auth_exchange = Some(AuthExchange::LoginPassword(user));
                    self.reply(Reply::new(334, "", sasl_encode("Password:")));
                    Step::Continue
                }
                _ => {
                    self.reply(Reply::new(501, "5.5.2", "Invalid user name"));
                    Step::Continue
                }
            },
            AuthExchange::LoginPassword(user) => match String::from_utf8(decoded) {
                Ok(password) => self.auth_verify(&user, &password).await,
                Err(_) => {
                    self.reply(Reply::new(501, "5.5.2", "Invalid password encoding"));
                    Step::Continue
                }
            },
        }
    }

    async fn auth_verify(&mut self, user: &str, password: &str) -> Step {
        match self.app.auth.verify(user, password, self.conn.remote.ip()).await {
            AuthOutcome::Ok(account) => {
                self.account = Some(account);
                self.reply(Reply::new(235, "2.7.0", "Authentication successful"));
            }
            AuthOutcome::Failed => {
                self.reply(Reply::new(535, "5.7.8", "Authentication credentials invalid"));
            }
            AuthOutcome::RateLimited => {
                self.reply(Reply::new(454, "4.7.0", "Too many failed authentications, try again later"));
            }
            AuthOutcome::Unavailable => {
                self.reply(Reply::new(454, "4.7.0", "Temporary authentication failure"));
            }
        }
        Step::Continue
    }
}

/// The exchange state in which an initial response is interpreted.
fn mechanism_start(mechanism: SaslMechanism) -> AuthExchange {
    match mechanism {
        SaslMechanism::Plain => AuthExchange::Plain,
        SaslMechanism::Login => AuthExchange::LoginUser,
    }
}
