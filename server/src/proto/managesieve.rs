//! ManageSieve (RFC 5804) commands and responses, without I/O. A command
//! arrives whole from [`super::frame::CommandFramer`], its literals inlined
//! (`{n+}` as RFC 5804 §4 has clients send them, and `{n}` alike: the protocol
//! has no continuation request, so the data follows at once either way).

use super::frame::literal_announcement;

/// The longest quoted string a client may send (RFC 5804 §4: longer ones go
/// in literals).
pub const MAX_QUOTED: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Authenticate { mechanism: String, initial: Option<Vec<u8>> },
    StartTls,
    Logout,
    Capability,
    HaveSpace { name: String, size: u64 },
    PutScript { name: String, script: Vec<u8> },
    ListScripts,
    SetActive(String),
    GetScript(String),
    DeleteScript(String),
    RenameScript { from: String, to: String },
    CheckScript(Vec<u8>),
    Noop(Option<String>),
}

impl Command {
    /// The command's name, for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Command::Authenticate { .. } => "AUTHENTICATE",
            Command::StartTls => "STARTTLS",
            Command::Logout => "LOGOUT",
            Command::Capability => "CAPABILITY",
            Command::HaveSpace { .. } => "HAVESPACE",
            Command::PutScript { .. } => "PUTSCRIPT",
            Command::ListScripts => "LISTSCRIPTS",
            Command::SetActive(_) => "SETACTIVE",
            Command::GetScript(_) => "GETSCRIPT",
            Command::DeleteScript(_) => "DELETESCRIPT",
            Command::RenameScript { .. } => "RENAMESCRIPT",
            Command::CheckScript(_) => "CHECKSCRIPT",
            Command::Noop(_) => "NOOP",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Not a command of RFC 5804 this server knows.
    Unknown,
    Syntax(&'static str),
}

/// One argument.
enum Arg {
    String(Vec<u8>),
    Number(u64),
}

/// Reads the arguments of a command after its name: strings (quoted or
/// literal) and numbers, each after one SP, up to the line's end.
struct Args<'a> {
    rest: &'a [u8],
}

impl<'a> Args<'a> {
    fn next(&mut self) -> Result<Option<Arg>, ParseError> {
        let rest = self.rest;
        if rest.is_empty() || rest == b"\r\n" || rest == b"\n" {
            return Ok(None);
        }
        let Some(rest) = rest.strip_prefix(b" ") else { return Err(ParseError::Syntax("expected a space")) };
        match rest.first() {
            Some(b'"') => {
                let mut out = Vec::new();
                let mut i = 1;
                loop {
                    match rest.get(i) {
                        None | Some(b'\r' | b'\n' | 0) => {
                            return Err(ParseError::Syntax("unterminated string"));
                        }
                        Some(b'"') => break,
                        Some(b'\\') => match rest.get(i + 1) {
                            Some(&c @ (b'"' | b'\\')) => {
                                out.push(c);
                                i += 2;
                            }
                            _ => return Err(ParseError::Syntax("bad escape in a quoted string")),
                        },
                        Some(&c) => {
                            out.push(c);
                            i += 1;
                        }
                    }
                    if out.len() > MAX_QUOTED {
                        return Err(ParseError::Syntax("quoted string too long; send a literal"));
                    }
                }
                self.rest = &rest[i + 1..];
                Ok(Some(Arg::String(out)))
            }
            Some(b'{') => {
                let lf = memchr::memchr(b'\n', rest).ok_or(ParseError::Syntax("bad literal"))?;
                let (size, _) =
                    literal_announcement(&rest[..=lf]).ok_or(ParseError::Syntax("bad literal"))?;
                let start = lf + 1;
                let end = usize::try_from(size)
                    .ok()
                    .and_then(|n| start.checked_add(n))
                    .filter(|&e| e <= rest.len())
                    .ok_or(ParseError::Syntax("literal shorter than announced"))?;
                // The announcement must be the whole argument: `{5+}` CRLF.
                if !matches!(&rest[..start], [b'{', .., b'}', b'\r', b'\n'] | [b'{', .., b'}', b'\n'])
                    || rest[1..start].contains(&b' ')
                {
                    return Err(ParseError::Syntax("bad literal"));
                }
                self.rest = &rest[end..];
                Ok(Some(Arg::String(rest[start..end].to_vec())))
            }
            Some(c) if c.is_ascii_digit() => {
                let len = rest.iter().take_while(|c| c.is_ascii_digit()).count();
                let n = std::str::from_utf8(&rest[..len])
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or(ParseError::Syntax("number too large"))?;
                self.rest = &rest[len..];
                Ok(Some(Arg::Number(n)))
            }
            _ => Err(ParseError::Syntax("expected a string or a number")),
        }
    }

    fn bytes(&mut self) -> Result<Vec<u8>, ParseError> {
        match self.next()? {
            Some(Arg::String(s)) => Ok(s),
            _ => Err(ParseError::Syntax("expected a string")),
        }
    }

    fn text(&mut self) -> Result<String, ParseError> {
        String::from_utf8(self.bytes()?).map_err(|_| ParseError::Syntax("strings must be UTF-8"))
    }

    fn number(&mut self) -> Result<u64, ParseError> {
        match self.next()? {
            Some(Arg::Number(n)) => Ok(n),
            _ => Err(ParseError::Syntax("expected a number")),
        }
    }

    fn end(mut self) -> Result<(), ParseError> {
        match self.next()? {
            None => Ok(()),
            Some(_) => Err(ParseError::Syntax("too many arguments")),
        }
    }
}

/// Parses one command: its name (case-insensitive) and arguments.
pub fn parse_command(line: &[u8]) -> Result<Command, ParseError> {
    let name_len = line.iter().take_while(|c| c.is_ascii_alphabetic()).count();
    let name = line[..name_len].to_ascii_uppercase();
    let mut args = Args { rest: &line[name_len..] };
    let cmd = match &name[..] {
        b"AUTHENTICATE" => {
            let mechanism = args.text()?.to_ascii_uppercase();
            let initial = match args.next()? {
                None => None,
                Some(Arg::String(s)) => Some(s),
                Some(Arg::Number(_)) => return Err(ParseError::Syntax("expected a string")),
            };
            return args.end().map(|()| Command::Authenticate { mechanism, initial });
        }
        b"STARTTLS" => Command::StartTls,
        b"LOGOUT" => Command::Logout,
        b"CAPABILITY" => Command::Capability,
        b"HAVESPACE" => {
            let name = args.text()?;
            Command::HaveSpace { name, size: args.number()? }
        }
        b"PUTSCRIPT" => {
            let name = args.text()?;
            Command::PutScript { name, script: args.bytes()? }
        }
        b"LISTSCRIPTS" => Command::ListScripts,
        b"SETACTIVE" => Command::SetActive(args.text()?),
        b"GETSCRIPT" => Command::GetScript(args.text()?),
        b"DELETESCRIPT" => Command::DeleteScript(args.text()?),
        b"RENAMESCRIPT" => {
            let from = args.text()?;
            Command::RenameScript { from, to: args.text()? }
        }
        b"CHECKSCRIPT" => Command::CheckScript(args.bytes()?),
        b"NOOP" => match args.next()? {
            None => return Ok(Command::Noop(None)),
            Some(Arg::String(s)) => {
                let tag = String::from_utf8(s).map_err(|_| ParseError::Syntax("strings must be UTF-8"))?;
                Command::Noop(Some(tag))
            }
            Some(Arg::Number(_)) => return Err(ParseError::Syntax("expected a string")),
        },
        _ => return Err(ParseError::Unknown),
    };
    args.end().map(|()| cmd)
}

/// A string the client reads back: quoted when it can be, else a literal
/// (RFC 5804 §4: quoted strings hold no CR, LF or NUL).
pub fn encode_string(out: &mut Vec<u8>, s: &[u8]) {
    if s.len() <= MAX_QUOTED && !s.iter().any(|&c| matches!(c, b'\r' | b'\n' | 0)) {
        out.push(b'"');
        for &c in s {
            if c == b'"' || c == b'\\' {
                out.push(b'\\');
            }
            out.push(c);
        }
        out.push(b'"');
    } else {
        out.extend_from_slice(format!("{{{}}}\r\n", s.len()).as_bytes());
        out.extend_from_slice(s);
    }
}

/// Human-readable text for a response: one line, within a quoted string.
pub fn human_text(text: &str) -> Vec<u8> {
    let line: String =
        text.chars().map(|c| if c.is_control() { ' ' } else { c }).take(MAX_QUOTED / 4).collect();
    let mut out = Vec::with_capacity(line.len() + 2);
    encode_string(&mut out, line.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_with_quoted_and_literal_strings() {
        assert_eq!(parse_command(b"capability\r\n"), Ok(Command::Capability));
        assert_eq!(
            parse_command(b"PUTSCRIPT \"a \\\"b\\\\\" {5+}\r\nkeep;\r\n"),
            Ok(Command::PutScript { name: "a \"b\\".into(), script: b"keep;".to_vec() })
        );
        assert_eq!(
            parse_command(b"Authenticate \"plain\" {4}\r\nAGEA\r\n"),
            Ok(Command::Authenticate { mechanism: "PLAIN".into(), initial: Some(b"AGEA".to_vec()) })
        );
        assert_eq!(
            parse_command(b"HAVESPACE \"x\" 123\r\n"),
            Ok(Command::HaveSpace { name: "x".into(), size: 123 })
        );
        assert_eq!(parse_command(b"NOOP \"t\"\r\n"), Ok(Command::Noop(Some("t".into()))));
        assert_eq!(parse_command(b"SETACTIVE \"\"\r\n"), Ok(Command::SetActive(String::new())));
    }

    #[test]
    fn malformed_commands_are_syntax_errors() {
        for bad in [
            &b"GETSCRIPT\r\n"[..],
            b"GETSCRIPT x\r\n",
            b"GETSCRIPT \"x\" \"y\"\r\n",
            b"GETSCRIPT  \"x\"\r\n",
            b"GETSCRIPT \"x\r\n",
            b"GETSCRIPT \"\\n\"\r\n",
            b"GETSCRIPT {9+}\r\nshort\r\n",
            b"GETSCRIPT \"\xff\"\r\n",
            b"HAVESPACE \"x\" 99999999999999999999999\r\n",
            b"HAVESPACE \"x\" \"1\"\r\n",
        ] {
            assert!(
                matches!(parse_command(bad), Err(ParseError::Syntax(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = format!("GETSCRIPT \"{}\"\r\n", "a".repeat(MAX_QUOTED + 1));
        assert!(matches!(parse_command(long.as_bytes()), Err(ParseError::Syntax(_))));
        assert_eq!(parse_command(b"UNAUTHENTICATE\r\n"), Err(ParseError::Unknown));
        assert_eq!(parse_command(b"\r\n"), Err(ParseError::Unknown));
    }

    #[test]
    fn strings_go_out_quoted_or_as_literals() {
        let mut out = Vec::new();
        encode_string(&mut out, b"a\"b\\");
        assert_eq!(out, b"\"a\\\"b\\\\\"");
        out.clear();
        encode_string(&mut out, b"line\r\nnext");
        assert_eq!(out, b"{10}\r\nline\r\nnext");
        assert_eq!(human_text("bad\r\nthing"), b"\"bad  thing\"");
    }
}
