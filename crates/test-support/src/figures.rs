//! What the figure programs (`agent-figures`, `dns-figures`) share: percentiles, rounding and a
//! process's memory from `/proc`.

use anyhow::Context;

/// Nearest-rank percentile `p` (0..=100) of sorted values; NaN when there are none.
pub fn rank(sorted: &[f64], p: f64) -> f64 {
    let n = sorted.len();
    let i = ((p / 100.0) * n as f64).ceil() as usize;
    sorted.get(i.clamp(1, n.max(1)) - 1).copied().unwrap_or(f64::NAN)
}

/// A sorted copy.
pub fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

/// To 0.1 of the unit: the clock's precision is not the measurement's.
pub fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// `VmRSS` and `VmHWM` (peak RSS) of a process, in KiB.
pub fn memory_kib(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("no {name}"))?;
        let kib = line.trim_start_matches(name).trim().trim_end_matches("kB").trim();
        Ok(kib.parse()?)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_and_own_memory() {
        let s = sorted(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(s, [1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(
            (rank(&s, 0.0), rank(&s, 50.0), rank(&s, 99.0), rank(&s, 100.0)),
            (1.0, 3.0, 5.0, 5.0)
        );
        assert!(rank(&[], 50.0).is_nan());
        assert_eq!(round(1.26), 1.3);
        let (rss, hwm) = memory_kib(std::process::id()).unwrap();
        assert!(rss > 0 && hwm >= rss);
    }
}
