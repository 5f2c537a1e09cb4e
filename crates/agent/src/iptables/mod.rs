//! `pilot-agent istio-iptables`: Istio's traffic capture for a sidecar. Builds the nat rules
//! (`rules`), prints them (`--dry-run`) or applies them with `iptables-restore --noflush`, and
//! removes Istio's chains and jumps (`--cleanup-only`, also done before every apply).

pub mod config;
pub mod rules;
#[cfg(test)]
mod tests;

use std::io::Write as _;
use std::process::{Command, ExitCode, Stdio};

pub use config::{Config, ConfigError, IptablesArgs};
use thiserror::Error;

/// Applying or removing rules failed.
#[derive(Debug, Error)]
pub enum ApplyError {
    #[error("cannot run {cmd} (hint: is iptables installed and are we root with CAP_NET_ADMIN?): {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{cmd} failed ({status}): {stderr}")]
    Failed {
        cmd: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
}

/// The `iptables-save`/`iptables-restore` pair for `--iptables-version`.
pub fn binaries(version: &str) -> (&'static str, &'static str) {
    match version {
        "legacy" => ("iptables-legacy-save", "iptables-legacy-restore"),
        "nft" => ("iptables-nft-save", "iptables-nft-restore"),
        _ => ("iptables-save", "iptables-restore"),
    }
}

/// `iptables-restore --noflush` input that deletes Istio's jumps and flushes and deletes its
/// `ISTIO_*` chains in every table, given `iptables-save` output. Empty when already clean.
pub fn cleanup_plan(saved: &str) -> String {
    let mut out = String::new();
    let mut table = "";
    let (mut deletes, mut chains) = (Vec::new(), Vec::new());
    let flush = |table: &str, deletes: &mut Vec<String>, chains: &mut Vec<String>, out: &mut String| {
        if deletes.is_empty() && chains.is_empty() {
            return;
        }
        out.push_str(&format!("* {table}\n"));
        for d in deletes.drain(..) {
            out.push_str(&d);
            out.push('\n');
        }
        for c in chains.iter() {
            out.push_str(&format!("-F {c}\n"));
        }
        for c in chains.drain(..) {
            out.push_str(&format!("-X {c}\n"));
        }
        out.push_str("COMMIT\n");
    };
    for line in saved.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('*') {
            table = name.trim();
        } else if line == "COMMIT" {
            flush(table, &mut deletes, &mut chains, &mut out);
        } else if let Some(decl) = line.strip_prefix(':') {
            let chain = decl.split_whitespace().next().unwrap_or_default();
            if chain.starts_with("ISTIO_") {
                chains.push(chain.to_string());
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let chain = rule.split_whitespace().next().unwrap_or_default();
            let jumps_to_istio = rule
                .split_whitespace()
                .skip_while(|w| *w != "-j")
                .nth(1)
                .is_some_and(|t| t.starts_with("ISTIO_"));
            if !chain.starts_with("ISTIO_") && jumps_to_istio {
                deletes.push(format!("-D {rule}"));
            }
        }
    }
    out
}

/// Where rules go: the iptables flavour (`--iptables-version`) and optionally a named network
/// namespace (`ip netns exec`), which the kernel test uses.
#[derive(Debug, Clone, Default)]
pub struct Target {
    pub iptables_version: String,
    pub netns: Option<String>,
}

impl Target {
    fn run(&self, bin: &str, args: &[&str], stdin: Option<&str>) -> Result<String, ApplyError> {
        let mut argv: Vec<&str> = Vec::new();
        if let Some(ns) = &self.netns {
            argv.extend(["ip", "netns", "exec", ns.as_str()]);
        }
        argv.push(bin);
        argv.extend_from_slice(args);
        let cmd = argv.join(" ");
        let spawn = |source| ApplyError::Spawn {
            cmd: cmd.clone(),
            source,
        };
        let mut child = Command::new(argv[0])
            .args(&argv[1..])
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn)?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes()).map_err(spawn)?;
        }
        let out = child.wait_with_output().map_err(spawn)?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return Err(ApplyError::Failed {
                cmd,
                status: out.status,
                stderr,
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `iptables-save` output (all tables, or one with `-t`).
    pub fn save(&self, table: Option<&str>) -> Result<String, ApplyError> {
        let (save, _) = binaries(&self.iptables_version);
        match table {
            Some(t) => self.run(save, &["-t", t], None),
            None => self.run(save, &[], None),
        }
    }

    /// Removes Istio's chains and jumps; running it twice is harmless.
    pub fn cleanup(&self) -> Result<(), ApplyError> {
        let plan = cleanup_plan(&self.save(None)?);
        if !plan.is_empty() {
            self.run(binaries(&self.iptables_version).1, &["--noflush"], Some(&plan))?;
        }
        Ok(())
    }

    /// Replaces any earlier capture rules with these.
    pub fn apply(&self, rules: &rules::RuleSet) -> Result<(), ApplyError> {
        self.cleanup()?;
        self.run(
            binaries(&self.iptables_version).1,
            &["--noflush"],
            Some(&rules.to_restore()),
        )?;
        Ok(())
    }
}

/// The subcommand: exit 2 on bad flags, 1 when iptables fails.
pub fn run(args: IptablesArgs) -> ExitCode {
    let dns_servers = if args.redirect_dns && !args.capture_all_dns {
        config::resolv_conf_servers_v4(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default())
    } else {
        Vec::new()
    };
    let cfg = match Config::from_args(&args, dns_servers) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let target = Target {
        iptables_version: args.iptables_version.clone(),
        netns: None,
    };
    if args.cleanup_only {
        if args.dry_run {
            println!("# --cleanup-only --dry-run: would delete Istio's jumps and ISTIO_* chains");
            return ExitCode::SUCCESS;
        }
        return report(target.cleanup());
    }
    let rules = rules::build(&cfg);
    if args.dry_run {
        print!("{}", rules.to_restore());
        return ExitCode::SUCCESS;
    }
    report(target.apply(&rules))
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
