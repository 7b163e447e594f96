//! Tokens of RFC 5228 §2: identifiers, tags, numbers with K/M/G, quoted and
//! multi-line (`text:`) strings, punctuation; comments and white space skipped.

use crate::CompileError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pos {
    pub line: u32,
    pub column: u32,
}

impl Pos {
    pub fn error(self, message: impl Into<String>) -> CompileError {
        CompileError { line: self.line, column: self.column, message: message.into() }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Token {
    Identifier(String),
    Tag(String),
    Number(u64),
    String(String),
    LeftBracket,
    RightBracket,
    LeftParen,
    RightParen,
    LeftBrace,
    RightBrace,
    Comma,
    Semicolon,
}

pub(crate) struct Lexer<'a> {
    src: &'a [u8],
    at: usize,
    line: u32,
    line_start: usize,
}

impl<'a> Lexer<'a> {
    pub fn new(src: &'a str) -> Self {
        Lexer { src: src.as_bytes(), at: 0, line: 1, line_start: 0 }
    }

    fn pos(&self) -> Pos {
        Pos { line: self.line, column: (self.at - self.line_start + 1) as u32 }
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.at).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.at += 1;
        if c == b'\n' {
            self.line += 1;
            self.line_start = self.at;
        }
        Some(c)
    }

    /// The text from `start` to the current position; always on character
    /// boundaries because only ASCII delimiters end a token.
    fn text(&self, start: usize) -> &'a str {
        std::str::from_utf8(&self.src[start..self.at]).unwrap_or_default()
    }

    fn skip_space(&mut self) -> Result<(), CompileError> {
        loop {
            match self.peek() {
                Some(b' ' | b'\t' | b'\r' | b'\n') => {
                    self.bump();
                }
                Some(b'#') => {
                    while let Some(c) = self.bump() {
                        if c == b'\n' {
                            break;
                        }
                    }
                }
                Some(b'/') if self.src.get(self.at + 1) == Some(&b'*') => {
                    let start = self.pos();
                    self.bump();
                    self.bump();
                    loop {
                        match self.bump() {
                            None => return Err(start.error("unterminated comment")),
                            Some(b'*') if self.peek() == Some(b'/') => {
                                self.bump();
                                break;
                            }
                            Some(_) => {}
                        }
                    }
                }
                _ => return Ok(()),
            }
        }
    }

    /// The next token and where it starts; `None` at the end.
    pub fn next_token(&mut self) -> Result<Option<(Token, Pos)>, CompileError> {
        self.skip_space()?;
        let pos = self.pos();
        let Some(c) = self.peek() else { return Ok(None) };
        let token = match c {
            b'[' => self.punct(Token::LeftBracket),
            b']' => self.punct(Token::RightBracket),
            b'(' => self.punct(Token::LeftParen),
            b')' => self.punct(Token::RightParen),
            b'{' => self.punct(Token::LeftBrace),
            b'}' => self.punct(Token::RightBrace),
            b',' => self.punct(Token::Comma),
            b';' => self.punct(Token::Semicolon),
            b'"' => self.quoted(pos)?,
            b':' => {
                self.bump();
                if !self.peek().is_some_and(is_identifier_start) {
                    return Err(pos.error("a tag needs a name after ':'"));
                }
                Token::Tag(self.identifier().to_ascii_lowercase())
            }
            b'0'..=b'9' => self.number(pos)?,
            c if is_identifier_start(c) => {
                let word = self.identifier();
                if word.eq_ignore_ascii_case("text") && self.peek() == Some(b':') {
                    self.bump();
                    self.multi_line(pos)?
                } else {
                    Token::Identifier(word.to_ascii_lowercase())
                }
            }
            _ => return Err(pos.error(format!("unexpected character {:?}", c as char))),
        };
        Ok(Some((token, pos)))
    }

    fn punct(&mut self, token: Token) -> Token {
        self.bump();
        token
    }

    fn identifier(&mut self) -> &'a str {
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_') {
            self.bump();
        }
        self.text(start)
    }

    fn number(&mut self, pos: Pos) -> Result<Token, CompileError> {
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.bump();
        }
        let digits = self.text(start);
        let too_big = || pos.error("number too large");
        let mut n: u64 = digits.parse().map_err(|_| too_big())?;
        let scale = match self.peek() {
            Some(b'K' | b'k') => 1 << 10,
            Some(b'M' | b'm') => 1 << 20,
            Some(b'G' | b'g') => 1 << 30,
            _ => 1,
        };
        if scale > 1 {
            self.bump();
            n = n.checked_mul(scale).ok_or_else(too_big)?;
        }
        if self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_') {
            return Err(pos.error("a number runs into a word"));
        }
        Ok(Token::Number(n))
    }

    fn quoted(&mut self, pos: Pos) -> Result<Token, CompileError> {
        self.bump();
        let mut out = Vec::new();
        loop {
            match self.bump() {
                None => return Err(pos.error("unterminated string")),
                Some(b'"') => break,
                // RFC 5228 §2.4.2: "\\" and "\"" are escapes; any other
                // backslash is dropped, keeping the character after it.
                Some(b'\\') => match self.bump() {
                    None => return Err(pos.error("unterminated string")),
                    Some(c) => out.push(c),
                },
                Some(c) => out.push(c),
            }
        }
        // Only ASCII bytes were removed from valid UTF-8, so it stays valid.
        Ok(Token::String(String::from_utf8(out).map_err(|_| pos.error("string is not UTF-8"))?))
    }

    /// RFC 5228 §2.4.2 multi-line strings: after `text:`, optional blanks and
    /// a comment, then lines up to one holding only "."; a line starting with
    /// ".." loses its first dot.
    fn multi_line(&mut self, pos: Pos) -> Result<Token, CompileError> {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.bump();
        }
        match self.peek() {
            Some(b'#') => {
                while let Some(c) = self.bump() {
                    if c == b'\n' {
                        break;
                    }
                }
            }
            Some(b'\r') if self.src.get(self.at + 1) == Some(&b'\n') => {
                self.bump();
                self.bump();
            }
            Some(b'\n') => {
                self.bump();
            }
            _ => return Err(pos.error("text: must end its line")),
        }
        let mut out = String::new();
        loop {
            if self.at >= self.src.len() {
                return Err(pos.error("unterminated multi-line string"));
            }
            let start = self.at;
            while let Some(c) = self.bump() {
                if c == b'\n' {
                    break;
                }
            }
            let line = self.text(start);
            let bare = line.trim_end_matches('\n').trim_end_matches('\r');
            if bare == "." {
                return Ok(Token::String(out));
            }
            out.push_str(line.strip_prefix('.').filter(|l| l.starts_with('.')).unwrap_or(line));
        }
    }
}

fn is_identifier_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}
