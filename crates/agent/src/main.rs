//! `pilot-agent`: Istio's agent beside every Envoy. Subcommands and flags as Istio's.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use agent::cmd::{request, wait};
use agent::config::{AgentConfig, ProxyArgs};
use agent::proxy::ProxyRuntime;
use agent::status::{KUBE_APP_PROBERS_ENV, KubeAppProbers};
use clap::{CommandFactory, FromArgMatches, Subcommand};

#[derive(Debug, clap::Parser)]
#[command(
    name = "pilot-agent",
    about = "Istio's agent: runs and configures Envoy beside a workload",
    version
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run Envoy and the agent (xDS proxy, status server) for a sidecar or a router (gateway).
    Proxy(Box<ProxyArgs>),
    /// Wait until Envoy is ready (polls the readiness URL).
    Wait(wait::WaitArgs),
    /// Make an HTTP request to Envoy's admin API.
    Request(request::RequestArgs),
    /// Set up Istio's iptables traffic capture (REDIRECT or TPROXY, IPv4 and IPv6) for a sidecar.
    IstioIptables(Box<agent::iptables::IptablesArgs>),
    /// Print build information.
    Version {
        #[arg(short, long)]
        short: bool,
    },
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::Version { short } => {
            let version = env!("CARGO_PKG_VERSION");
            if short {
                println!("{version}");
            } else {
                println!("version.BuildInfo{{Version:\"{version}\", RustVersion:\"rust1.95\", BuildStatus:\"Clean\"}}");
            }
            ExitCode::SUCCESS
        }
        Command::Wait(args) => block_on(wait::run(args)),
        Command::Request(args) => block_on(request::run(args)),
        Command::Proxy(args) => proxy(*args),
        Command::IstioIptables(mut args) => {
            if let Some(sub) = matches.subcommand_matches("istio-iptables") {
                args.apply_additional_env(sub, |var| std::env::var(var).ok());
            }
            if let Err(e) = args.log.init() {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
            agent::iptables::run(*args)
        }
    }
}

/// Everything is checked before anything starts: bad flags or environment exit with 2.
fn proxy(args: ProxyArgs) -> ExitCode {
    if let Err(e) = args.log.init() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let cfg = match AgentConfig::from_process(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let app_probers = match KubeAppProbers::parse(&std::env::var(KUBE_APP_PROBERS_ENV).unwrap_or_default()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = ProxyRuntime {
        envoy_binary: std::env::var_os("ENVOY_BINARY_PATH").map(Into::into),
        hot_restart: agent::envoy::hot_restart_enabled(|k| std::env::var(k).ok()),
        app_probers,
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(agent::proxy::run(cfg, runtime)) {
        Ok(report) => {
            if let Some(r) = report
                && !r.success()
            {
                tracing::warn!(report = %r, "Envoy did not exit cleanly");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn block_on(f: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => match rt.block_on(f) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
