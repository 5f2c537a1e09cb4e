//! Durations as Istio config writes them: protobuf JSON (`"5s"`, `"0.250s"`) and Go's
//! `time.ParseDuration` forms (`"100ms"`, `"1m30s"`, `"1h"`), which Istio flags and env use too.

use std::time::Duration;

/// Parses a duration; `None` for malformed or negative input.
pub fn parse(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s.is_empty() || s.starts_with('-') {
        return None;
    }
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_end == 0 {
            return None;
        }
        let value: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += value * scale;
    }
    if !total.is_finite() || total > 315_576_000_000.0 {
        return None;
    }
    Some(Duration::from_secs_f64(total))
}

/// Formats as protobuf JSON seconds (`"1.5s"`).
pub fn to_proto_string(d: Duration) -> String {
    let nanos = d.subsec_nanos();
    if nanos == 0 {
        format!("{}s", d.as_secs())
    } else {
        let frac = format!("{nanos:09}");
        format!("{}.{}s", d.as_secs(), frac.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proto_and_go_forms() {
        assert_eq!(parse("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse("0.250s"), Some(Duration::from_millis(250)));
        assert_eq!(parse("100ms"), Some(Duration::from_millis(100)));
        assert_eq!(parse("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse("0"), Some(Duration::ZERO));
        assert_eq!(parse("-1s"), None);
        assert_eq!(parse("5"), None);
        assert_eq!(parse("5x"), None);
        assert_eq!(parse(""), None);
        assert_eq!(to_proto_string(Duration::from_millis(1500)), "1.5s");
        assert_eq!(to_proto_string(Duration::from_secs(3)), "3s");
    }
}
