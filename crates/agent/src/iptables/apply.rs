//! Applying and removing a capture on a real kernel: `iptables-restore --noflush` per family,
//! then the TPROXY routes; cleanup deletes what the configuration would add to built-in chains
//! (Istio's `BuildCleanupV4/V6`, rule by rule, best effort), every `ISTIO_*` chain and jump left
//! in `iptables-save` output, and the TPROXY routes.

use std::io::Write as _;
use std::process::{Command, Stdio};

use thiserror::Error;

use super::builder::{Family, RuleSet, undo_built_in};
use super::tproxy::{IpCommand, Routes, is_exists_error};

/// Applying or removing rules failed.
#[derive(Debug, Error)]
pub enum ApplyError {
    #[error(
        "cannot run {cmd} (hint: are iptables and iproute2 installed and are we root with CAP_NET_ADMIN?): {source}"
    )]
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

/// The iptables binaries of one flavour (`--iptables-version`) and family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    pub iptables: String,
    pub save: String,
    pub restore: String,
}

pub fn binaries(version: &str, family: Family) -> Binaries {
    let base = match family {
        Family::V4 => "iptables",
        Family::V6 => "ip6tables",
    };
    let base = match version {
        "legacy" | "nft" => format!("{base}-{version}"),
        _ => base.to_string(),
    };
    Binaries {
        save: format!("{base}-save"),
        restore: format!("{base}-restore"),
        iptables: base,
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
/// namespace (`ip netns exec`), which the kernel tests use.
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

    fn run_ip(&self, command: &IpCommand) -> Result<String, ApplyError> {
        let args: Vec<&str> = command.args.iter().map(String::as_str).collect();
        match self.run("ip", &args, None) {
            Err(ApplyError::Failed { ref stderr, .. }) if command.ignore_exists && is_exists_error(stderr) => {
                Ok(String::new())
            }
            other => other,
        }
    }

    /// `iptables-save` / `ip6tables-save` output (all tables, or one with `-t`).
    pub fn save(&self, family: Family, table: Option<&str>) -> Result<String, ApplyError> {
        let save = binaries(&self.iptables_version, family).save;
        match table {
            Some(t) => self.run(&save, &["-t", t], None),
            None => self.run(&save, &[], None),
        }
    }

    /// Removes what `rules` and `routes` would add and any `ISTIO_*` chain and jump left from
    /// another configuration; running it twice is harmless.
    pub fn cleanup(&self, rules: &RuleSet, routes: &Routes) -> Result<(), ApplyError> {
        for (family, family_rules) in rules.families() {
            let bins = binaries(&self.iptables_version, family);
            for args in undo_built_in(family_rules) {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                // Best effort, as Istio's: most of these are not there.
                let _ = self.run(&bins.iptables, &args, None);
            }
            let plan = cleanup_plan(&self.save(family, None)?);
            if !plan.is_empty() {
                self.run(&bins.restore, &["--noflush"], Some(&plan))?;
            }
        }
        for command in &routes.cleanup {
            // `ip rule add` stacks duplicates; a bound keeps a broken `ip` from looping forever.
            for _ in 0..64 {
                if self.run_ip(command).is_err() {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Replaces any earlier capture with this one: iptables rules per family, then the routes.
    pub fn apply(&self, rules: &RuleSet, routes: &Routes) -> Result<(), ApplyError> {
        self.cleanup(rules, routes)?;
        self.run(
            &binaries(&self.iptables_version, Family::V4).restore,
            &["--noflush"],
            Some(&rules.restore_v4()),
        )?;
        if let Some(v6) = rules.restore_v6() {
            self.run(
                &binaries(&self.iptables_version, Family::V6).restore,
                &["--noflush"],
                Some(&v6),
            )?;
        }
        for command in &routes.setup {
            self.run_ip(command)?;
        }
        Ok(())
    }
}
