//! A Go `text/template` engine for Istio's injection templates (Go's `text/template`): lexer,
//! parser, executor and the predefined functions; Istio's and sprig's functions are in
//! `crate::funcs`.
//!
//! Not gtmpl: gtmpl 0.7 ranges over maps in hash order (Go sorts the keys, and the templates
//! range over `proxyMetadata`), fails on an absent struct field where Go gives its zero value,
//! prints lists and maps in Rust's debug format, and takes only plain `fn` values, with no way to
//! give a struct Go field names and Kubernetes JSON names at once.

mod exec;
pub(crate) mod funcs;
mod lex;
mod parse;
pub(crate) mod value;

use std::collections::BTreeMap;

pub(crate) use funcs::FuncCtx;
use parse::Node;
pub(crate) use value::Value;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TemplateError {
    #[error("template: line {0}: {1}")]
    Parse(usize, String),
    #[error("template: line {0}: executing: {1}")]
    Exec(usize, String),
}

/// A parsed template with the templates it `define`s.
#[derive(Debug, Clone)]
pub(crate) struct Template {
    root: Vec<Node>,
    defines: BTreeMap<String, Vec<Node>>,
}

impl Template {
    /// Parses a template; as Go's parser, a call of an undefined function is a parse error.
    pub(crate) fn parse(src: &str) -> Result<Template, TemplateError> {
        let parsed = parse::parse(lex::lex(src)?)?;
        let known = |name: &str| name == "and" || name == "or" || funcs::lookup(name).is_some();
        for nodes in std::iter::once(&parsed.root).chain(parsed.defines.values()) {
            parse::check_functions(nodes, &known)?;
        }
        Ok(Template {
            root: parsed.root,
            defines: parsed.defines,
        })
    }

    pub(crate) fn render(&self, data: &Value, ctx: &FuncCtx<'_>) -> Result<String, TemplateError> {
        let mut exec = exec::Exec::new(&self.defines, ctx, data.clone());
        exec.run(&self.root, data)?;
        Ok(exec.out)
    }
}

#[cfg(test)]
mod tests;
