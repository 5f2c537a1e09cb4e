//! Logging set up from Istio's `--log_output_level` (`default:info,ads:debug`): each binary maps
//! Istio's scopes onto its own tracing targets.

use tracing_subscriber::EnvFilter;

/// Istio scope -> tracing targets, per binary.
pub type Scopes = &'static [(&'static str, &'static [&'static str])];

/// The filter directives for `levels`; errors name the bad entry.
pub fn directives(levels: &str, scopes: Scopes) -> Result<String, String> {
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
        } else if let Some((_, targets)) = scopes.iter().find(|(s, _)| *s == scope) {
            extra.extend(targets.iter().map(|t| format!("{t}={level}")));
        }
    }
    let mut out = vec![default];
    out.extend(extra);
    Ok(out.join(","))
}

/// Installs the global subscriber (stderr; JSON lines with `--log_as_json`). `RUST_LOG` wins.
/// Colours only on a terminal: a container's log (`kubectl logs`) or a file gets plain text, as
/// Istio's.
pub fn init(levels: &str, json: bool, scopes: Scopes) -> Result<(), String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => v,
        _ => directives(levels, scopes)?,
    };
    let filter = EnvFilter::try_new(&filter).map_err(|e| format!("log filter {filter:?}: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
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

    const SCOPES: Scopes = &[("ads", &["xds_server"]), ("model", &["model", "push_index"])];

    #[test]
    fn istio_levels() {
        assert_eq!(directives("default:info", SCOPES).unwrap(), "info");
        assert_eq!(
            directives("default:warn,ads:debug", SCOPES).unwrap(),
            "warn,xds_server=debug"
        );
        assert_eq!(
            directives("model:error", SCOPES).unwrap(),
            "info,model=error,push_index=error"
        );
        assert_eq!(directives("unknownscope:debug", SCOPES).unwrap(), "info");
        assert!(directives("ads", SCOPES).is_err());
        assert!(directives("default:loud", SCOPES).is_err());
    }
}
