//! Where the agent's settings come from besides flags: environment variables and files, each behind
//! a small trait so tests pass a map instead of touching the process, plus the typed parsers that
//! turn a variable into a value or a [`ConfigError`] naming the variable.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::ConfigError;

/// Environment variables.
pub trait Env {
    /// The value of `name`, `None` when unset (or not UTF-8).
    fn var(&self, name: &str) -> Option<String>;
    /// Every variable, for prefix scans (`ISTIO_META_*`, `XDS_HEADER_*`).
    fn vars(&self) -> Vec<(String, String)>;
}

/// The process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }

    fn vars(&self) -> Vec<(String, String)> {
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect()
    }
}

impl Env for BTreeMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }

    fn vars(&self) -> Vec<(String, String)> {
        self.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

impl Env for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }

    fn vars(&self) -> Vec<(String, String)> {
        let mut vars: Vec<_> = self.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        vars.sort();
        vars
    }
}

/// Files the agent reads at start (mesh config, pod labels and annotations).
pub trait Files {
    /// The file's text; `Ok(None)` when it does not exist.
    fn read(&self, path: &Path) -> std::io::Result<Option<String>>;
}

/// The real file system (relative paths resolve against the working directory, as in Istio).
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFiles;

impl Files for RealFiles {
    fn read(&self, path: &Path) -> std::io::Result<Option<String>> {
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(Some(text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl Files for BTreeMap<PathBuf, String> {
    fn read(&self, path: &Path) -> std::io::Result<Option<String>> {
        Ok(self.get(path).cloned())
    }
}

/// Typed reads of one variable. Settings Istio's injector would turn into env vars are also looked
/// up in `proxyMetadata` of the effective ProxyConfig, so a mesh file works without an injector.
pub(crate) struct Vars<'a> {
    env: &'a dyn Env,
    proxy_metadata: BTreeMap<String, String>,
}

impl<'a> Vars<'a> {
    pub(crate) fn new(env: &'a dyn Env) -> Self {
        Vars {
            env,
            proxy_metadata: BTreeMap::new(),
        }
    }

    pub(crate) fn with_proxy_metadata(mut self, proxy_metadata: &BTreeMap<String, String>) -> Self {
        self.proxy_metadata = proxy_metadata.clone();
        self
    }

    /// The raw value: env first, then proxyMetadata. Empty counts as unset, as in Istio.
    pub(crate) fn get(&self, name: &str) -> Option<String> {
        self.env
            .var(name)
            .filter(|v| !v.is_empty())
            .or_else(|| self.proxy_metadata.get(name).cloned().filter(|v| !v.is_empty()))
    }

    pub(crate) fn string(&self, name: &str, default: &str) -> String {
        self.get(name).unwrap_or_else(|| default.to_owned())
    }

    /// Go's `strconv.ParseBool`: 1, t, T, TRUE, true, True and their false forms.
    pub(crate) fn bool(&self, name: &'static str, default: bool) -> Result<bool, ConfigError> {
        let Some(v) = self.get(name) else {
            return Ok(default);
        };
        parse_bool(&v).ok_or_else(|| ConfigError::env(name, &v, "not a boolean (want true or false)"))
    }

    pub(crate) fn port(&self, name: &'static str, default: u16) -> Result<u16, ConfigError> {
        let Some(v) = self.get(name) else {
            return Ok(default);
        };
        v.trim()
            .parse::<u16>()
            .map_err(|_| ConfigError::env(name, &v, "not a port number (0-65535)"))
    }

    pub(crate) fn u32(&self, name: &'static str, default: u32) -> Result<u32, ConfigError> {
        let Some(v) = self.get(name) else {
            return Ok(default);
        };
        v.trim()
            .parse::<u32>()
            .map_err(|_| ConfigError::env(name, &v, "not a non-negative integer"))
    }

    /// A size or count that must be at least 1 (as pilot-discovery reads `ISTIO_GPRC_MAXRECVMSGSIZE`).
    pub(crate) fn positive(&self, name: &'static str, default: usize) -> Result<usize, ConfigError> {
        let Some(v) = self.get(name) else {
            return Ok(default);
        };
        match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(ConfigError::env(name, &v, "not a positive integer")),
        }
    }

    pub(crate) fn duration(&self, name: &'static str, default: Duration) -> Result<Duration, ConfigError> {
        let Some(v) = self.get(name) else {
            return Ok(default);
        };
        model::duration::parse(&v).ok_or_else(|| ConfigError::env(name, &v, "not a duration (e.g. 5s, 100ms, 1m30s)"))
    }

    pub(crate) fn ip(&self, name: &'static str) -> Result<Option<IpAddr>, ConfigError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        v.trim()
            .parse::<IpAddr>()
            .map(Some)
            .map_err(|_| ConfigError::env(name, &v, "not an IP address"))
    }

    /// Every variable whose name starts with `prefix`, the prefix cut off, in name order.
    pub(crate) fn with_prefix(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out: Vec<_> = self
            .env
            .vars()
            .into_iter()
            .filter_map(|(k, v)| k.strip_prefix(prefix).map(|rest| (rest.to_owned(), v)))
            .filter(|(k, _)| !k.is_empty())
            .collect();
        out.sort();
        out
    }
}

pub(crate) fn parse_bool(v: &str) -> Option<bool> {
    match v.trim() {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// `XDS_HEADERS` (`k=v,k2=v2`) and Istio's `XDS_HEADER_<name>=<value>` variables: extra headers on
/// the agent's upstream xDS stream.
pub(crate) fn xds_headers(vars: &Vars<'_>) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut headers = BTreeMap::new();
    for (name, value) in vars.with_prefix("XDS_HEADER_") {
        headers.insert(name, value);
    }
    if let Some(list) = vars.get("XDS_HEADERS") {
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let Some((k, v)) = entry.split_once('=') else {
                return Err(ConfigError::env(
                    "XDS_HEADERS",
                    &list,
                    &format!("entry {entry:?} is not key=value"),
                ));
            };
            let k = k.trim();
            if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
                return Err(ConfigError::env(
                    "XDS_HEADERS",
                    &list,
                    &format!("{k:?} is not a valid header name"),
                ));
            }
            headers.insert(k.to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn env_wins_over_proxy_metadata_and_empty_is_unset() {
        let e = env(&[("A", "env"), ("EMPTY", "")]);
        let md = env(&[("A", "md"), ("B", "md"), ("EMPTY", "md")]);
        let vars = Vars::new(&e).with_proxy_metadata(&md);
        assert_eq!(vars.get("A").as_deref(), Some("env"));
        assert_eq!(vars.get("B").as_deref(), Some("md"));
        assert_eq!(vars.get("EMPTY").as_deref(), Some("md"));
        assert_eq!(vars.get("C"), None);
    }

    #[test]
    fn typed_reads_name_the_variable() {
        let e = env(&[("P", "70000"), ("B", "yes"), ("D", "10x"), ("IP", "1.2.3"), ("OK", "T")]);
        let vars = Vars::new(&e);
        let err = vars.port("P", 1).unwrap_err().to_string();
        assert!(err.contains("P=\"70000\"") && err.contains("port"), "{err}");
        assert!(vars.bool("B", false).unwrap_err().to_string().contains("boolean"));
        assert!(
            vars.duration("D", Duration::ZERO)
                .unwrap_err()
                .to_string()
                .contains("D=\"10x\"")
        );
        assert!(vars.ip("IP").unwrap_err().to_string().contains("not an IP address"));
        assert!(vars.bool("OK", false).unwrap());
        assert_eq!(vars.port("UNSET", 15021).unwrap(), 15021);
        for bad in ["0", "-1", "4MiB"] {
            let e = env(&[("N", bad)]);
            let err = Vars::new(&e).positive("N", 1).unwrap_err().to_string();
            assert!(
                err.contains(&format!("N={bad:?}")) && err.contains("positive integer"),
                "{err}"
            );
        }
        assert_eq!(
            Vars::new(&env(&[("N", "33554432")])).positive("N", 1).unwrap(),
            32 << 20
        );
    }

    #[test]
    fn xds_headers_from_list_and_prefix() {
        let e = env(&[("XDS_HEADERS", "Tenant=a, x-b = 2 ,"), ("XDS_HEADER_x-c", "3")]);
        let headers = xds_headers(&Vars::new(&e)).unwrap();
        assert_eq!(headers, env(&[("tenant", "a"), ("x-b", "2"), ("x-c", "3")]));
    }

    #[test]
    fn bad_xds_headers_are_rejected() {
        for bad in ["novalue", "=v", "bad name=v"] {
            let e = env(&[("XDS_HEADERS", bad)]);
            let err = xds_headers(&Vars::new(&e)).unwrap_err().to_string();
            assert!(err.starts_with("XDS_HEADERS="), "{bad}: {err}");
        }
    }
}
