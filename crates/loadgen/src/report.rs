//! The figures of a run: latency percentiles, pilot-discovery's memory and CPU time read from
//! `/proc/<pid>`, and the report as a human table and as one JSON object.

use std::time::Duration;

use serde_json::{Value, json};

use crate::ramp::RampStep;

/// Clock ticks per second of `/proc/<pid>/stat` times (Linux `USER_HZ`).
const CLK_TCK: f64 = 100.0;

/// The outcome of one run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Report {
    pub scenario: String,
    pub delta: bool,
    /// The simulated proxies' client: `full` or `light`.
    pub client: String,
    pub proxies: usize,
    pub services: usize,
    pub endpoints: usize,
    /// Namespaces of the mesh, and whether a Sidecar scopes each (`namespace`) or not (`none`).
    pub namespaces: usize,
    pub sidecar_scope: String,
    /// Proxies that completed the scenario.
    pub converged: usize,
    /// Connect to last handshake ACK, whatever the scenario.
    pub connect_p50_ms: Option<f64>,
    pub connect_p99_ms: Option<f64>,
    /// The scenario's own measure (for `connect`, the same as `connect_*`).
    pub convergence_p50_ms: Option<f64>,
    pub convergence_p99_ms: Option<f64>,
    pub convergence_max_ms: Option<f64>,
    /// The raw limit of the change: the same responses replayed with no generation (see
    /// [`crate::raw`]).
    pub raw_p50_ms: Option<f64>,
    pub raw_p99_ms: Option<f64>,
    /// Encoded size of the replayed push, per proxy.
    pub raw_push_bytes: Option<u64>,
    /// `ramp`: one row per step.
    pub steps: Vec<RampStep>,
    /// `ramp`: why it stopped (`max-rss-mb`, `max-p99-ms`, `proxies`, `errors`).
    pub ramp_stop: Option<String>,
    /// Sustained endpoint churn (`--churn-rate`): changes made, and their rate over the window.
    pub churn_changes: Option<usize>,
    pub churn_rate_achieved: Option<f64>,
    /// Write to the last proxy's ACK of the new endpoints, over all changes, and over those of the
    /// first and the last 10 s (a growing queue shows as a last p99 well above the first).
    pub churn_lag_p50_ms: Option<f64>,
    pub churn_lag_p99_ms: Option<f64>,
    pub churn_lag_first10s_p99_ms: Option<f64>,
    pub churn_lag_last10s_p99_ms: Option<f64>,
    /// The last write to every proxy holding the final endpoints of every service.
    pub churn_settle_ms: Option<f64>,
    /// The pilot-discovery executable started, if one was.
    pub discovery_bin: Option<String>,
    /// Peak resident memory (VmHWM) of pilot-discovery, when it runs as a child.
    pub discovery_rss_mb: Option<f64>,
    /// utime + stime of pilot-discovery, when it runs as a child.
    pub discovery_cpu_s: Option<f64>,
    /// utime + stime of this process (the simulated proxies share the machine with pilot-discovery).
    pub loadgen_cpu_s: Option<f64>,
    /// Sum of the encoded sizes of every response the proxies received.
    pub bytes_sent: u64,
    /// config-change and one-change endpoint-churn: bytes each proxy received for the change
    /// (mean over the proxies that ACKed it).
    pub change_bytes_per_proxy: Option<f64>,
    /// The same change: pilot-discovery's CPU seconds from the write to the last proxy's ACK,
    /// per proxy that received it (`/proc` counts in 10 ms ticks, so small runs read 0).
    pub change_cpu_s_per_proxy: Option<f64>,
    pub errors: Vec<String>,
    pub wall_s: f64,
}

impl Report {
    /// Convergence p99 over the raw limit's p99.
    pub fn raw_ratio(&self) -> Option<f64> {
        match (self.convergence_p99_ms, self.raw_p99_ms) {
            (Some(c), Some(r)) if r > 0.0 => Some(c / r),
            _ => None,
        }
    }

    /// One JSON object (the `--json` line).
    pub fn to_json(&self) -> Value {
        let steps: Vec<Value> = self
            .steps
            .iter()
            .map(|s| json!({"proxies": s.proxies, "rss_mb": s.rss_mb, "p99_ms": s.p99_ms}))
            .collect();
        json!({
            "scenario": self.scenario,
            "delta": self.delta,
            "client": self.client,
            "proxies": self.proxies,
            "services": self.services,
            "endpoints": self.endpoints,
            "namespaces": self.namespaces,
            "sidecar_scope": self.sidecar_scope,
            "converged": self.converged,
            "connect_p50_ms": self.connect_p50_ms,
            "connect_p99_ms": self.connect_p99_ms,
            "convergence_p50_ms": self.convergence_p50_ms,
            "convergence_p99_ms": self.convergence_p99_ms,
            "convergence_max_ms": self.convergence_max_ms,
            "raw_p50_ms": self.raw_p50_ms,
            "raw_p99_ms": self.raw_p99_ms,
            "raw_ratio": self.raw_ratio(),
            "raw_push_bytes": self.raw_push_bytes,
            "steps": steps,
            "ramp_stop": self.ramp_stop,
            "churn_changes": self.churn_changes,
            "churn_rate_achieved": self.churn_rate_achieved,
            "churn_lag_p50_ms": self.churn_lag_p50_ms,
            "churn_lag_p99_ms": self.churn_lag_p99_ms,
            "churn_lag_first10s_p99_ms": self.churn_lag_first10s_p99_ms,
            "churn_lag_last10s_p99_ms": self.churn_lag_last10s_p99_ms,
            "churn_settle_ms": self.churn_settle_ms,
            "discovery_bin": self.discovery_bin,
            "discovery_rss_mb": self.discovery_rss_mb,
            "discovery_cpu_s": self.discovery_cpu_s,
            "loadgen_cpu_s": self.loadgen_cpu_s,
            "bytes_sent": self.bytes_sent,
            "change_bytes_per_proxy": self.change_bytes_per_proxy,
            "change_cpu_s_per_proxy": self.change_cpu_s_per_proxy,
            "errors": self.errors.len(),
            "wall_s": self.wall_s,
        })
    }

    /// A human table.
    pub fn table(&self) -> String {
        let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1} ms"));
        let opt = |v: Option<f64>, unit: &str| v.map_or("-".to_owned(), |v| format!("{v:.2} {unit}"));
        let rows = [
            (
                "scenario",
                format!(
                    "{} ({}, {} client)",
                    self.scenario,
                    if self.delta { "delta" } else { "sotw" },
                    self.client
                ),
            ),
            (
                "mesh",
                format!(
                    "{} services x {} endpoints, {} namespace(s), Sidecar scope {}",
                    self.services, self.endpoints, self.namespaces, self.sidecar_scope
                ),
            ),
            ("proxies converged", format!("{} / {}", self.converged, self.proxies)),
            ("connect p50", ms(self.connect_p50_ms)),
            ("connect p99", ms(self.connect_p99_ms)),
            ("convergence p50", ms(self.convergence_p50_ms)),
            ("convergence p99", ms(self.convergence_p99_ms)),
            ("convergence max", ms(self.convergence_max_ms)),
            ("raw p50", ms(self.raw_p50_ms)),
            ("raw p99", ms(self.raw_p99_ms)),
            (
                "p99 / raw p99",
                self.raw_ratio().map_or("-".to_owned(), |r| format!("{r:.2}")),
            ),
            (
                "push per proxy",
                self.raw_push_bytes
                    .map_or("-".to_owned(), |b| format!("{:.2} MB", b as f64 / 1e6)),
            ),
            ("discovery peak RSS", opt(self.discovery_rss_mb, "MB")),
            ("discovery CPU", opt(self.discovery_cpu_s, "s")),
            ("loadgen CPU", opt(self.loadgen_cpu_s, "s")),
            ("bytes received", format!("{:.2} MB", self.bytes_sent as f64 / 1e6)),
            (
                "change bytes per proxy",
                self.change_bytes_per_proxy
                    .map_or("-".to_owned(), |b| format!("{:.1} kB", b / 1e3)),
            ),
            (
                "change CPU per proxy",
                self.change_cpu_s_per_proxy
                    .map_or("-".to_owned(), |s| format!("{:.3} ms", s * 1e3)),
            ),
            ("errors", self.errors.len().to_string()),
            ("wall time", format!("{:.1} s", self.wall_s)),
            (
                "discovery binary",
                self.discovery_bin.clone().unwrap_or_else(|| "-".to_owned()),
            ),
        ];
        let mut out = String::new();
        for (k, v) in rows {
            out.push_str(&format!("{k:<20} {v}\n"));
        }
        if let Some(stop) = &self.ramp_stop {
            out.push_str(&format!("{:<20} {stop}\n", "ramp stopped by"));
            out.push_str(&format!("{:>10} {:>12} {:>12}\n", "proxies", "RSS", "connect p99"));
            for s in &self.steps {
                let rss = s.rss_mb.map_or("-".to_owned(), |v| format!("{v:.1} MB"));
                out.push_str(&format!("{:>10} {rss:>12} {:>12}\n", s.proxies, ms(s.p99_ms)));
            }
        }
        if let Some(changes) = self.churn_changes {
            let rate = self.churn_rate_achieved.map_or("-".to_owned(), |r| format!("{r:.1}/s"));
            let rows = [
                ("churn changes", format!("{changes} at {rate}")),
                ("churn lag p50", ms(self.churn_lag_p50_ms)),
                ("churn lag p99", ms(self.churn_lag_p99_ms)),
                ("  first 10 s p99", ms(self.churn_lag_first10s_p99_ms)),
                ("  last 10 s p99", ms(self.churn_lag_last10s_p99_ms)),
                ("churn settle", ms(self.churn_settle_ms)),
            ];
            for (k, v) in rows {
                out.push_str(&format!("{k:<20} {v}\n"));
            }
        }
        for e in self.errors.iter().take(5) {
            out.push_str(&format!("error: {e}\n"));
        }
        out
    }
}

/// The `q` quantile (0..=1) of `samples` by nearest rank, in milliseconds.
pub(crate) fn percentile_ms(samples: &[Duration], q: f64) -> Option<f64> {
    let mut v: Vec<Duration> = samples.to_vec();
    v.sort();
    let last = v.len().checked_sub(1)?;
    let rank = ((q * v.len() as f64).ceil() as usize).saturating_sub(1).min(last);
    Some(v[rank].as_secs_f64() * 1e3)
}

/// Peak resident set (VmHWM) of process `pid` in MB.
pub(crate) fn peak_rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_status_kb(&status, "VmHWM:").map(|kb| kb as f64 / 1024.0)
}

/// Resident set (VmRSS) of process `pid` now, in MB.
pub(crate) fn rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_status_kb(&status, "VmRSS:").map(|kb| kb as f64 / 1024.0)
}

/// CPU time (utime + stime) of process `pid` in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_ticks(&stat).map(|t| t as f64 / CLK_TCK)
}

/// A `kB` field of `/proc/<pid>/status`, e.g. `VmHWM:`.
fn parse_status_kb(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// utime + stime, fields 14 and 15 of `/proc/<pid>/stat` (the command name may hold spaces).
fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let s: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(percentile_ms(&s, 0.5), Some(50.0));
        assert_eq!(percentile_ms(&s, 0.99), Some(99.0));
        assert_eq!(percentile_ms(&s, 1.0), Some(100.0));
        assert_eq!(percentile_ms(&[], 0.5), None);
    }

    #[test]
    fn parses_proc_files() {
        let status = "Name:\tpilot\nVmPeak:\t 2000 kB\nVmHWM:\t   51200 kB\nVmRSS:\t 100 kB\n";
        assert_eq!(parse_status_kb(status, "VmHWM:"), Some(51200));
        assert_eq!(parse_status_kb(status, "VmRSS:"), Some(100));
        assert_eq!(parse_status_kb(status, "VmSwap:"), None);
        let stat = "42 (pilot disc) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 8 0 100 0 0";
        assert_eq!(parse_stat_ticks(stat), Some(300));
    }

    #[test]
    fn the_json_line_carries_the_issue_fields() {
        let r = Report {
            scenario: "connect".into(),
            delta: false,
            proxies: 3,
            services: 2,
            endpoints: 1,
            converged: 2,
            connect_p50_ms: Some(1.0),
            connect_p99_ms: Some(2.0),
            convergence_p50_ms: Some(1.0),
            convergence_p99_ms: Some(2.0),
            convergence_max_ms: Some(2.0),
            discovery_rss_mb: None,
            discovery_cpu_s: Some(0.5),
            loadgen_cpu_s: None,
            bytes_sent: 10,
            errors: vec!["proxy 2: refused".into()],
            wall_s: 1.0,
            ..Default::default()
        };
        let j = r.to_json();
        for key in [
            "proxies",
            "services",
            "scenario",
            "convergence_p50_ms",
            "convergence_p99_ms",
        ] {
            assert!(!j[key].is_null(), "{key}");
        }
        assert!(j["raw_p99_ms"].is_null() && j["raw_ratio"].is_null() && j["discovery_rss_mb"].is_null());
        assert_eq!(j["steps"], json!([]));
        assert_eq!(j["bytes_sent"], 10);
        assert_eq!(j["errors"], 1);
        let table = r.table();
        assert!(
            table.contains("2 / 3") && table.contains("error: proxy 2: refused"),
            "{table}"
        );
    }

    #[test]
    fn raw_and_ramp_figures_reach_the_json_and_the_table() {
        let r = Report {
            scenario: "ramp".into(),
            convergence_p99_ms: Some(300.0),
            raw_p99_ms: Some(200.0),
            raw_push_bytes: Some(1_500_000),
            steps: vec![
                RampStep {
                    proxies: 500,
                    rss_mb: Some(80.0),
                    p99_ms: Some(20.0),
                },
                RampStep {
                    proxies: 1000,
                    rss_mb: None,
                    p99_ms: Some(45.5),
                },
            ],
            ramp_stop: Some("max-p99-ms".into()),
            discovery_bin: Some("/x/target/release/pilot-discovery".into()),
            ..Default::default()
        };
        let j = r.to_json();
        assert_eq!(j["raw_p99_ms"], 200.0);
        assert_eq!(j["raw_ratio"], 1.5);
        assert_eq!(j["raw_push_bytes"], 1_500_000);
        assert_eq!(j["steps"][1], json!({"proxies": 1000, "rss_mb": null, "p99_ms": 45.5}));
        assert_eq!(j["ramp_stop"], "max-p99-ms");
        assert_eq!(j["discovery_bin"], "/x/target/release/pilot-discovery");
        let table = r.table();
        assert!(table.contains("p99 / raw p99        1.50"), "{table}");
        assert!(table.contains("push per proxy       1.50 MB"), "{table}");
        assert!(table.contains("ramp stopped by      max-p99-ms"), "{table}");
        assert!(table.contains("      1000            -      45.5 ms"), "{table}");
        assert!(!table.contains("churn"), "{table}");
        assert!(j["churn_changes"].is_null() && j["churn_settle_ms"].is_null());
    }

    #[test]
    fn churn_figures_reach_the_json_and_the_table() {
        let r = Report {
            scenario: "endpoint-churn".into(),
            churn_changes: Some(6000),
            churn_rate_achieved: Some(99.96),
            churn_lag_p50_ms: Some(150.0),
            churn_lag_p99_ms: Some(400.0),
            churn_lag_first10s_p99_ms: Some(300.0),
            churn_lag_last10s_p99_ms: Some(450.0),
            churn_settle_ms: Some(210.5),
            ..Default::default()
        };
        let j = r.to_json();
        assert_eq!(j["churn_changes"], 6000);
        assert_eq!(j["churn_rate_achieved"], 99.96);
        assert_eq!(j["churn_lag_first10s_p99_ms"], 300.0);
        assert_eq!(j["churn_lag_last10s_p99_ms"], 450.0);
        assert_eq!(j["churn_settle_ms"], 210.5);
        let table = r.table();
        assert!(table.contains("churn changes        6000 at 100.0/s"), "{table}");
        assert!(table.contains("  last 10 s p99      450.0 ms"), "{table}");
        assert!(table.contains("churn settle         210.5 ms"), "{table}");
    }

    #[test]
    fn reads_this_process() {
        let pid = std::process::id();
        assert!(peak_rss_mb(pid).is_some_and(|mb| mb > 0.0));
        assert!(rss_mb(pid).is_some_and(|mb| mb > 0.0));
        assert!(cpu_seconds(pid).is_some());
    }
}
