//! Checks shared by every kind, as Istio's `pkg/config/validation/agent` and `pkg/config/labels`:
//! the error collector, ports, protocols, durations, percentages, labels and selectors, `exportTo`,
//! RE2 regexes, unix socket addresses and enum names. Host names are in `hosts`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use super::hosts::is_dns1123_label;
use crate::service::Protocol;

/// Every problem found so far, each as `field.path: reason`.
#[derive(Debug, Default)]
pub(crate) struct Errors(Vec<String>);

impl Errors {
    pub(super) fn add(&mut self, path: &str, reason: impl fmt::Display) {
        self.0.push(format!("{path}: {reason}"));
    }

    /// Records `result`'s error, if any, at `path`.
    pub(super) fn check(&mut self, path: &str, result: Result<(), String>) {
        if let Err(reason) = result {
            self.add(path, reason);
        }
    }

    pub(super) fn into_vec(self) -> Vec<String> {
        self.0
    }
}

pub(crate) type Check = Result<(), String>;

pub(crate) fn validate_port(port: i64) -> Check {
    if (1..=65535).contains(&port) {
        Ok(())
    } else {
        Err(format!("port number {port} must be in the range 1..65535"))
    }
}

pub(crate) fn validate_port_name(name: &str) -> Check {
    if is_dns1123_label(name) {
        Ok(())
    } else {
        Err(format!("invalid port name: {name:?}"))
    }
}

/// Istio's `protocol.Parse`, case-insensitive; `None` for names Istio does not know.
/// `HTTP_PROXY` (sidecar egress only) counts as HTTP.
pub(crate) fn parse_protocol(s: &str) -> Option<Protocol> {
    if s.eq_ignore_ascii_case("http_proxy") {
        return Some(Protocol::Http);
    }
    Some(Protocol::parse(s)).filter(|p| *p != Protocol::Unsupported)
}

/// `ValidateProtocol`: empty (sniffed) or a known protocol.
pub(crate) fn validate_protocol(s: &str) -> Check {
    if s.is_empty() || parse_protocol(s).is_some() {
        Ok(())
    } else {
        Err(format!("unsupported protocol: {s}"))
    }
}

/// `ValidateDuration`: parses, at least 1ms, whole milliseconds.
pub(crate) fn validate_duration(s: &str) -> Result<Duration, String> {
    let d = crate::duration::parse(s).ok_or_else(|| format!("invalid duration {s:?}"))?;
    if d < Duration::from_millis(1) {
        return Err("duration must be greater than 1ms".into());
    }
    if d.as_nanos() % 1_000_000 != 0 {
        return Err("only durations to ms precision are supported".into());
    }
    Ok(d)
}

/// Records the problem with an optional duration field, if any.
pub(crate) fn check_duration(errs: &mut Errors, path: &str, d: Option<&String>) {
    if let Some(d) = d {
        errs.check(path, validate_duration(d).map(|_| ()));
    }
}

/// `ValidatePercent`: an integer percentage in 0..=100.
pub(crate) fn validate_percent(v: i64) -> Check {
    if (0..=100).contains(&v) {
        Ok(())
    } else {
        Err(format!("percentage {v} is not in range 0..100"))
    }
}

/// `validatePercentage`: a `Percent` of 0, or in [0.0001, 100].
pub(crate) fn validate_percentage(v: f64) -> Check {
    if !(0.0..=100.0).contains(&v) || (v > 0.0 && v < 0.0001) {
        return Err(format!("percentage {v} is neither 0.0, nor in range [0.0001, 100.0]"));
    }
    Ok(())
}

/// `ValidateUnixAddress`: the part after `unix://`, an absolute file path or an abstract `@name`.
pub(crate) fn validate_unix_address(addr: &str) -> Check {
    if addr.is_empty() {
        return Err("unix address must not be empty".into());
    }
    if addr.starts_with('@') {
        return Ok(());
    }
    if !addr.starts_with('/') {
        return Err(format!("{addr} is not an absolute path or an abstract socket (@name)"));
    }
    if addr.ends_with('/') {
        return Err(format!("{addr} is a directory, not a socket file"));
    }
    Ok(())
}

/// Kubernetes label key: optional DNS subdomain prefix and `/`, then a name of at most 63 characters.
fn validate_label_key(k: &str) -> Check {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix
        && (p.is_empty() || p.len() > 253 || !p.split('.').all(is_dns1123_label))
    {
        return Err(format!("invalid tag key: {k:?}"));
    }
    if !is_qualified_name(name) {
        return Err(format!("invalid tag key: {k:?}"));
    }
    if name.len() > 63 {
        return Err(format!("invalid tag key: {k:?} (name is too long)"));
    }
    Ok(())
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`
fn is_qualified_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// `labels.Instance.Validate`: Kubernetes label keys and values (values may be empty).
pub(crate) fn check_labels(errs: &mut Errors, path: &str, labels: &BTreeMap<String, String>) {
    for (k, v) in labels {
        errs.check(path, validate_label_key(k));
        if !v.is_empty() && !is_qualified_name(v) {
            errs.add(path, format!("invalid tag value: {v:?}"));
        }
    }
}

/// A workload selector's labels (`ValidateAlphaWorkloadSelector`, `validateWorkloadSelector` and the CRD):
/// no empty keys, no wildcards, values of at most 63 characters.
pub(crate) fn check_selector(errs: &mut Errors, path: &str, labels: &BTreeMap<String, String>) {
    for (k, v) in labels {
        if k.is_empty() {
            errs.add(path, format!("empty key is not supported in selector: \"{k}={v}\""));
        }
        if k.contains('*') || v.contains('*') {
            errs.add(path, format!("wildcard is not supported in selector: \"{k}={v}\""));
        }
        if v.len() > 63 {
            errs.add(path, format!("selector value {v:?} is longer than 63 characters"));
        }
    }
}

/// `validateExportTo`: `.`, `*`, or namespace names, no duplicates; `*` alone; `~` only on ServiceEntry,
/// and alone; a DestinationRule with a workload selector exports only to its own namespace.
pub(crate) fn check_export_to(
    errs: &mut Errors,
    path: &str,
    namespace: &str,
    export_to: &[String],
    is_service_entry: bool,
    dr_with_selector: bool,
) {
    if export_to.is_empty() {
        return;
    }
    let mut set = BTreeSet::new();
    for e in export_to {
        let key = if e == "." { namespace } else { e.as_str() };
        if set.contains(key) {
            if key != e {
                errs.add(
                    path,
                    format!("duplicate entries in exportTo: . and current namespace {namespace}"),
                );
            } else {
                errs.add(path, format!("duplicate entries in exportTo for entry {e}"));
            }
            continue;
        }
        if is_service_entry && e == "~" {
            set.insert(key);
            continue;
        }
        match key {
            "." | "*" => {
                set.insert(key);
            }
            "~" => errs.add(path, "exportTo ~ (none) is not allowed for Istio configuration objects"),
            _ if is_dns1123_label(key) => {
                set.insert(key);
            }
            _ => errs.add(
                path,
                format!("only .,*, or a valid DNS 1123 label is allowed as exportTo entry, got {e:?}"),
            ),
        }
    }
    if dr_with_selector && !set.is_empty() {
        if !set.contains(namespace) {
            errs.add(
                path,
                "destination rule with workload selector cannot have exportTo beyond current namespace",
            );
        } else if set.len() > 1 {
            errs.add(
                path,
                "destination rule with workload selector cannot have multiple entries in exportTo",
            );
        }
    }
    if set.contains("*") && export_to.len() > 1 {
        errs.add(
            path,
            "cannot have both public (*) and non-public exportTo values for a resource",
        );
    }
    if set.contains("~") && export_to.len() > 1 {
        errs.add(path, "cannot export service entry to no one (~) and someone");
    }
}

/// Longest regex Istio accepts (`validateStringRegexp`); RE2's program size check comes after.
const MAX_REGEX_LEN: usize = 1024;

/// A regex is valid when Envoy will accept it: at most 1024 characters (Istio's own limit), and
/// compiled by RE2 as Envoy compiles it, within the program size pilot-agent's bootstrap allows
/// (`re2.max_program_size.error_level` 32768). RE2 rules, not Rust's: repetition counts up to 1000,
/// `\Q...\E`, no lookaround, no backreferences.
pub fn validate_regex(re: &str) -> Result<(), String> {
    if re.len() > MAX_REGEX_LEN {
        return Err(format!("regex is too large, max length allowed is {MAX_REGEX_LEN}"));
    }
    re2::check(re, re2::ISTIO_MAX_PROGRAM_SIZE).map(|_| ()).map_err(|e| {
        format!(
            "invalid regex {:?}: {e}; Istio uses RE2 style regex-based match (https://github.com/google/re2/wiki/Syntax)",
            shortened(re, 128)
        )
    })
}

/// `s` cut to at most `max` bytes (on a character boundary), marked when cut.
fn shortened(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return s.into();
    }
    let end = (0..=max).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
    format!("{}...", &s[..end]).into()
}

/// One of the names an enum field accepts.
pub(crate) fn check_enum(errs: &mut Errors, path: &str, value: Option<&String>, allowed: &[&str]) {
    if let Some(v) = value
        && !allowed.contains(&v.as_str())
    {
        errs.add(
            path,
            format!("unknown value {v:?}, expected one of {}", allowed.join(", ")),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_protocols() {
        assert!(validate_port(1).is_ok() && validate_port(65535).is_ok());
        assert!(validate_port(0).is_err() && validate_port(65536).is_err());
        assert!(validate_port_name("http-web").is_ok() && validate_port_name("HTTP").is_ok());
        assert!(validate_port_name("@").is_err() && validate_port_name("").is_err());
        assert!(
            validate_protocol("").is_ok()
                && validate_protocol("grpc-web").is_ok()
                && validate_protocol("HTTP_PROXY").is_ok()
        );
        assert!(validate_protocol("smtp").is_err());
    }

    #[test]
    fn durations_and_percentages() {
        assert_eq!(validate_duration("1ms"), Ok(Duration::from_millis(1)));
        assert_eq!(validate_duration("0.3s"), Ok(Duration::from_millis(300)));
        assert!(validate_duration("0s").unwrap_err().contains("greater than 1ms"));
        assert!(validate_duration("1.0005s").unwrap_err().contains("ms precision"));
        assert!(validate_duration("soon").unwrap_err().contains("invalid duration"));
        assert!(validate_percent(0).is_ok() && validate_percent(100).is_ok());
        assert!(validate_percent(-1).is_err() && validate_percent(101).is_err());
        assert!(
            validate_percentage(0.0).is_ok()
                && validate_percentage(0.0001).is_ok()
                && validate_percentage(100.0).is_ok()
        );
        assert!(
            validate_percentage(0.00001).is_err()
                && validate_percentage(100.5).is_err()
                && validate_percentage(-1.0).is_err()
        );
    }

    #[test]
    fn labels_and_selectors() {
        let mut errs = Errors::default();
        let good = BTreeMap::from([
            ("app".to_owned(), "reviews".to_owned()),
            ("k8s.io/x_y".to_owned(), String::new()),
        ]);
        check_labels(&mut errs, "labels", &good);
        assert!(errs.into_vec().is_empty());
        let mut errs = Errors::default();
        let bad = BTreeMap::from([
            ("-app".to_owned(), "ok".to_owned()),
            ("ok".to_owned(), "bad value".to_owned()),
        ]);
        check_labels(&mut errs, "spec.labels", &bad);
        let errs = errs.into_vec();
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs[0].starts_with("spec.labels: invalid tag key"));

        let mut errs = Errors::default();
        check_selector(&mut errs, "sel", &BTreeMap::from([("val".to_owned(), "*".to_owned())]));
        check_selector(&mut errs, "sel", &BTreeMap::from([(String::new(), "x".to_owned())]));
        let errs = errs.into_vec();
        assert!(errs[0].contains("wildcard is not supported in selector"));
        assert!(errs[1].contains("empty key"));
    }

    fn export_errors(ns: &str, list: &[&str], se: bool, dr_sel: bool) -> Vec<String> {
        let mut errs = Errors::default();
        let list: Vec<String> = list.iter().map(|s| s.to_string()).collect();
        check_export_to(&mut errs, "spec.exportTo", ns, &list, se, dr_sel);
        errs.into_vec()
    }

    #[test]
    fn export_to_rules() {
        assert!(export_errors("ns", &[".", "other"], false, false).is_empty());
        assert!(export_errors("ns", &["*"], false, false).is_empty());
        assert!(export_errors("ns", &["~"], true, false).is_empty());
        assert!(export_errors("ns", &["~"], false, false)[0].contains("not allowed"));
        assert!(export_errors("ns", &["~", "a"], true, false)[0].contains("no one (~)"));
        assert!(export_errors("ns", &["*", "a"], false, false)[0].contains("public (*)"));
        assert!(export_errors("ns", &["ns", "."], false, false)[0].contains(". and current namespace"));
        assert!(export_errors("ns", &["a", "a"], false, false)[0].contains("duplicate entries"));
        assert!(export_errors("ns", &["Bad_ns"], false, false)[0].contains("DNS 1123"));
        assert!(export_errors("ns", &["."], false, true).is_empty());
        assert!(export_errors("ns", &["other"], false, true)[0].contains("beyond current namespace"));
        assert!(export_errors("ns", &[".", "other"], false, true)[0].contains("multiple entries"));
    }

    #[test]
    fn regexes_are_re2() {
        assert!(validate_regex("^/api/v[0-9]+/.*$").is_ok());
        assert!(validate_regex("(?i)foo|bar").is_ok());
        assert!(validate_regex("foo(?=bar)").unwrap_err().contains("RE2"));
        assert!(validate_regex(r"(a)\\1").is_ok());
        assert!(validate_regex(r"(a)\1").is_err());
        assert!(validate_regex("[").is_err());
        assert!(validate_regex(&"a".repeat(1025)).unwrap_err().contains("too large"));
        // RE2's rules, not Rust's (issue 9's probe): repetition above 1000 refused, \Q..\E taken.
        assert!(
            validate_regex("/a{1001}")
                .unwrap_err()
                .contains("invalid repetition size")
        );
        assert!(validate_regex("/a{1000}").is_ok());
        assert!(validate_regex(r"/api/\Q(v1)\E/.*").is_ok());
        assert!(
            validate_regex("(abcdefghijklmnopqrstuvwxyz0123456789){1000}")
                .unwrap_err()
                .contains("program size")
        );
    }

    #[test]
    fn unix_addresses() {
        assert!(validate_unix_address("/var/run/sock").is_ok());
        assert!(validate_unix_address("@abstract").is_ok());
        assert!(validate_unix_address("relative").is_err());
        assert!(validate_unix_address("/dir/").is_err());
        assert!(validate_unix_address("").is_err());
    }
}
