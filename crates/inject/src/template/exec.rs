//! Execution of a parsed template (Go's `text/template/exec.go`): dot, variables and their
//! scopes, pipelines (the piped value is the last argument), `if`/`with`/`range` (maps in key
//! order), `template`, and the short-circuit `and`/`or`.

use std::collections::BTreeMap;

use super::TemplateError;
use super::funcs::{FuncCtx, lookup};
use super::parse::{Arg, Branch, Node, Pipe};
use super::value::Value;

/// The most a template may write: a Pod patch is kilobytes; a runaway loop stops here.
const MAX_OUTPUT: usize = 16 << 20;

/// How deep `template` may nest (Go's `maxExecDepth` is 100000; templates here are small).
const MAX_DEPTH: usize = 64;

pub(crate) struct Exec<'a> {
    pub(crate) defines: &'a BTreeMap<String, Vec<Node>>,
    pub(crate) ctx: &'a FuncCtx<'a>,
    pub(crate) out: String,
    vars: Vec<(String, Value)>,
    depth: usize,
}

enum Flow {
    Normal,
    Break,
    Continue,
}

type R<T> = Result<T, TemplateError>;

fn exec_err(line: usize, msg: impl Into<String>) -> TemplateError {
    TemplateError::Exec(line, msg.into())
}

impl<'a> Exec<'a> {
    pub(crate) fn new(defines: &'a BTreeMap<String, Vec<Node>>, ctx: &'a FuncCtx<'a>, root: Value) -> Self {
        Exec {
            defines,
            ctx,
            out: String::new(),
            vars: vec![("$".into(), root)],
            depth: 0,
        }
    }

    pub(crate) fn run(&mut self, nodes: &[Node], dot: &Value) -> R<()> {
        self.list(nodes, dot).map(|_| ())
    }

    fn list(&mut self, nodes: &[Node], dot: &Value) -> R<Flow> {
        for n in nodes {
            match self.node(n, dot)? {
                Flow::Normal => {}
                other => return Ok(other),
            }
        }
        Ok(Flow::Normal)
    }

    /// Runs `nodes` in a new variable scope.
    fn scoped(&mut self, nodes: &[Node], dot: &Value) -> R<Flow> {
        let mark = self.vars.len();
        let r = self.list(nodes, dot);
        self.vars.truncate(mark);
        r
    }

    fn node(&mut self, node: &Node, dot: &Value) -> R<Flow> {
        if self.out.len() > MAX_OUTPUT {
            return Err(exec_err(0, format!("output exceeds {} MiB", MAX_OUTPUT >> 20)));
        }
        match node {
            Node::Text(t) => self.out.push_str(t),
            Node::Action(p) => {
                let v = self.pipe(p, dot)?;
                if p.decl.is_empty() {
                    self.out.push_str(&v.to_text());
                }
            }
            Node::If(b) => return self.if_with(b, dot, false),
            Node::With(b) => return self.if_with(b, dot, true),
            Node::Range(b) => return self.range(b, dot),
            Node::Template(name, pipe) => {
                let body = self.defines.get(name).ok_or_else(|| {
                    exec_err(
                        pipe.as_ref().map(|p| p.line).unwrap_or(0),
                        format!("no such template {name:?}"),
                    )
                })?;
                let new_dot = match pipe {
                    Some(p) => self.pipe(p, dot)?,
                    None => Value::Nil,
                };
                if self.depth >= MAX_DEPTH {
                    return Err(exec_err(0, format!("exceeded maximum template depth ({MAX_DEPTH})")));
                }
                self.depth += 1;
                // A template sees only `$` (its dot), not the caller's variables.
                let saved = std::mem::replace(&mut self.vars, vec![("$".into(), new_dot.clone())]);
                let r = self.list(body, &new_dot);
                self.vars = saved;
                self.depth -= 1;
                r?;
            }
            Node::Break => return Ok(Flow::Break),
            Node::Continue => return Ok(Flow::Continue),
        }
        Ok(Flow::Normal)
    }

    fn if_with(&mut self, b: &Branch, dot: &Value, with: bool) -> R<Flow> {
        let mark = self.vars.len();
        let v = self.pipe(&b.pipe, dot)?;
        let r = if v.truthy() {
            let d = if with { v } else { dot.clone() };
            self.list(&b.list, &d)
        } else {
            self.list(&b.else_list, dot)
        };
        self.vars.truncate(mark);
        r
    }

    fn range(&mut self, b: &Branch, dot: &Value) -> R<Flow> {
        let mark = self.vars.len();
        let v = self.pipe_value(&b.pipe, dot)?;
        let (items, len): (Box<dyn Iterator<Item = (Value, Value)>>, i64) = match &v {
            Value::List(l) => {
                let l = l.clone();
                let n = l.len() as i64;
                (
                    Box::new((0..l.len()).map(move |i| (Value::Int(i as i64), l[i].clone()))),
                    n,
                )
            }
            Value::Map(m) => {
                let entries: Vec<(Value, Value)> = m
                    .entries
                    .iter()
                    .map(|(k, v)| (Value::str(k.clone()), v.clone()))
                    .collect();
                let n = entries.len() as i64;
                (Box::new(entries.into_iter()), n)
            }
            // Go 1.22: range over an int, taken one at a time
            Value::Int(n) => (Box::new((0..*n).map(|i| (Value::Int(i), Value::Int(i)))), *n),
            Value::Nil | Value::Zero => (Box::new(std::iter::empty()), 0),
            other => {
                return Err(exec_err(
                    b.pipe.line,
                    format!("range can't iterate over {}", other.to_text()),
                ));
            }
        };
        if len <= 0 {
            let r = self.scoped(&b.else_list, dot);
            self.vars.truncate(mark);
            return r;
        }
        for (k, v) in items {
            let inner = self.vars.len();
            match b.pipe.decl.as_slice() {
                [] => {}
                [val] => self.declare_or_assign(val, v.clone(), b.pipe.assign, b.pipe.line)?,
                [key, val, ..] => {
                    self.declare_or_assign(key, k, b.pipe.assign, b.pipe.line)?;
                    self.declare_or_assign(val, v.clone(), b.pipe.assign, b.pipe.line)?;
                }
            }
            let flow = self.list(&b.list, &v);
            self.vars.truncate(inner);
            match flow? {
                Flow::Break => break,
                Flow::Normal | Flow::Continue => {}
            }
        }
        self.vars.truncate(mark);
        Ok(Flow::Normal)
    }

    fn declare_or_assign(&mut self, name: &str, v: Value, assign: bool, line: usize) -> R<()> {
        if assign {
            match self.vars.iter_mut().rev().find(|(n, _)| n == name) {
                Some(slot) => slot.1 = v,
                None => return Err(exec_err(line, format!("undefined variable: {name}"))),
            }
        } else {
            self.vars.push((name.to_string(), v));
        }
        Ok(())
    }

    /// The value of a pipeline, without its declarations (the range header).
    fn pipe_value(&mut self, p: &Pipe, dot: &Value) -> R<Value> {
        let mut last: Option<Value> = None;
        for cmd in &p.cmds {
            last = Some(self.command(cmd, dot, last, p.line)?);
        }
        last.ok_or_else(|| exec_err(p.line, "empty pipeline"))
    }

    fn pipe(&mut self, p: &Pipe, dot: &Value) -> R<Value> {
        let v = self.pipe_value(p, dot)?;
        if let Some(name) = p.decl.first() {
            self.declare_or_assign(name, v.clone(), p.assign, p.line)?;
        }
        Ok(v)
    }

    fn command(&mut self, cmd: &[Arg], dot: &Value, piped: Option<Value>, line: usize) -> R<Value> {
        let Some(first) = cmd.first() else {
            return Err(exec_err(line, "empty command"));
        };
        if let Arg::Func(name) = first {
            return self.call(name, &cmd[1..], dot, piped, line);
        }
        if cmd.len() > 1 || piped.is_some() {
            return Err(exec_err(line, format!("can't give argument to non-function {first:?}")));
        }
        self.arg(first, dot, line)
    }

    fn call(&mut self, name: &str, args: &[Arg], dot: &Value, piped: Option<Value>, line: usize) -> R<Value> {
        // `and` and `or` stop at the first argument that decides (Go 1.18).
        if name == "and" || name == "or" {
            let mut last = Value::Nil;
            let n = args.len() + usize::from(piped.is_some());
            if n == 0 {
                return Err(exec_err(line, format!("{name}: wrong number of args")));
            }
            for a in args {
                last = self.arg(a, dot, line)?;
                if last.truthy() == (name == "or") {
                    return Ok(last);
                }
            }
            if let Some(p) = piped {
                last = p;
            }
            return Ok(last);
        }
        let f = lookup(name).ok_or_else(|| exec_err(line, format!("function {name:?} not defined")))?;
        let mut vals = Vec::with_capacity(args.len() + 1);
        for a in args {
            vals.push(self.arg(a, dot, line)?);
        }
        if let Some(p) = piped {
            vals.push(p);
        }
        f(self.ctx, &vals).map_err(|e| exec_err(line, format!("error calling {name}: {e}")))
    }

    fn arg(&mut self, a: &Arg, dot: &Value, line: usize) -> R<Value> {
        Ok(match a {
            Arg::Field(fields) => chain(dot.clone(), fields),
            Arg::Var(name, fields) => {
                let v = self
                    .vars
                    .iter()
                    .rev()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
                    .ok_or_else(|| exec_err(line, format!("undefined variable: {name}")))?;
                chain(v, fields)
            }
            Arg::Func(name) => self.call(name, &[], dot, None, line)?,
            Arg::Str(s) => Value::Str(s.clone()),
            Arg::Int(i) => Value::Int(*i),
            Arg::Float(f) => Value::Float(*f),
            Arg::Bool(b) => Value::Bool(*b),
            Arg::Nil => Value::Nil,
            Arg::Sub(p, fields) => {
                let v = self.pipe(p, dot)?;
                chain(v, fields)
            }
        })
    }
}

fn chain(mut v: Value, fields: &[String]) -> Value {
    for f in fields {
        v = v.field(f);
    }
    v
}
