//! YAML in and out: templates render YAML that is read as JSON (Go's `sigs.k8s.io/yaml`), and
//! `toYaml` writes YAML as `sigs.k8s.io/yaml.Marshal` does (block style, keys sorted, lists at
//! their key's indentation).

use serde_json::Value as Json;

/// YAML text as JSON; an empty document is `null`.
pub(crate) fn from_yaml(text: &str) -> Result<Json, String> {
    if text.trim().is_empty() {
        return Ok(Json::Null);
    }
    serde_saphyr::from_str::<Json>(text).map_err(|e| e.to_string())
}

pub(crate) fn to_yaml(v: &Json) -> String {
    let mut out = String::new();
    match v {
        Json::Object(m) if m.is_empty() => out.push_str("{}\n"),
        Json::Array(a) if a.is_empty() => out.push_str("[]\n"),
        Json::Object(_) | Json::Array(_) => block(v, 0, &mut out),
        scalar => {
            out.push_str(&scalar_text(scalar));
            out.push('\n');
        }
    }
    out
}

fn block(v: &Json, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match v {
        Json::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            for k in keys {
                let val = &m[k];
                out.push_str(&pad);
                out.push_str(&string_text(k));
                out.push(':');
                match val {
                    Json::Object(o) if !o.is_empty() => {
                        out.push('\n');
                        block(val, indent + 2, out);
                    }
                    Json::Array(a) if !a.is_empty() => {
                        out.push('\n');
                        block(val, indent, out);
                    }
                    other => {
                        out.push(' ');
                        out.push_str(&scalar_text(other));
                        out.push('\n');
                    }
                }
            }
        }
        Json::Array(a) => {
            for item in a {
                out.push_str(&pad);
                out.push_str("- ");
                match item {
                    Json::Object(o) if !o.is_empty() => {
                        let mut inner = String::new();
                        block(item, indent + 2, &mut inner);
                        // the first line goes after "- "
                        out.push_str(inner.trim_start_matches(' '));
                    }
                    Json::Array(l) if !l.is_empty() => {
                        let mut inner = String::new();
                        block(item, indent + 2, &mut inner);
                        out.push_str(inner.trim_start_matches(' '));
                    }
                    other => {
                        out.push_str(&scalar_text(other));
                        out.push('\n');
                    }
                }
            }
        }
        other => {
            out.push_str(&pad);
            out.push_str(&scalar_text(other));
            out.push('\n');
        }
    }
}

fn scalar_text(v: &Json) -> String {
    match v {
        Json::Null => "null".into(),
        Json::String(s) => string_text(s),
        Json::Object(_) => "{}".into(),
        Json::Array(_) => "[]".into(),
        other => other.to_string(),
    }
}

/// A string plain when YAML reads it back as the same string, else double-quoted.
fn string_text(s: &str) -> String {
    let reserved = [
        "", "~", "null", "Null", "NULL", "true", "True", "TRUE", "false", "False", "FALSE", "yes", "Yes", "YES", "no",
        "No", "NO", "on", "On", "ON", "off", "Off", "OFF", "y", "Y", "n", "N",
    ];
    let special_start = s.starts_with(|c: char| "-?:,[]{}#&*!|>'\"%@` \t".contains(c));
    let looks_numeric = s.parse::<f64>().is_ok() || s.starts_with("0x") || s.starts_with("0o") || s.starts_with('.');
    let plain = !reserved.contains(&s)
        && !special_start
        && !looks_numeric
        && !s.ends_with([' ', '\t', ':'])
        && !s.contains(": ")
        && !s.contains(" #")
        && !s.contains(['\n', '\r', '\t'])
        && s.chars().all(|c| !c.is_control());
    if plain {
        s.to_string()
    } else {
        Json::String(s.to_string()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn writes_block_yaml_that_reads_back() {
        let v = json!({"limits": {"cpu": "2", "memory": "1Gi"}, "list": [{"a": 1, "b": [true]}, "x"], "empty": {}, "s": "a: b"});
        let y = to_yaml(&v);
        assert_eq!(
            y,
            "empty: {}\nlimits:\n  cpu: \"2\"\n  memory: 1Gi\nlist:\n- a: 1\n  b:\n  - true\n- x\ns: \"a: b\"\n"
        );
        assert_eq!(from_yaml(&y), Ok(v));
        assert_eq!(to_yaml(&Json::Null), "null\n");
    }
}
