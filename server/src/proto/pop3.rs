//! POP3 grammar (RFC 1939, RFC 2449, RFC 2595, RFC 5034): command lines, the
//! multi-line message encoding (dot-stuffing, TOP). Lines come from
//! [`super::frame::LineFramer`].
//! No store, no sessions.

/// A message number as the client names it: 1-based, within the session's
/// snapshot (checked by the session).
pub type Msg = u32;

/// One POP3 command. Arguments are kept as the client sent them; the session
/// decides what they mean in its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Capa,
    Stls,
    User(String),
    /// The whole rest of the line: passwords may contain spaces (RFC 1939 §7 lets
    /// servers accept that).
    Pass(String),
    /// `AUTH` alone lists mechanisms; otherwise mechanism and optional initial response.
    Auth(Option<(String, Option<String>)>),
    Apop,
    Stat,
    List(Option<Msg>),
    Uidl(Option<Msg>),
    Retr(Msg),
    Top(Msg, u32),
    Dele(Msg),
    Rset,
    Noop,
    Quit,
}

impl Command {
    /// Label for `mail_commands_total{command}` (a fixed set, never client text).
    pub fn label(&self) -> &'static str {
        match self {
            Command::Capa => "CAPA",
            Command::Stls => "STLS",
            Command::User(_) => "USER",
            Command::Pass(_) => "PASS",
            Command::Auth(_) => "AUTH",
            Command::Apop => "APOP",
            Command::Stat => "STAT",
            Command::List(_) => "LIST",
            Command::Uidl(_) => "UIDL",
            Command::Retr(_) => "RETR",
            Command::Top(..) => "TOP",
            Command::Dele(_) => "DELE",
            Command::Rset => "RSET",
            Command::Noop => "NOOP",
            Command::Quit => "QUIT",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Not a POP3 keyword this server knows.
    Unknown,
    /// A known keyword with missing, extra or malformed arguments.
    Syntax(&'static str),
}

/// Parses one command line (CRLF or LF already stripped or not; both are accepted).
pub fn parse_command(line: &[u8]) -> Result<Command, ParseError> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let Ok(line) = std::str::from_utf8(line) else {
        return Err(ParseError::Syntax("command is not valid UTF-8"));
    };
    let (keyword, rest) = match line.split_once(' ') {
        Some((k, r)) => (k, Some(r)),
        None => (line, None),
    };
    if keyword.len() > 4 || !keyword.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(ParseError::Unknown);
    }
    let keyword = keyword.to_ascii_uppercase();
    // Arguments are separated by single spaces (RFC 1939 §3); trailing blanks sent
    // by some clients are tolerated.
    let args: Vec<&str> = rest.map(|r| r.split(' ').filter(|a| !a.is_empty()).collect()).unwrap_or_default();
    let none = |cmd: Command| {
        if args.is_empty() { Ok(cmd) } else { Err(ParseError::Syntax("no argument expected")) }
    };
    match keyword.as_str() {
        "CAPA" => none(Command::Capa),
        "STLS" => none(Command::Stls),
        "STAT" => none(Command::Stat),
        "RSET" => none(Command::Rset),
        "NOOP" => none(Command::Noop),
        "QUIT" => none(Command::Quit),
        "APOP" => Ok(Command::Apop),
        "USER" => match args.as_slice() {
            [name] => Ok(Command::User((*name).to_string())),
            _ => Err(ParseError::Syntax("USER takes one argument")),
        },
        "PASS" => match rest {
            Some(r) if !r.is_empty() => Ok(Command::Pass(r.to_string())),
            _ => Err(ParseError::Syntax("PASS takes the password as argument")),
        },
        "AUTH" => match args.as_slice() {
            [] => Ok(Command::Auth(None)),
            [mech] => Ok(Command::Auth(Some((mech.to_ascii_uppercase(), None)))),
            [mech, initial] => {
                Ok(Command::Auth(Some((mech.to_ascii_uppercase(), Some((*initial).to_string())))))
            }
            _ => Err(ParseError::Syntax("AUTH takes a mechanism and an optional initial response")),
        },
        "LIST" | "UIDL" => {
            let msg = match args.as_slice() {
                [] => None,
                [n] => Some(number(n)?),
                _ => return Err(ParseError::Syntax("at most one message number expected")),
            };
            Ok(if keyword == "LIST" { Command::List(msg) } else { Command::Uidl(msg) })
        }
        "RETR" | "DELE" => match args.as_slice() {
            [n] => {
                let n = number(n)?;
                Ok(if keyword == "RETR" { Command::Retr(n) } else { Command::Dele(n) })
            }
            _ => Err(ParseError::Syntax("one message number expected")),
        },
        "TOP" => match args.as_slice() {
            [n, lines] => Ok(Command::Top(number(n)?, count(lines)?)),
            _ => Err(ParseError::Syntax("TOP takes a message number and a line count")),
        },
        _ => Err(ParseError::Unknown),
    }
}

/// A message number: decimal digits only, at least 1.
fn number(arg: &str) -> Result<Msg, ParseError> {
    match count(arg)? {
        0 => Err(ParseError::Syntax("message numbers start at 1")),
        n => Ok(n),
    }
}

fn count(arg: &str) -> Result<u32, ParseError> {
    if arg.is_empty() || arg.len() > 10 || !arg.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError::Syntax("invalid number"));
    }
    arg.parse().map_err(|_| ParseError::Syntax("number out of range"))
}

/// Appends `message` in the multi-line encoding of RFC 1939 §3: every line ends in
/// CRLF (a bare LF stored by an older APPEND is sent as CRLF), lines starting with
/// "." get one more, and the response ends with ".\r\n". With `body_lines`, only
/// the header block, the blank line and that many body lines are sent (TOP).
/// True when [`encode_message`] of the whole message would be the message itself
/// and its terminator: every line ends with CRLF (a last line without one is
/// completed) and none starts with a dot. Most stored mail is so (SMTP's DATA
/// requires CRLF), and then RETR writes the stored bytes without a copy.
pub fn sent_as_stored(message: &[u8]) -> bool {
    message.first() != Some(&b'.')
        && memchr::memchr_iter(b'\n', message)
            .all(|i| i > 0 && message[i - 1] == b'\r' && message.get(i + 1) != Some(&b'.'))
}

/// What follows a message sent as stored ([`sent_as_stored`]) to end the
/// multi-line response.
pub fn stored_terminator(message: &[u8]) -> &'static [u8] {
    if message.is_empty() || message.ends_with(b"\n") { b".\r\n" } else { b"\r\n.\r\n" }
}

pub fn encode_message(message: &[u8], body_lines: Option<u32>, out: &mut Vec<u8>) {
    out.reserve(message.len() + message.len() / 64 + 8);
    let mut in_body = false;
    let mut body_left = body_lines;
    let mut rest = message;
    while !rest.is_empty() {
        if in_body {
            match &mut body_left {
                Some(0) => break,
                Some(n) => *n -= 1,
                None => {}
            }
        }
        let (line, next) = match memchr::memchr(b'\n', rest) {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &rest[rest.len()..]),
        };
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.first() == Some(&b'.') {
            out.push(b'.');
        }
        out.extend_from_slice(line);
        out.extend_from_slice(b"\r\n");
        if !in_body && line.is_empty() {
            in_body = true;
        }
        rest = next;
    }
    out.extend_from_slice(b".\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commands_case_insensitively() {
        assert_eq!(parse_command(b"stat\r\n"), Ok(Command::Stat));
        assert_eq!(parse_command(b"LiSt 3"), Ok(Command::List(Some(3))));
        assert_eq!(parse_command(b"UIDL"), Ok(Command::Uidl(None)));
        assert_eq!(parse_command(b"TOP 1 0"), Ok(Command::Top(1, 0)));
        assert_eq!(parse_command(b"USER bob@example.org"), Ok(Command::User("bob@example.org".into())));
        assert_eq!(parse_command(b"PASS with spaces  x"), Ok(Command::Pass("with spaces  x".into())));
        assert_eq!(parse_command(b"AUTH"), Ok(Command::Auth(None)));
        assert_eq!(
            parse_command(b"AUTH plain AGJvYgBwdw=="),
            Ok(Command::Auth(Some(("PLAIN".into(), Some("AGJvYgBwdw==".into())))))
        );
        assert_eq!(parse_command(b"QUIT "), Ok(Command::Quit), "a trailing blank is tolerated");
    }

    #[test]
    fn rejects_malformed_commands() {
        assert_eq!(parse_command(b"RETR"), Err(ParseError::Syntax("one message number expected")));
        assert_eq!(parse_command(b"RETR 0"), Err(ParseError::Syntax("message numbers start at 1")));
        assert_eq!(parse_command(b"RETR -1"), Err(ParseError::Syntax("invalid number")));
        assert_eq!(parse_command(b"RETR +1"), Err(ParseError::Syntax("invalid number")));
        assert_eq!(parse_command(b"RETR 99999999999"), Err(ParseError::Syntax("invalid number")));
        assert_eq!(parse_command(b"RETR 4294967296"), Err(ParseError::Syntax("number out of range")));
        assert_eq!(parse_command(b"STAT 1"), Err(ParseError::Syntax("no argument expected")));
        assert_eq!(
            parse_command(b"TOP 1"),
            Err(ParseError::Syntax("TOP takes a message number and a line count"))
        );
        assert_eq!(parse_command(b"PASS"), Err(ParseError::Syntax("PASS takes the password as argument")));
        assert_eq!(parse_command(b"XTND"), Err(ParseError::Unknown));
        assert_eq!(parse_command(b"HELLOWORLD"), Err(ParseError::Unknown));
        assert_eq!(parse_command(b""), Err(ParseError::Unknown));
        assert_eq!(parse_command(b"\xff\xfe"), Err(ParseError::Syntax("command is not valid UTF-8")));
    }

    #[test]
    fn message_encoding_stuffs_dots_and_normalises_line_ends() {
        let mut out = Vec::new();
        encode_message(b"Subject: x\r\n\r\n.hidden\r\nbare\nlast", None, &mut out);
        assert_eq!(out, b"Subject: x\r\n\r\n..hidden\r\nbare\r\nlast\r\n.\r\n");
        let mut out = Vec::new();
        encode_message(b"A: 1\r\n\r\n.\r\n", None, &mut out);
        assert_eq!(out, b"A: 1\r\n\r\n..\r\n.\r\n", "a lone dot in the body can never end the response");
    }

    #[test]
    fn top_sends_headers_blank_line_and_n_body_lines() {
        let msg = b"A: 1\r\nB: 2\r\n\r\nl1\r\nl2\r\nl3\r\n";
        let mut out = Vec::new();
        encode_message(msg, Some(0), &mut out);
        assert_eq!(out, b"A: 1\r\nB: 2\r\n\r\n.\r\n");
        let mut out = Vec::new();
        encode_message(msg, Some(2), &mut out);
        assert_eq!(out, b"A: 1\r\nB: 2\r\n\r\nl1\r\nl2\r\n.\r\n");
        let mut out = Vec::new();
        encode_message(msg, Some(10), &mut out);
        assert_eq!(out, b"A: 1\r\nB: 2\r\n\r\nl1\r\nl2\r\nl3\r\n.\r\n");
        let mut out = Vec::new();
        encode_message(b"Only: header\r\n", Some(5), &mut out);
        assert_eq!(out, b"Only: header\r\n.\r\n");
    }

    #[test]
    fn a_message_sent_as_stored_is_exactly_its_encoding() {
        let cases: [&[u8]; 12] = [
            b"",
            b"A: 1\r\n\r\nbody\r\n",
            b"A: 1\r\n\r\nno final line end",
            b"A: 1\r\n\r\n.dot\r\n",
            b".first\r\n",
            b"A: 1\n\nbare\n",
            b"A: 1\r\n\r\nbare\nlf\r\n",
            b"\n",
            b"\r\n",
            b"x\r\n.",
            b"lone\rcr\r\n",
            b"A: 1\r\n\r\n..\r\n",
        ];
        for message in cases {
            let mut encoded = Vec::new();
            encode_message(message, None, &mut encoded);
            let mut as_stored = message.to_vec();
            as_stored.extend_from_slice(stored_terminator(message));
            assert_eq!(
                sent_as_stored(message),
                encoded == as_stored,
                "{:?}",
                String::from_utf8_lossy(message)
            );
        }
    }
}
