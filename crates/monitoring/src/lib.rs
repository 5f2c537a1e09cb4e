//! Istio's telemetry conventions shared by pilot-discovery and pilot-agent: logging from
//! `--log_output_level` ([`logging`]) and metric exposition.
//!
//! Metric exposition: prometheus-client writes OpenMetrics, where a counter's samples are
//! `<name>_total`; istiod exports counters without that suffix (its OpenTelemetry exporter runs
//! with `WithoutCounterSuffixes` to stay compatible with OpenCensus-era dashboards), so
//! `pilot_xds_pushes{type="cds"}` is what Istio users query. This rewrites OpenMetrics text into
//! the Prometheus text format with Istio's names.
#![warn(unreachable_pub)]
#![forbid(unsafe_code)]

pub mod logging;
pub mod process;
pub mod throttle;

use std::collections::HashSet;

use prometheus_client::registry::Registry;

/// Content type of [`render`]'s output: the Prometheus text format.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A registry in the Prometheus text format with Istio's metric names.
pub fn render(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(istio_text(&out))
}

pub fn istio_text(openmetrics: &str) -> String {
    let counters: HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(name) = line.strip_prefix("# TYPE ").and_then(|l| l.strip_suffix(" unknown")) {
            // OpenMetrics' `unknown` is the text format's `untyped`.
            out.push_str(&format!("# TYPE {name} untyped\n"));
            continue;
        }
        let rewritten = if line.starts_with('#') {
            None
        } else {
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            line[..name_end]
                .strip_suffix("_total")
                .filter(|base| counters.contains(base))
                .map(|base| format!("{base}{}", &line[name_end..]))
        };
        match rewritten {
            Some(l) => out.push_str(&l),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_lose_total_suffix_gauges_unchanged() {
        let om = "# HELP pilot_xds_pushes Pushes.\n# TYPE pilot_xds_pushes counter\npilot_xds_pushes_total{type=\"cds\"} 3\n\
                  # HELP pilot_xds Connected.\n# TYPE pilot_xds gauge\npilot_xds{version=\"1\"} 2\n\
                  # TYPE pilot_total_xds_rejects counter\npilot_total_xds_rejects_total 0\n# EOF\n";
        let text = istio_text(om);
        assert!(text.contains("pilot_xds_pushes{type=\"cds\"} 3\n"), "{text}");
        assert!(text.contains("pilot_total_xds_rejects 0\n"), "{text}");
        assert!(text.contains("pilot_xds{version=\"1\"} 2\n"), "{text}");
        assert!(!text.contains("# EOF"));
        assert!(!text.contains("_total{"));
    }

    #[test]
    fn unknown_type_is_untyped_and_units_are_dropped() {
        assert_eq!(
            istio_text("# TYPE a unknown\n# UNIT a seconds\na 1\n# EOF\n"),
            "# TYPE a untyped\na 1\n"
        );
    }
}
