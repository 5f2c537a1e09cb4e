//! Reading one config file: which files count, splitting YAML/JSON text into documents (expanding
//! `List`s as kubectl does), and turning each document into a `Config` or a `SourceError`.

use std::path::Path;

use model::Config;
use model::config::{ConfigError, parse_config};
use serde_json::Value;

use crate::error::{DocRef, SourceError};

/// Namespace of a document whose metadata names none, as Istio's file config source.
pub const DEFAULT_NAMESPACE: &str = "default";

/// True for `.yaml`, `.yml` and `.json` files that are not hidden or editor scratch files.
pub fn is_config_file(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    if name.starts_with('.') || name.starts_with('#') || name.ends_with('~') || name.ends_with(".swp") {
        return false;
    }
    matches!(extension(path).as_deref(), Some("yaml" | "yml" | "json"))
}

fn extension(path: &Path) -> Option<String> {
    path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase)
}

/// Parses every document of one file, in order. A syntax error is one `SourceError::Syntax` for
/// the whole file; otherwise each document gives its `Config` or the reason it was rejected.
/// Unknown kinds come back as `SourceError::UnknownKind` (a warning); Istio kinds that are not
/// yet supported come back as `Ok` with `ConfigSpec::Unsupported`.
pub fn parse_documents(text: &str, file: &Path) -> Vec<Result<Config, SourceError>> {
    match parse_file(text, file, DEFAULT_NAMESPACE) {
        Ok(docs) => docs.into_iter().map(|d| d.result).collect(),
        Err(e) => vec![Err(e)],
    }
}

/// One document's outcome and where it sat in the file.
#[derive(Debug)]
pub(crate) struct ParsedDoc {
    pub doc: DocRef,
    pub result: Result<Config, SourceError>,
}

/// Like `parse_documents`, keeping each document's position; `Err` is the file-level syntax error.
pub(crate) fn parse_file(text: &str, file: &Path, default_ns: &str) -> Result<Vec<ParsedDoc>, SourceError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let docs = if extension(file).as_deref() == Some("json") {
        json_documents(text)
    } else {
        yaml_documents(text)
    };
    let docs = docs.map_err(|reason| SourceError::Syntax {
        file: file.to_path_buf(),
        reason,
    })?;
    let mut out = Vec::new();
    for (document, (value, line)) in (1u32..).zip(docs) {
        let doc = DocRef {
            document,
            item: None,
            line,
        };
        match list_items(value) {
            Ok(items) => out.extend((0u32..).zip(items).map(|(item, value)| {
                let doc = DocRef {
                    item: Some(item),
                    ..doc
                };
                ParsedDoc {
                    doc,
                    result: parse_one(value, doc, file, default_ns),
                }
            })),
            Err(value) => out.push(ParsedDoc {
                doc,
                result: parse_one(value, doc, file, default_ns),
            }),
        }
    }
    Ok(out)
}

/// Every non-empty YAML document with the line it starts on.
fn yaml_documents(text: &str) -> Result<Vec<(Value, Option<u32>)>, String> {
    let options = serde_saphyr::options! {
        with_snippet: false,
        // Generated config files can hold thousands of resources; the defaults stop at 1,024
        // documents. Alias and depth limits stay at their (safe) defaults.
        budget: serde_saphyr::budget! {
            max_documents: 1_000_000,
            max_nodes: 50_000_000,
            max_events: 200_000_000,
        },
    };
    let docs: Vec<serde_saphyr::Spanned<Value>> =
        serde_saphyr::from_multiple_with_options(text, options).map_err(|e| e.to_string())?;
    Ok(docs
        .into_iter()
        .filter(|d| !d.value.is_null())
        .map(|d| {
            let line = d.referenced.line();
            let mut value = d.value;
            ipv6_list_items_as_go_reads_them(&mut value);
            (value, u32::try_from(line).ok().filter(|l| *l > 0))
        })
        .collect())
}

/// Istio reads YAML with Go's parser, which takes `[1.2.3.4, 2001:db8::]` as two addresses; a
/// YAML 1.2 parser reads the last `:` of `2001:db8::` before `]` (or `,`, or a line end) as a
/// mapping indicator and yields the item `{"2001:db8:": null}`. Such an item, whose key with the
/// `:` put back is an IPv6 address, is turned back into that address, so that configs mean here
/// what they mean to istiod.
fn ipv6_list_items_as_go_reads_them(v: &mut Value) {
    match v {
        Value::Array(items) => {
            for item in items.iter_mut() {
                let restored = match item {
                    Value::Object(m) if m.len() == 1 => m.iter().next().and_then(|(k, v)| {
                        let address = format!("{k}:");
                        (v.is_null() && address.parse::<std::net::Ipv6Addr>().is_ok()).then_some(address)
                    }),
                    _ => None,
                };
                match restored {
                    Some(address) => *item = Value::String(address),
                    None => ipv6_list_items_as_go_reads_them(item),
                }
            }
        }
        Value::Object(m) => m.values_mut().for_each(ipv6_list_items_as_go_reads_them),
        _ => {}
    }
}

/// One or more concatenated JSON values, each with the line it starts on.
fn json_documents(text: &str) -> Result<Vec<(Value, Option<u32>)>, String> {
    let mut out = Vec::new();
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let mut line = 1u32;
    let mut scanned = 0usize;
    loop {
        // The next value starts at the first non-whitespace byte after the previous one.
        let start = text[scanned..]
            .find(|c: char| !c.is_whitespace())
            .map_or(text.len(), |i| scanned + i);
        line += count_lines(&text[scanned..start]);
        scanned = start;
        let Some(next) = stream.next() else { break };
        let value = next.map_err(|e| e.to_string())?;
        let end = stream.byte_offset();
        let doc_line = line;
        line += count_lines(&text[scanned..end]);
        scanned = end;
        if !value.is_null() {
            out.push((value, Some(doc_line)));
        }
    }
    Ok(out)
}

fn count_lines(s: &str) -> u32 {
    u32::try_from(s.bytes().filter(|b| *b == b'\n').count()).unwrap_or(u32::MAX)
}

/// The items of a `List` (`kind: List` or `kind: <Kind>List` with `items`) or of a top-level
/// array; any other value comes back as `Err` unchanged.
fn list_items(value: Value) -> Result<Vec<Value>, Value> {
    match value {
        Value::Array(items) => Ok(items),
        Value::Object(mut obj) => {
            let is_list = obj
                .get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| k.ends_with("List"))
                && obj.get("items").is_some_and(Value::is_array);
            match obj.remove("items") {
                Some(Value::Array(items)) if is_list => Ok(items),
                Some(items) => {
                    obj.insert("items".into(), items);
                    Err(Value::Object(obj))
                }
                None => Err(Value::Object(obj)),
            }
        }
        other => Err(other),
    }
}

fn parse_one(value: Value, doc: DocRef, file: &Path, default_ns: &str) -> Result<Config, SourceError> {
    let resource = resource_name(&value, default_ns);
    parse_config(value, default_ns).map_err(|e| match e {
        ConfigError::UnknownKind { api_version, kind } => SourceError::UnknownKind {
            file: file.to_path_buf(),
            doc,
            api_version,
            kind,
            resource,
        },
        source => SourceError::Invalid {
            file: file.to_path_buf(),
            doc,
            resource,
            source: Box::new(source),
        },
    })
}

/// `Kind namespace/name` read straight from the document, before it is decoded.
fn resource_name(value: &Value, default_ns: &str) -> Option<String> {
    let kind = value.get("kind").and_then(Value::as_str).filter(|k| !k.is_empty())?;
    let meta = value.get("metadata");
    let field = |f: &str| {
        meta.and_then(|m| m.get(f))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    Some(match field("name") {
        Some(name) => format!("{kind} {}/{name}", field("namespace").unwrap_or(default_ns)),
        None => kind.to_owned(),
    })
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
