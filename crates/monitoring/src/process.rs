//! The `process_*` metrics Prometheus' Go client exports for every Go program, which the Istio
//! Control Plane dashboard and Kiali read for istiod (CPU, memory, file descriptors), from
//! `/proc/self` at each scrape. Linux only; elsewhere they stay 0.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The process gauges; [`ProcessMetrics::update`] before rendering.
#[derive(Clone, Debug, Default)]
pub struct ProcessMetrics {
    cpu_seconds: Gauge<f64, AtomicU64>,
    resident_memory: Gauge,
    virtual_memory: Gauge,
    open_fds: Gauge,
    max_fds: Gauge,
    start_time: Gauge<f64, AtomicU64>,
}

impl ProcessMetrics {
    pub fn register(registry: &mut Registry) -> ProcessMetrics {
        let m = ProcessMetrics::default();
        // Gauges under the Go client's names (`_total` kept: it is not a prometheus-client counter).
        registry.register(
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
            m.cpu_seconds.clone(),
        );
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            m.resident_memory.clone(),
        );
        registry.register(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            m.virtual_memory.clone(),
        );
        registry.register(
            "process_open_fds",
            "Number of open file descriptors.",
            m.open_fds.clone(),
        );
        registry.register(
            "process_max_fds",
            "Maximum number of open file descriptors.",
            m.max_fds.clone(),
        );
        registry.register(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            m.start_time.clone(),
        );
        m
    }

    /// Reads `/proc/self` into the gauges; what cannot be read is left as it was.
    pub fn update(&self) {
        let Some(stat) = read_stat() else { return };
        // Linux reports times in clock ticks (USER_HZ, 100 on the platforms Istio runs on) and
        // resident memory in pages (4 KiB there).
        const TICKS: f64 = 100.0;
        const PAGE: i64 = 4096;
        self.cpu_seconds.set((stat.utime + stat.stime) as f64 / TICKS);
        self.virtual_memory.set(stat.vsize);
        self.resident_memory.set(stat.rss_pages * PAGE);
        if let Some(boot) = boot_time() {
            self.start_time.set(boot as f64 + stat.starttime as f64 / TICKS);
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(dir.count() as i64);
        }
        if let Some(max) = max_open_files() {
            self.max_fds.set(max);
        }
    }
}

struct Stat {
    utime: u64,
    stime: u64,
    starttime: u64,
    vsize: i64,
    rss_pages: i64,
}

/// `/proc/self/stat`: fields after the `(comm)`, which may itself hold spaces.
fn read_stat() -> Option<Stat> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_stat(&text)
}

fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime 15, starttime 22, vsize 23, rss 24
    let at = |n: usize| f.get(n - 3).copied();
    Some(Stat {
        utime: at(14)?.parse().ok()?,
        stime: at(15)?.parse().ok()?,
        starttime: at(22)?.parse().ok()?,
        vsize: at(23)?.parse().ok()?,
        rss_pages: at(24)?.parse().ok()?,
    })
}

fn boot_time() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

fn max_open_files() -> Option<i64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_command_with_spaces() {
        let s = parse_stat(
            "42 (pilot disc) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 8 0 12345 1048576 512 \
             18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0",
        )
        .unwrap();
        assert_eq!(
            (s.utime, s.stime, s.starttime, s.vsize, s.rss_pages),
            (250, 50, 12345, 1_048_576, 512)
        );
    }

    #[test]
    fn this_process_is_measured() {
        let mut registry = Registry::default();
        let m = ProcessMetrics::register(&mut registry);
        m.update();
        let text = crate::render(&registry).unwrap();
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
        };
        assert!(value("process_resident_memory_bytes") > 0.0);
        assert!(value("process_open_fds") >= 3.0);
        assert!(value("process_max_fds") >= value("process_open_fds"));
        assert!(value("process_start_time_seconds") > 1.0e9);
    }
}
