//! The syntax of a config string: tokens, then `key:value` entries (a value
//! may be a `[boundary:value, ...]` list).

use super::{MAX_CONFIG_LEN, echo};
use crate::error::{ConfigError, ConfigErrorKind};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Tok<'a> {
    Word(&'a str),
    Colon,
    Comma,
    Open,
    Close,
}

/// A token and its byte offset in the string.
#[derive(Debug, Clone, Copy)]
struct Token<'a> {
    tok: Tok<'a>,
    at: usize,
}

fn tokenize<'a>(s: &'a str) -> Vec<Token<'a>> {
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    let flush = |start: &mut Option<usize>, end: usize, out: &mut Vec<Token<'a>>| {
        if let Some(b) = start.take() {
            out.push(Token {
                tok: Tok::Word(&s[b..end]),
                at: b,
            });
        }
    };
    for (i, c) in s.char_indices() {
        let t = match c {
            ',' => Tok::Comma,
            ':' => Tok::Colon,
            '[' => Tok::Open,
            ']' => Tok::Close,
            c if c.is_whitespace() => {
                flush(&mut start, i, &mut out);
                continue;
            }
            _ => {
                start.get_or_insert(i);
                continue;
            }
        };
        flush(&mut start, i, &mut out);
        out.push(Token { tok: t, at: i });
    }
    flush(&mut start, s.len(), &mut out);
    out
}

/// A token in user terms, for "found ..." messages.
fn describe(t: Option<Tok<'_>>) -> String {
    match t {
        None => "the end of the string".to_string(),
        Some(Tok::Word(w)) => format!("'{}'", echo(w)),
        Some(Tok::Colon) => "':'".to_string(),
        Some(Tok::Comma) => "','".to_string(),
        Some(Tok::Open) => "'['".to_string(),
        Some(Tok::Close) => "']'".to_string(),
    }
}

/// The value of one `key:value` entry.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Value<'a> {
    One(&'a str),
    /// `[boundary:value, ...]`.
    List(Vec<(&'a str, &'a str)>),
}

/// One `key:value` entry of a config string.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Entry<'a> {
    pub(super) key: &'a str,
    pub(super) value: Value<'a>,
    /// The value as written (a list with its brackets).
    pub(super) raw: &'a str,
}

struct Parser<'a> {
    s: &'a str,
    toks: Vec<Token<'a>>,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<Tok<'a>> {
        self.toks.get(self.pos).map(|t| t.tok)
    }

    /// Offset of the current token (the string's length at its end).
    fn offset(&self) -> usize {
        self.toks.get(self.pos).map_or(self.s.len(), |t| t.at)
    }

    fn bump(&mut self) {
        self.pos += 1;
    }

    /// "expected `what`, found <the current token> at offset N".
    fn expected(&self, key: &str, what: &str) -> ConfigError {
        let offset = self.offset();
        ConfigError::new(
            echo(key),
            ConfigErrorKind::Syntax { offset },
            format!(
                "expected {what}, found {} at offset {offset}",
                describe(self.peek())
            ),
        )
    }

    fn entries(mut self) -> Result<Vec<Entry<'a>>, ConfigError> {
        let mut out = Vec::new();
        while self.peek().is_some() {
            let Some(Tok::Word(key)) = self.peek() else {
                return Err(self.expected("", "a key"));
            };
            self.bump();
            if self.peek() != Some(Tok::Colon) {
                return Err(self.expected(key, "':' after the key"));
            }
            self.bump();
            let start = self.offset();
            let value = match self.peek() {
                Some(Tok::Open) => {
                    self.bump();
                    Value::List(self.list(key)?)
                }
                Some(Tok::Word(v)) => {
                    self.bump();
                    Value::One(v)
                }
                _ => return Err(self.expected(key, "a value")),
            };
            let end = match value {
                Value::One(v) => start + v.len(),
                Value::List(_) => self.toks[self.pos - 1].at + 1,
            };
            out.push(Entry {
                key,
                value,
                raw: &self.s[start..end],
            });
            match self.peek() {
                None => {}
                Some(Tok::Comma) => self.bump(),
                Some(_) => return Err(self.expected(key, "',' between options")),
            }
        }
        Ok(out)
    }

    /// The items of a list, after its `[`, through its `]`.
    fn list(&mut self, key: &str) -> Result<Vec<(&'a str, &'a str)>, ConfigError> {
        let mut items = Vec::new();
        loop {
            match self.peek() {
                Some(Tok::Close) => {
                    self.bump();
                    return Ok(items);
                }
                Some(Tok::Word(b)) => {
                    self.bump();
                    if self.peek() != Some(Tok::Colon) {
                        return Err(self.expected(key, "':' after the list boundary"));
                    }
                    self.bump();
                    let Some(Tok::Word(v)) = self.peek() else {
                        return Err(self.expected(key, "a value in the list"));
                    };
                    self.bump();
                    items.push((b, v));
                    match self.peek() {
                        Some(Tok::Comma) => self.bump(),
                        Some(Tok::Close) => {}
                        _ => return Err(self.expected(key, "',' or ']' in the list")),
                    }
                }
                _ => return Err(self.expected(key, "'boundary:value' or ']' in the list")),
            }
        }
    }
}

/// The entries of `s`, syntax checked (values are not).
pub(super) fn parse_entries(s: &str) -> Result<Vec<Entry<'_>>, ConfigError> {
    if s.len() > MAX_CONFIG_LEN {
        return Err(ConfigError::new(
            "",
            ConfigErrorKind::TooLong {
                len: s.len(),
                max: MAX_CONFIG_LEN,
            },
            format!(
                "the config string is {} bytes long, at most {MAX_CONFIG_LEN} are allowed \
                 (it starts '{}')",
                s.len(),
                echo(s)
            ),
        ));
    }
    Parser {
        s,
        toks: tokenize(s),
        pos: 0,
    }
    .entries()
}
