//! The agent's logging from Istio's `--log_output_level` (`default:info,xds:debug`): Istio's
//! scopes map onto the agent's modules.

use tracing_subscriber::EnvFilter;

fn targets(scope: &str) -> &'static [&'static str] {
    match scope {
        "xds" | "xdsproxy" => &["agent::xds_proxy"],
        "envoy" => &["agent::envoy"],
        "healthcheck" | "status" => &["agent::status"],
        "bootstrap" => &["agent::bootstrap", "agent::config"],
        _ => &[],
    }
}

/// The filter directives for `levels`; errors name the bad entry.
pub fn directives(levels: &str) -> Result<String, String> {
    let mut default = "info".to_owned();
    let mut extra = Vec::new();
    for entry in levels.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (scope, level) = entry
            .split_once(':')
            .ok_or_else(|| format!("--log_output_level: {entry:?} is not scope:level (e.g. default:info)"))?;
        let level = match level {
            "debug" | "info" | "warn" | "error" => level,
            "warning" => "warn",
            "none" => "off",
            other => return Err(format!("--log_output_level: unknown level {other:?} for scope {scope}")),
        };
        if scope == "default" || scope == "all" {
            default = level.to_owned();
        } else {
            extra.extend(targets(scope).iter().map(|t| format!("{t}={level}")));
        }
    }
    let mut out = vec![default];
    out.extend(extra);
    Ok(out.join(","))
}

pub fn init(levels: &str, json: bool) -> Result<(), String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => v,
        _ => directives(levels)?,
    };
    let filter = EnvFilter::try_new(&filter).map_err(|e| format!("log filter {filter:?}: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let res = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
    res.map_err(|e| format!("logging: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn istio_levels() {
        assert_eq!(directives("default:info").unwrap(), "info");
        assert_eq!(
            directives("default:warn,xds:debug").unwrap(),
            "warn,agent::xds_proxy=debug"
        );
        assert!(directives("xds").is_err());
        assert!(directives("default:loud").is_err());
    }
}
