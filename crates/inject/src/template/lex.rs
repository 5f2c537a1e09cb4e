//! The lexer of Go's `text/template` (Go's `text/template/parse/lex.go`): text between actions,
//! `{{- ` / ` -}}` trim markers, comments, and the tokens of an action.

use super::TemplateError;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    /// Text outside actions, already trimmed by the markers around it.
    Text(String),
    /// Start of an action (`{{`).
    Open,
    /// End of an action (`}}`).
    Close,
    /// `.A.B` (an empty list is the dot itself).
    Field(Vec<String>),
    /// `$x.A.B`: the variable's name (with `$`) and the fields after it.
    Var(String, Vec<String>),
    Ident(String),
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Nil,
    LParen,
    RParen,
    Pipe,
    Declare,
    Assign,
    Comma,
}

/// A token and whether whitespace came before it (Go's `(x).Field` needs none).
#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub(crate) tok: Tok,
    pub(crate) spaced: bool,
    pub(crate) line: usize,
}

pub(crate) fn lex(src: &str) -> Result<Vec<Token>, TemplateError> {
    let mut out: Vec<Token> = Vec::new();
    let mut rest = src;
    let mut line = 1;
    let mut trim_next = false;
    loop {
        let Some(start) = rest.find("{{") else {
            push_text(&mut out, rest, trim_next, false, line);
            return Ok(out);
        };
        let after = &rest[start + 2..];
        let trim_left =
            after.starts_with("- ") || after.starts_with("-\t") || after.starts_with("-\n") || after.starts_with("-\r");
        push_text(&mut out, &rest[..start], trim_next, trim_left, line);
        line += rest[..start].matches('\n').count();
        let body_start = if trim_left { 3 } else { 2 };
        let body = &rest[start + body_start..];
        let (len, trim_right) = action_len(body, line)?;
        let action = &body[..len];
        let consumed = start + body_start + len + if trim_right { 4 } else { 2 };
        let trimmed = action.trim();
        if trimmed.starts_with("/*") {
            if !trimmed.ends_with("*/") {
                return Err(TemplateError::Parse(line, "unclosed comment".into()));
            }
        } else {
            out.push(Token {
                tok: Tok::Open,
                spaced: true,
                line,
            });
            lex_action(action, line, &mut out)?;
            out.push(Token {
                tok: Tok::Close,
                spaced: true,
                line,
            });
        }
        line += rest[start..consumed].matches('\n').count();
        rest = &rest[consumed..];
        trim_next = trim_right;
    }
}

fn push_text(out: &mut Vec<Token>, text: &str, trim_start: bool, trim_end: bool, line: usize) {
    let ws: &[char] = &[' ', '\t', '\r', '\n'];
    let mut t = text;
    if trim_start {
        t = t.trim_start_matches(ws);
    }
    if trim_end {
        t = t.trim_end_matches(ws);
    }
    if !t.is_empty() {
        out.push(Token {
            tok: Tok::Text(t.to_string()),
            spaced: true,
            line,
        });
    }
}

/// The length of the action's body up to its `}}` (or ` -}}`), skipping strings and comments.
fn action_len(body: &str, line: usize) -> Result<(usize, bool), TemplateError> {
    let b = body.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            b'`' => {
                i += 1;
                while i < b.len() && b[i] != b'`' {
                    i += 1;
                }
            }
            b'\'' => {
                i += 1;
                while i < b.len() && b[i] != b'\'' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => match body[i + 2..].find("*/") {
                Some(end) => i += end + 3,
                None => return Err(TemplateError::Parse(line, "unclosed comment".into())),
            },
            b'}' if b.get(i + 1) == Some(&b'}') => {
                let trim = i >= 2 && b[i - 1] == b'-' && b[i - 2].is_ascii_whitespace();
                return Ok(if trim { (i - 2, true) } else { (i, false) });
            }
            _ => {}
        }
        i += 1;
    }
    Err(TemplateError::Parse(line, "unclosed action".into()))
}

fn lex_action(src: &str, mut line: usize, out: &mut Vec<Token>) -> Result<(), TemplateError> {
    let chars: Vec<char> = src.chars().collect();
    let mut i = 0;
    let mut spaced = true;
    let err = |line, msg: String| Err(TemplateError::Parse(line, msg));
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            if c == '\n' {
                line += 1;
            }
            spaced = true;
            i += 1;
            continue;
        }
        if c == '/' && chars.get(i + 1) == Some(&'*') {
            let s: String = chars[i..].iter().collect();
            let end = s.find("*/").map(|e| e + 2).unwrap_or(s.len());
            i += s[..end].chars().count();
            spaced = true;
            continue;
        }
        let tok = match c {
            '(' => {
                i += 1;
                Tok::LParen
            }
            ')' => {
                i += 1;
                Tok::RParen
            }
            '|' => {
                i += 1;
                Tok::Pipe
            }
            ',' => {
                i += 1;
                Tok::Comma
            }
            ':' if chars.get(i + 1) == Some(&'=') => {
                i += 2;
                Tok::Declare
            }
            '=' => {
                i += 1;
                Tok::Assign
            }
            '"' => {
                let (s, n) =
                    quoted(&chars[i..]).ok_or(TemplateError::Parse(line, "unterminated quoted string".into()))?;
                i += n;
                Tok::Str(s)
            }
            '`' => {
                let end = chars[i + 1..].iter().position(|&c| c == '`');
                let Some(end) = end else {
                    return err(line, "unterminated raw string".into());
                };
                let s: String = chars[i + 1..i + 1 + end].iter().collect();
                line += s.matches('\n').count();
                i += end + 2;
                Tok::Str(s)
            }
            '\'' => {
                // A character constant is its code point, as in Go.
                let ch = chars.get(i + 1).copied().unwrap_or('\0');
                if chars.get(i + 2) != Some(&'\'') {
                    return err(line, "bad character constant".into());
                }
                i += 3;
                Tok::Int(ch as i64)
            }
            '.' if chars.get(i + 1).is_none_or(|c| !c.is_ascii_digit()) => {
                let (fields, n) = field_chain(&chars[i..]);
                i += n;
                Tok::Field(fields)
            }
            '$' => {
                let n = 1 + ident_len(&chars[i + 1..]);
                let name: String = chars[i..i + n].iter().collect();
                i += n;
                let (fields, m) = if chars.get(i) == Some(&'.') {
                    field_chain(&chars[i..])
                } else {
                    (vec![], 0)
                };
                i += m;
                Tok::Var(name, fields)
            }
            c if c.is_ascii_digit()
                || ((c == '-' || c == '+' || c == '.') && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit())) =>
            {
                let n = 1 + chars[i + 1..]
                    .iter()
                    .take_while(|c| c.is_ascii_alphanumeric() || **c == '.' || **c == '_')
                    .count();
                let s: String = chars[i..i + n].iter().collect::<String>().replace('_', "");
                i += n;
                number(&s).ok_or(TemplateError::Parse(line, format!("bad number syntax: {s:?}")))?
            }
            c if c.is_alphabetic() || c == '_' => {
                let n = ident_len(&chars[i..]);
                let s: String = chars[i..i + n].iter().collect();
                i += n;
                match s.as_str() {
                    "true" => Tok::Bool(true),
                    "false" => Tok::Bool(false),
                    "nil" => Tok::Nil,
                    _ => Tok::Ident(s),
                }
            }
            other => return err(line, format!("unexpected {other:?} in action")),
        };
        out.push(Token { tok, spaced, line });
        spaced = false;
    }
    Ok(())
}

fn ident_len(chars: &[char]) -> usize {
    chars.iter().take_while(|c| c.is_alphanumeric() || **c == '_').count()
}

/// `.A.B.C` from a leading dot: the field names and the characters taken.
fn field_chain(chars: &[char]) -> (Vec<String>, usize) {
    let mut fields = Vec::new();
    let mut i = 0;
    while chars.get(i) == Some(&'.') {
        let n = ident_len(&chars[i + 1..]);
        if n == 0 {
            i += 1;
            break;
        }
        fields.push(chars[i + 1..i + 1 + n].iter().collect());
        i += 1 + n;
    }
    (fields, i)
}

fn quoted(chars: &[char]) -> Option<(String, usize)> {
    let mut s = String::new();
    let mut i = 1;
    while i < chars.len() {
        match chars[i] {
            '"' => return Some((s, i + 1)),
            '\\' => {
                i += 1;
                match chars.get(i)? {
                    'n' => s.push('\n'),
                    't' => s.push('\t'),
                    'r' => s.push('\r'),
                    '\\' => s.push('\\'),
                    '"' => s.push('"'),
                    '\'' => s.push('\''),
                    'x' => {
                        let h: String = chars.get(i + 1..i + 3)?.iter().collect();
                        s.push(char::from(u8::from_str_radix(&h, 16).ok()?));
                        i += 2;
                    }
                    'u' => {
                        let h: String = chars.get(i + 1..i + 5)?.iter().collect();
                        s.push(char::from_u32(u32::from_str_radix(&h, 16).ok()?)?);
                        i += 4;
                    }
                    other => {
                        s.push('\\');
                        s.push(*other);
                    }
                }
            }
            c => s.push(c),
        }
        i += 1;
    }
    None
}

fn number(s: &str) -> Option<Tok> {
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let sign = if neg { -1 } else { 1 };
    let radix = [("0x", 16), ("0X", 16), ("0o", 8), ("0O", 8), ("0b", 2), ("0B", 2)];
    for (p, r) in radix {
        if let Some(digits) = body.strip_prefix(p) {
            return i64::from_str_radix(digits, r).ok().map(|v| Tok::Int(sign * v));
        }
    }
    if let Ok(v) = body.parse::<i64>() {
        return Some(Tok::Int(sign * v));
    }
    body.parse::<f64>().ok().map(|v| Tok::Float(sign as f64 * v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(src: &str) -> Vec<Tok> {
        lex(src).unwrap_or_default().into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn trim_markers_eat_whitespace_on_their_side() {
        assert_eq!(
            toks("a  \n{{- 1 -}}\n  b"),
            vec![
                Tok::Text("a".into()),
                Tok::Open,
                Tok::Int(1),
                Tok::Close,
                Tok::Text("b".into())
            ]
        );
        // `{{-3}}` is the number -3, not a trim marker.
        assert_eq!(toks("{{-3}}"), vec![Tok::Open, Tok::Int(-3), Tok::Close]);
    }

    #[test]
    fn fields_variables_strings_and_comments() {
        assert_eq!(
            toks("{{ $c.Name | printf \"%s\\n\" `raw` }}{{/* gone */}}"),
            vec![
                Tok::Open,
                Tok::Var("$c".into(), vec!["Name".into()]),
                Tok::Pipe,
                Tok::Ident("printf".into()),
                Tok::Str("%s\n".into()),
                Tok::Str("raw".into()),
                Tok::Close
            ]
        );
        assert_eq!(toks("{{ . }}"), vec![Tok::Open, Tok::Field(vec![]), Tok::Close]);
        assert!(lex("{{ .A ").is_err());
    }
}
