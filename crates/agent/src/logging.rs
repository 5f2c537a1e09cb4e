//! pilot-agent's logging: Istio's logging flags (`pkg/log` `Options.AttachCobraFlags`, which
//! pilot-agent attaches to its root command, so that every subcommand takes them, `proxy` and
//! `istio-iptables` alike) and its log scopes.

use monitoring::logging::Scopes;

pub const SCOPES: Scopes = &[
    ("xds", &["agent::xds_proxy"]),
    ("xdsproxy", &["agent::xds_proxy"]),
    ("envoy", &["agent::envoy"]),
    ("healthcheck", &["agent::status"]),
    ("status", &["agent::status"]),
    ("bootstrap", &["agent::bootstrap", "agent::config"]),
];

/// Istio's logging flags, named and defaulted as `pkg/log`'s.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct LogArgs {
    /// The agent's own log levels: `<scope>:<level>,...`, e.g. `default:info,xds:debug`.
    #[arg(long = "log_output_level", default_value = "default:info")]
    pub output_level: String,

    /// Log as JSON lines (the agent, and Envoy under `proxy`).
    #[arg(long = "log_as_json", default_value_t = false)]
    pub as_json: bool,

    /// Accepted for compatibility with Istio's logging flags; unused.
    #[arg(long = "log_caller", default_value = "")]
    pub caller: String,

    /// Accepted for compatibility with Istio's logging flags; unused.
    #[arg(long = "log_stacktrace_level", default_value = "default:none")]
    pub stacktrace_level: String,

    /// Accepted for compatibility with Istio's logging flags; the agent logs to stderr.
    #[arg(long = "log_target", default_value = "stdout")]
    pub target: Vec<String>,
}

impl Default for LogArgs {
    fn default() -> Self {
        LogArgs {
            output_level: "default:info".into(),
            as_json: false,
            caller: String::new(),
            stacktrace_level: "default:none".into(),
            target: vec!["stdout".into()],
        }
    }
}

impl LogArgs {
    /// Installs the process's logger with these levels and format.
    pub fn init(&self) -> Result<(), String> {
        init(&self.output_level, self.as_json)
    }
}

pub fn init(levels: &str, json: bool) -> Result<(), String> {
    monitoring::logging::init(levels, json, SCOPES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        log: LogArgs,
    }

    #[test]
    fn defaults_and_names_are_istios() {
        assert_eq!(Cli::try_parse_from(["x"]).unwrap().log, LogArgs::default());
        let log = Cli::try_parse_from([
            "x",
            "--log_output_level=default:debug",
            "--log_as_json",
            "--log_target",
            "stderr",
        ])
        .unwrap()
        .log;
        assert_eq!(log.output_level, "default:debug");
        assert!(log.as_json);
        assert_eq!(log.target, ["stderr"]);
    }
}
