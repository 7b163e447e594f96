//! The grammar of RFC 5228 §8.2 into a generic tree: commands with arguments,
//! tests and blocks; what the names mean is `compile.rs`'s business. Nesting is
//! counted before descending, so hostile depth ends in an error, never in a deep
//! stack.

use crate::CompileError;
use crate::lexer::{Lexer, Pos, Token};

#[derive(Debug)]
pub(crate) enum Arg {
    Tag(String, Pos),
    Number(u64, Pos),
    String(String, Pos),
    List(Vec<(String, Pos)>, Pos),
}

impl Arg {
    pub fn pos(&self) -> Pos {
        match self {
            Arg::Tag(_, p) | Arg::Number(_, p) | Arg::String(_, p) | Arg::List(_, p) => *p,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Test {
    pub name: String,
    pub pos: Pos,
    pub args: Vec<Arg>,
    pub tests: Vec<Test>,
    /// Whether the tests were a parenthesised test-list.
    pub list: bool,
}

#[derive(Debug)]
pub(crate) struct Command {
    pub name: String,
    pub pos: Pos,
    pub args: Vec<Arg>,
    pub tests: Vec<Test>,
    pub list: bool,
    pub block: Option<Vec<Command>>,
}

struct Parser<'a> {
    lexer: Lexer<'a>,
    ahead: Option<(Token, Pos)>,
    end: Pos,
    max_nesting: usize,
}

pub(crate) fn parse(src: &str, max_nesting: usize) -> Result<Vec<Command>, CompileError> {
    let mut p = Parser { lexer: Lexer::new(src), ahead: None, end: Pos { line: 1, column: 1 }, max_nesting };
    let mut commands = Vec::new();
    while p.peek()?.is_some() {
        commands.push(p.command(0)?);
    }
    Ok(commands)
}

impl Parser<'_> {
    fn peek(&mut self) -> Result<Option<&Token>, CompileError> {
        if self.ahead.is_none() {
            self.ahead = self.lexer.next_token()?;
            if let Some((_, pos)) = &self.ahead {
                self.end = *pos;
            }
        }
        Ok(self.ahead.as_ref().map(|(t, _)| t))
    }

    fn next(&mut self) -> Result<(Token, Pos), CompileError> {
        self.peek()?;
        self.ahead.take().ok_or_else(|| self.end.error("unexpected end of script"))
    }

    fn nest(&self, depth: usize, pos: Pos) -> Result<usize, CompileError> {
        if depth >= self.max_nesting {
            return Err(pos.error(format!("nested more than {} deep", self.max_nesting)));
        }
        Ok(depth + 1)
    }

    fn command(&mut self, depth: usize) -> Result<Command, CompileError> {
        let (token, pos) = self.next()?;
        let Token::Identifier(name) = token else { return Err(pos.error("expected a command")) };
        let args = self.arguments()?;
        let (tests, list) = self.tests(depth, pos)?;
        let (token, at) = self.next()?;
        let block = match token {
            Token::Semicolon => None,
            Token::LeftBrace => {
                let inner = self.nest(depth, at)?;
                let mut block = Vec::new();
                loop {
                    if self.peek()? == Some(&Token::RightBrace) {
                        self.next()?;
                        break;
                    }
                    if self.peek()?.is_none() {
                        return Err(at.error("block not closed"));
                    }
                    block.push(self.command(inner)?);
                }
                Some(block)
            }
            _ => return Err(at.error(format!("expected ';' or a block after {name}"))),
        };
        Ok(Command { name, pos, args, tests, list, block })
    }

    fn arguments(&mut self) -> Result<Vec<Arg>, CompileError> {
        let mut args = Vec::new();
        loop {
            match self.peek()? {
                Some(Token::Tag(_) | Token::Number(_) | Token::String(_) | Token::LeftBracket) => {}
                _ => return Ok(args),
            }
            let (token, pos) = self.next()?;
            args.push(match token {
                Token::Tag(t) => Arg::Tag(t, pos),
                Token::Number(n) => Arg::Number(n, pos),
                Token::String(s) => Arg::String(s, pos),
                _ => {
                    let mut list = Vec::new();
                    loop {
                        let (token, at) = self.next()?;
                        let Token::String(s) = token else {
                            return Err(at.error("expected a string in the list"));
                        };
                        list.push((s, at));
                        let (token, at) = self.next()?;
                        match token {
                            Token::Comma => {}
                            Token::RightBracket => break,
                            _ => return Err(at.error("expected ',' or ']' in a string list")),
                        }
                    }
                    Arg::List(list, pos)
                }
            });
        }
    }

    /// An optional test or parenthesised test-list after the arguments.
    fn tests(&mut self, depth: usize, pos: Pos) -> Result<(Vec<Test>, bool), CompileError> {
        match self.peek()? {
            Some(Token::Identifier(_)) => {
                let inner = self.nest(depth, pos)?;
                Ok((vec![self.test(inner)?], false))
            }
            Some(Token::LeftParen) => {
                let inner = self.nest(depth, pos)?;
                self.next()?;
                let mut tests = Vec::new();
                loop {
                    tests.push(self.test(inner)?);
                    let (token, at) = self.next()?;
                    match token {
                        Token::Comma => {}
                        Token::RightParen => break,
                        _ => return Err(at.error("expected ',' or ')' in a test list")),
                    }
                }
                Ok((tests, true))
            }
            _ => Ok((Vec::new(), false)),
        }
    }

    fn test(&mut self, depth: usize) -> Result<Test, CompileError> {
        let (token, pos) = self.next()?;
        let Token::Identifier(name) = token else { return Err(pos.error("expected a test")) };
        let args = self.arguments()?;
        let (tests, list) = self.tests(depth, pos)?;
        Ok(Test { name, pos, args, tests, list })
    }
}
