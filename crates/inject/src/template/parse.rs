//! The parser of Go's `text/template` (Go's `text/template/parse/parse.go`): the node tree of
//! text, actions, `if`/`else if`/`range`/`with`/`else`/`end`, `define`/`template`/`block`,
//! pipelines with `:=` and `=`.

use std::collections::BTreeMap;

use super::TemplateError;
use super::lex::{Tok, Token};

#[derive(Debug, Clone)]
pub(crate) enum Node {
    Text(String),
    Action(Pipe),
    If(Branch),
    With(Branch),
    Range(Branch),
    Template(String, Option<Pipe>),
    Break,
    Continue,
}

#[derive(Debug, Clone)]
pub(crate) struct Branch {
    pub(crate) pipe: Pipe,
    pub(crate) list: Vec<Node>,
    pub(crate) else_list: Vec<Node>,
}

#[derive(Debug, Clone)]
pub(crate) struct Pipe {
    pub(crate) line: usize,
    pub(crate) decl: Vec<String>,
    pub(crate) assign: bool,
    pub(crate) cmds: Vec<Vec<Arg>>,
}

#[derive(Debug, Clone)]
pub(crate) enum Arg {
    /// `.A.B` on dot (no fields: dot itself).
    Field(Vec<String>),
    Var(String, Vec<String>),
    Func(String),
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Nil,
    /// `( pipeline ).A.B`
    Sub(Box<Pipe>, Vec<String>),
}

pub(crate) struct Parsed {
    pub(crate) root: Vec<Node>,
    pub(crate) defines: BTreeMap<String, Vec<Node>>,
}

pub(crate) fn parse(tokens: Vec<Token>) -> Result<Parsed, TemplateError> {
    let mut p = Parser {
        toks: tokens,
        pos: 0,
        defines: BTreeMap::new(),
    };
    let (root, end) = p.list()?;
    if let Some(end) = end {
        return Err(TemplateError::Parse(p.line(), format!("unexpected {{{{{end}}}}}")));
    }
    Ok(Parsed {
        root,
        defines: p.defines,
    })
}

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    defines: BTreeMap<String, Vec<Node>>,
}

/// What ended a list: `end`, `else`, or `else if`/`else with` (their pipeline follows).
enum End {
    Plain,
    Else,
    ElseIf,
    ElseWith,
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            End::Plain => "end",
            End::Else | End::ElseIf | End::ElseWith => "else",
        })
    }
}

impl Parser {
    fn line(&self) -> usize {
        self.toks
            .get(self.pos)
            .or(self.toks.last())
            .map(|t| t.line)
            .unwrap_or(0)
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.tok)
    }

    fn next(&mut self) -> Result<Token, TemplateError> {
        let t = self
            .toks
            .get(self.pos)
            .cloned()
            .ok_or(TemplateError::Parse(self.line(), "unexpected end of template".into()))?;
        self.pos += 1;
        Ok(t)
    }

    fn expect(&mut self, want: &Tok, what: &str) -> Result<(), TemplateError> {
        let t = self.next()?;
        if &t.tok != want {
            return Err(TemplateError::Parse(
                t.line,
                format!("expected {what}, got {:?}", t.tok),
            ));
        }
        Ok(())
    }

    fn err<T>(&self, msg: String) -> Result<T, TemplateError> {
        Err(TemplateError::Parse(self.line(), msg))
    }

    /// Nodes up to the end of input or to an `end`/`else` (which is consumed and returned).
    fn list(&mut self) -> Result<(Vec<Node>, Option<End>), TemplateError> {
        let mut nodes = Vec::new();
        while let Some(tok) = self.peek().cloned() {
            match tok {
                Tok::Text(t) => {
                    self.pos += 1;
                    nodes.push(Node::Text(t));
                }
                Tok::Open => {
                    self.pos += 1;
                    match self.action()? {
                        Step::Node(n) => nodes.push(n),
                        Step::End(e) => return Ok((nodes, Some(e))),
                        Step::Nothing => {}
                    }
                }
                other => return self.err(format!("unexpected {other:?}")),
            }
        }
        Ok((nodes, None))
    }

    fn action(&mut self) -> Result<Step, TemplateError> {
        let keyword = match self.peek() {
            Some(Tok::Ident(k)) => k.clone(),
            _ => return Ok(Step::Node(Node::Action(self.pipeline()?))),
        };
        match keyword.as_str() {
            "end" => {
                self.pos += 1;
                self.expect(&Tok::Close, "}}")?;
                Ok(Step::End(End::Plain))
            }
            "else" => {
                self.pos += 1;
                match self.peek() {
                    Some(Tok::Ident(k)) if k == "if" => {
                        self.pos += 1;
                        Ok(Step::End(End::ElseIf))
                    }
                    Some(Tok::Ident(k)) if k == "with" => {
                        self.pos += 1;
                        Ok(Step::End(End::ElseWith))
                    }
                    _ => {
                        self.expect(&Tok::Close, "}}")?;
                        Ok(Step::End(End::Else))
                    }
                }
            }
            "if" | "with" | "range" => {
                self.pos += 1;
                let b = self.branch(&keyword)?;
                Ok(Step::Node(match keyword.as_str() {
                    "if" => Node::If(b),
                    "with" => Node::With(b),
                    _ => Node::Range(b),
                }))
            }
            "define" | "block" => {
                self.pos += 1;
                let name = match self.next()?.tok {
                    Tok::Str(s) => s,
                    other => return self.err(format!("{keyword} wants a quoted name, got {other:?}")),
                };
                let pipe = if keyword == "block" {
                    Some(self.pipeline()?)
                } else {
                    self.expect(&Tok::Close, "}}")?;
                    None
                };
                let (body, end) = self.list()?;
                if !matches!(end, Some(End::Plain)) {
                    return self.err(format!("{keyword} {name:?} has no {{{{end}}}}"));
                }
                self.defines.insert(name.clone(), body);
                Ok(match pipe {
                    Some(p) => Step::Node(Node::Template(name, Some(p))),
                    None => Step::Nothing,
                })
            }
            "template" => {
                self.pos += 1;
                let name = match self.next()?.tok {
                    Tok::Str(s) => s,
                    other => return self.err(format!("template wants a quoted name, got {other:?}")),
                };
                if self.peek() == Some(&Tok::Close) {
                    self.pos += 1;
                    return Ok(Step::Node(Node::Template(name, None)));
                }
                Ok(Step::Node(Node::Template(name, Some(self.pipeline()?))))
            }
            "break" | "continue" => {
                self.pos += 1;
                self.expect(&Tok::Close, "}}")?;
                Ok(Step::Node(if keyword == "break" {
                    Node::Break
                } else {
                    Node::Continue
                }))
            }
            _ => Ok(Step::Node(Node::Action(self.pipeline()?))),
        }
    }

    /// The pipeline, body and else branch of `if`/`with`/`range`; `else if` nests an `if`.
    fn branch(&mut self, keyword: &str) -> Result<Branch, TemplateError> {
        let pipe = self.pipeline()?;
        let (list, end) = self.list()?;
        let else_list = match end {
            Some(End::Plain) => Vec::new(),
            Some(End::Else) => {
                let (l, e) = self.list()?;
                if !matches!(e, Some(End::Plain)) {
                    return self.err(format!("{keyword}: else without end"));
                }
                l
            }
            Some(End::ElseIf) => vec![Node::If(self.branch("if")?)],
            Some(End::ElseWith) => vec![Node::With(self.branch("with")?)],
            None => return self.err(format!("{keyword} has no {{{{end}}}}")),
        };
        Ok(Branch { pipe, list, else_list })
    }

    /// A pipeline up to and including the closing `}}`.
    fn pipeline(&mut self) -> Result<Pipe, TemplateError> {
        let line = self.line();
        let mut decl = Vec::new();
        let mut assign = false;
        // `$x :=`, `$x =`, `$i, $v :=`
        let save = self.pos;
        loop {
            match (
                self.toks.get(self.pos).map(|t| &t.tok),
                self.toks.get(self.pos + 1).map(|t| &t.tok),
            ) {
                (Some(Tok::Var(v, f)), Some(Tok::Declare | Tok::Assign)) if f.is_empty() => {
                    decl.push(v.clone());
                    assign = self.toks[self.pos + 1].tok == Tok::Assign;
                    self.pos += 2;
                    break;
                }
                (Some(Tok::Var(v, f)), Some(Tok::Comma)) if f.is_empty() && decl.is_empty() => {
                    decl.push(v.clone());
                    self.pos += 2;
                }
                _ => {
                    if !decl.is_empty() {
                        decl.clear();
                        self.pos = save;
                    }
                    break;
                }
            }
        }
        let cmds = self.commands(&Tok::Close)?;
        Ok(Pipe {
            line,
            decl,
            assign,
            cmds,
        })
    }

    /// Commands separated by `|`, up to `end` (consumed).
    fn commands(&mut self, end: &Tok) -> Result<Vec<Vec<Arg>>, TemplateError> {
        let mut cmds = Vec::new();
        let mut cmd = Vec::new();
        loop {
            let t = self.next()?;
            match t.tok {
                ref x if x == end => {
                    if cmd.is_empty() {
                        return self.err("missing command".into());
                    }
                    cmds.push(cmd);
                    return Ok(cmds);
                }
                Tok::Pipe => {
                    if cmd.is_empty() {
                        return self.err("missing command before |".into());
                    }
                    cmds.push(std::mem::take(&mut cmd));
                }
                Tok::LParen => {
                    let line = t.line;
                    let inner = self.sub_pipeline()?;
                    let fields = match self.peek() {
                        Some(Tok::Field(f)) if !self.toks[self.pos].spaced && !f.is_empty() => {
                            let f = f.clone();
                            self.pos += 1;
                            f
                        }
                        _ => Vec::new(),
                    };
                    cmd.push(Arg::Sub(Box::new(Pipe { line, ..inner }), fields));
                }
                Tok::Field(f) => cmd.push(Arg::Field(f)),
                Tok::Var(v, f) => cmd.push(Arg::Var(v, f)),
                Tok::Ident(i) => cmd.push(Arg::Func(i)),
                Tok::Str(s) => cmd.push(Arg::Str(s)),
                Tok::Int(i) => cmd.push(Arg::Int(i)),
                Tok::Float(f) => cmd.push(Arg::Float(f)),
                Tok::Bool(b) => cmd.push(Arg::Bool(b)),
                Tok::Nil => cmd.push(Arg::Nil),
                other => return Err(TemplateError::Parse(t.line, format!("unexpected {other:?} in command"))),
            }
        }
    }

    /// The pipeline inside `( ... )`, which may declare nothing.
    fn sub_pipeline(&mut self) -> Result<Pipe, TemplateError> {
        let line = self.line();
        let cmds = self.commands(&Tok::RParen)?;
        Ok(Pipe {
            line,
            decl: Vec::new(),
            assign: false,
            cmds,
        })
    }
}

enum Step {
    Node(Node),
    End(End),
    Nothing,
}

/// Every function a pipeline calls is known (`known`), or the line and name of the first that
/// is not.
pub(crate) fn check_functions(nodes: &[Node], known: &dyn Fn(&str) -> bool) -> Result<(), TemplateError> {
    fn pipe(p: &Pipe, known: &dyn Fn(&str) -> bool) -> Result<(), TemplateError> {
        for arg in p.cmds.iter().flatten() {
            match arg {
                Arg::Func(name) if !known(name) => {
                    return Err(TemplateError::Parse(p.line, format!("function {name:?} not defined")));
                }
                Arg::Sub(inner, _) => pipe(inner, known)?,
                _ => {}
            }
        }
        Ok(())
    }
    for n in nodes {
        match n {
            Node::Action(p) => pipe(p, known)?,
            Node::If(b) | Node::With(b) | Node::Range(b) => {
                pipe(&b.pipe, known)?;
                check_functions(&b.list, known)?;
                check_functions(&b.else_list, known)?;
            }
            Node::Template(_, Some(p)) => pipe(p, known)?,
            Node::Text(_) | Node::Template(_, None) | Node::Break | Node::Continue => {}
        }
    }
    Ok(())
}
