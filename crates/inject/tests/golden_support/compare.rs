//! Comparison of an injected Pod with a golden as objects, after what Istio's
//! `normalizeAndCompareDeployments` and Go's typed round trip do: the status annotation and the
//! env `fieldRef.apiVersion` are dropped, nulls and empty maps/lists (Go's `omitempty`, `{}`
//! for struct fields) are dropped, resource quantities are canonical (`2000m` is `2`), and the
//! `proxy.istio.io/overrides` annotation is compared as the JSON it holds, an env var's empty
//! value and a probe's zero counts are absent (`omitempty` fields of Go's types).

use serde_json::{Map, Value as Json};

pub fn compare(got: &Json, want: &Json) -> Result<(), String> {
    let (g, w) = (normalize(got), normalize(want));
    match first_diff(&g, &w, String::new()) {
        None => Ok(()),
        Some(d) => Err(d),
    }
}

fn normalize(pod: &Json) -> Json {
    let mut p = pod.clone();
    if let Some(Json::Object(a)) = p.pointer_mut("/metadata/annotations") {
        a.remove("sidecar.istio.io/status");
        if let Some(Json::String(o)) = a.get("proxy.istio.io/overrides")
            && let Ok(v) = serde_json::from_str::<Json>(o)
        {
            a.insert("proxy.istio.io/overrides".into(), v);
        }
    }
    for key in ["containers", "initContainers"] {
        if let Some(Json::Array(cs)) = p.pointer_mut(&format!("/spec/{key}")) {
            for c in cs {
                if let Some(Json::Array(env)) = c.get_mut("env") {
                    for e in env {
                        if let Some(Json::Object(f)) = e.pointer_mut("/valueFrom/fieldRef") {
                            f.remove("apiVersion");
                        }
                        // EnvVar.Value is omitempty
                        if e.get("value") == Some(&Json::String(String::new()))
                            && let Some(o) = e.as_object_mut()
                        {
                            o.remove("value");
                        }
                    }
                }
                // a probe's int32 fields are omitempty
                for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
                    if let Some(Json::Object(pr)) = c.get_mut(probe) {
                        pr.retain(|_, v| v.as_i64() != Some(0));
                    }
                }
            }
        }
    }
    clean(&mut p, "");
    p
}

/// Drops nulls and empty collections; canonical quantities under `limits`/`requests`.
fn clean(v: &mut Json, key: &str) -> bool {
    match v {
        Json::Null => false,
        Json::Object(m) => {
            let quantities = key == "limits" || key == "requests";
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let keep = match m.get_mut(&k) {
                    Some(child) => {
                        if quantities && let Json::String(s) = child {
                            *s = canonical_quantity(s);
                        }
                        if quantities && let Json::Number(n) = child {
                            *child = Json::String(canonical_quantity(&n.to_string()));
                        }
                        clean(child, &k)
                    }
                    None => false,
                };
                if !keep {
                    m.remove(&k);
                }
            }
            !m.is_empty()
        }
        Json::Array(a) => {
            for x in a.iter_mut() {
                clean(x, "");
            }
            !a.is_empty()
        }
        _ => true,
    }
}

/// A quantity as a number of its base unit (`2000m` and `2` are `2`, `1Gi` and `1024Mi` agree).
fn canonical_quantity(q: &str) -> String {
    let suffixes: &[(&str, f64)] = &[
        ("Ki", 1024.0),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    for (s, mul) in suffixes {
        if let Some(n) = q.strip_suffix(s).and_then(|n| n.parse::<f64>().ok()) {
            return format!("{}", n * mul);
        }
    }
    q.parse::<f64>()
        .map(|n| format!("{n}"))
        .unwrap_or_else(|_| q.to_string())
}

fn short(v: Option<&Json>) -> String {
    let s = v.map(|v| v.to_string()).unwrap_or_else(|| "(absent)".into());
    if s.len() > 160 {
        format!(
            "{}...",
            &s[..s.char_indices().nth(157).map(|(i, _)| i).unwrap_or(s.len())]
        )
    } else {
        s
    }
}

fn first_diff(g: &Json, w: &Json, path: String) -> Option<String> {
    match (g, w) {
        (Json::Object(a), Json::Object(b)) => obj_diff(a, b, &path),
        (Json::Array(a), Json::Array(b)) => {
            for (i, (x, y)) in a.iter().zip(b.iter()).enumerate() {
                let name = y
                    .get("name")
                    .or(y.get("mountPath"))
                    .and_then(Json::as_str)
                    .map(|n| format!("[{n}]"))
                    .unwrap_or(format!("/{i}"));
                if let Some(d) = first_diff(x, y, format!("{path}{name}")) {
                    return Some(d);
                }
            }
            if a.len() != b.len() {
                let names = |l: &Vec<Json>| {
                    l.iter()
                        .map(|x| x.get("name").and_then(Json::as_str).unwrap_or("?").to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                };
                return Some(format!(
                    "{path}: {} items, golden {} (got [{}], golden [{}])",
                    a.len(),
                    b.len(),
                    names(a),
                    names(b)
                ));
            }
            None
        }
        _ if g == w => None,
        _ => Some(format!("{path}: got {}, golden {}", short(Some(g)), short(Some(w)))),
    }
}

fn obj_diff(a: &Map<String, Json>, b: &Map<String, Json>, path: &str) -> Option<String> {
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    for k in keys {
        let p = format!("{path}/{k}");
        match (a.get(k), b.get(k)) {
            (Some(x), Some(y)) => {
                if let Some(d) = first_diff(x, y, p) {
                    return Some(d);
                }
            }
            (x, y) => return Some(format!("{p}: got {}, golden {}", short(x), short(y))),
        }
    }
    None
}
