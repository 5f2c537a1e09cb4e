//! `pilot-agent istio-iptables`: Istio's traffic capture for a sidecar. Builds the rules per IP
//! family (`rules`, with `dns` and `tproxy`) through Istio's rule builder (`builder`), prints them
//! (`--dry-run`) or applies them and the TPROXY routes (`apply`), and removes them
//! (`--cleanup-only`, also done before every apply).

pub mod apply;
pub mod builder;
pub mod config;
pub mod dns;
pub mod rules;
#[cfg(test)]
mod tests;
pub mod tproxy;

use std::process::ExitCode;

pub use apply::{ApplyError, Target, cleanup_plan};
pub use builder::{Family, RuleSet};
pub use config::{Config, ConfigError, DnsServers, IptablesArgs};
use tproxy::Routes;

/// Everything a configuration puts in place: iptables rules and the routes beside them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capture {
    pub rules: RuleSet,
    pub routes: Routes,
}

impl Capture {
    pub fn new(cfg: &Config) -> Self {
        Self {
            rules: rules::build(cfg),
            routes: tproxy::routes(cfg),
        }
    }

    /// What `--dry-run` prints: each family's restore input, then the `ip` commands, as comments.
    pub fn dry_run(&self) -> String {
        let mut out = format!("# iptables-restore --noflush\n{}", self.rules.restore_v4());
        if let Some(v6) = self.rules.restore_v6() {
            out.push_str(&format!("# ip6tables-restore --noflush\n{v6}"));
        }
        for command in &self.routes.setup {
            out.push_str(&format!("# {command}\n"));
        }
        out
    }

    /// What `--cleanup-only --dry-run` prints.
    pub fn dry_run_cleanup(&self) -> String {
        let mut out = String::new();
        for (family, rules) in self.rules.families() {
            let bin = apply::binaries("", family).iptables;
            for args in builder::undo_built_in(rules) {
                out.push_str(&format!("# {bin} {}\n", args.join(" ")));
            }
            out.push_str(&format!("# {bin}: delete every ISTIO_* chain and jump to one\n"));
        }
        for command in &self.routes.cleanup {
            out.push_str(&format!("# {command}\n"));
        }
        out
    }
}

/// The subcommand: exit 2 on bad flags, 1 when iptables fails.
pub fn run(args: IptablesArgs) -> ExitCode {
    tracing::info!("Istio config:\n{}", args.variables());
    let dns_servers = if args.redirect_dns && !args.capture_all_dns {
        DnsServers::from_resolv_conf(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default())
    } else {
        DnsServers::default()
    };
    let cfg = match Config::from_args(&args, dns_servers) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let capture = Capture::new(&cfg);
    let target = Target {
        iptables_version: args.iptables_version.clone(),
        netns: None,
    };
    if args.cleanup_only {
        if args.dry_run {
            print!("{}", capture.dry_run_cleanup());
            return ExitCode::SUCCESS;
        }
        return report(target.cleanup(&capture.rules, &capture.routes));
    }
    if args.dry_run {
        print!("{}", capture.dry_run());
        return ExitCode::SUCCESS;
    }
    report(target.apply(&capture.rules, &capture.routes))
}

fn report(result: Result<(), ApplyError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
