//! Label selectors as the API server parses them (`labelSelector=`): `k=v`, `k==v`, `k!=v`,
//! `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, joined by commas.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Selector(Vec<Requirement>);

impl Selector {
    pub(crate) fn parse(s: &str) -> Result<Selector, String> {
        let mut out = Vec::new();
        for term in split_terms(s) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let req = if let Some(k) = term.strip_prefix('!') {
                Requirement::NotExists(k.trim().to_owned())
            } else if let Some((k, rest)) = term.split_once(" notin ") {
                Requirement::NotIn(k.trim().to_owned(), set(rest)?)
            } else if let Some((k, rest)) = term.split_once(" in ") {
                Requirement::In(k.trim().to_owned(), set(rest)?)
            } else if let Some((k, v)) = term.split_once("!=") {
                Requirement::NotEquals(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                Requirement::Equals(k.trim().to_owned(), v.trim().to_owned())
            } else {
                Requirement::Exists(term.to_owned())
            };
            out.push(req);
        }
        Ok(Selector(out))
    }

    /// A `metav1.LabelSelector` object (`matchLabels`, `matchExpressions` with In, NotIn,
    /// Exists, DoesNotExist); absent or `{}` matches everything.
    pub(crate) fn from_label_selector(v: &serde_json::Value) -> Result<Selector, String> {
        let mut out = Vec::new();
        if let Some(m) = v.get("matchLabels").and_then(serde_json::Value::as_object) {
            for (k, v) in m {
                let v = v.as_str().ok_or_else(|| format!("matchLabels.{k} is not a string"))?;
                out.push(Requirement::Equals(k.clone(), v.to_owned()));
            }
        }
        for e in v
            .get("matchExpressions")
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
        {
            let key = e
                .get("key")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let values: Vec<String> = e
                .get("values")
                .and_then(serde_json::Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            out.push(match e.get("operator").and_then(serde_json::Value::as_str) {
                Some("In") => Requirement::In(key, values),
                Some("NotIn") => Requirement::NotIn(key, values),
                Some("Exists") => Requirement::Exists(key),
                Some("DoesNotExist") => Requirement::NotExists(key),
                other => return Err(format!("matchExpressions operator {other:?}")),
            });
        }
        Ok(Selector(out))
    }

    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        })
    }
}

/// Commas outside parentheses.
fn split_terms(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn set(s: &str) -> Result<Vec<String>, String> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("invalid set {s:?}: expected (a,b)"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn selectors_as_the_api_server_reads_them() {
        let l = labels(&[("app", "reviews"), ("version", "v1")]);
        for (s, want) in [
            ("", true),
            ("app=reviews", true),
            ("app==reviews,version=v2", false),
            ("app!=ratings", true),
            ("version in (v1, v2)", true),
            ("version notin (v1)", false),
            ("app", true),
            ("!tier", true),
            ("!app", false),
            ("app in (reviews),!tier,version", true),
        ] {
            assert_eq!(Selector::parse(s).unwrap().matches(&l), want, "{s}");
        }
        assert!(Selector::parse("a in b").is_err());
    }
}
