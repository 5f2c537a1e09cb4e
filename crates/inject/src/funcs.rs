//! The functions of Istio's injection templates: Istio's `InjectionFuncmap`
//! (`pkg/kube/inject/template.go`) and the sprig functions the templates call (`default`,
//! `quote`, `join`, `list`, `append`, `trunc`, `trimAll`, `nindent`, ...). Istio's own win where
//! both define one (`indent`, `contains`, `toYaml`), as Istio adds its map after sprig's.

use std::collections::BTreeMap;

use serde_json::Value as Json;

use crate::json_order::{PROXY_CONFIG_ORDER, to_ordered_json};
use crate::mesh::clean_proxy_config;
use crate::template::funcs::{Func, FuncCtx, go_quote, one};
use crate::template::value::{Kind, Value};
use crate::yaml::to_yaml;

pub(crate) fn lookup(name: &str) -> Option<Func> {
    // Istio adds its map after sprig's: its functions win where both define one
    istio(name)
        .or_else(|| istio_data(name))
        .or_else(|| sprig_values(name))
        .or_else(|| sprig_strings(name))
}

/// Istio's `InjectionFuncmap`: the Pod, ports, annotations and strings.
fn istio(name: &str) -> Option<Func> {
    Some(match name {
        "formatDuration" => |_, a| Ok(Value::Str(format_duration(&one(a, "formatDuration")?.to_text()))),
        "isset" => |_, a| match a {
            [Value::Map(m), k] => Ok(Value::Bool(m.entries.contains_key(&k.to_text()))),
            [_, _] => Ok(Value::Bool(false)),
            _ => Err("isset takes a map and a key".into()),
        },
        "excludeInboundPort" => |_, a| match a {
            [port, excluded] => Ok(Value::Str(exclude_inbound_port(&port.to_text(), &strval(excluded)))),
            _ => Err("excludeInboundPort takes a port and a list".into()),
        },
        "includeInboundPorts" => |_, a| Ok(Value::Str(container_ports(one(a, "includeInboundPorts")?, |_| true))),
        "applicationPorts" => |_, a| {
            Ok(Value::Str(container_ports(one(a, "applicationPorts")?, |c| {
                c.field("Name").to_text() != "istio-proxy"
            })))
        },
        "kubevirtInterfaces" | "excludeInterfaces" => |_, a| Ok(Value::Str(strval(one(a, "interfaces")?))),
        "annotation" => |_, a| match a {
            [meta, name, default] => Ok(match meta.field("Annotations").index(name) {
                Ok(Value::Str(s)) => Value::Str(s),
                _ => Value::Str(sprint_value(default)),
            }),
            _ => Err("annotation takes metadata, a name and a default".into()),
        },
        "valueOrDefault" => |_, a| match a {
            [v, d] => Ok(if matches!(v, Value::Nil | Value::Zero) || *v == Value::str("") {
                d.clone()
            } else {
                v.clone()
            }),
            _ => Err("valueOrDefault takes two arguments".into()),
        },
        "indent" => |_, a| match a {
            [n, s] => Ok(Value::Str(istio_indent(n.as_int().unwrap_or(0), &strval(s)))),
            _ => Err("indent takes a width and a string".into()),
        },
        "directory" => |_, a| {
            let p = strval(one(a, "directory")?);
            Ok(Value::Str(
                p.rfind('/').map(|i| p[..=i].to_string()).unwrap_or_default(),
            ))
        },
        "contains" => |_, a| match a {
            [needle, haystack] => Ok(Value::Bool(strval(haystack).contains(&strval(needle)))),
            _ => Err("contains takes two strings".into()),
        },
        "toLower" | "lower" => |_, a| Ok(Value::Str(strval(one(a, "toLower")?).to_lowercase())),
        "upper" | "toUpper" => |_, a| Ok(Value::Str(strval(one(a, "upper")?).to_uppercase())),
        "appendMultusNetwork" => |_, a| match a {
            [existing, net] => Ok(Value::Str(append_multus_network(&strval(existing), &strval(net)))),
            _ => Err("appendMultusNetwork takes two strings".into()),
        },
        "env" => env,
        "otelResourceAttributes" => |_, a| match a {
            [mc, anns, labels, ns, containers] => Ok(Value::Str(crate::otel::resource_attributes(
                mc, anns, labels, ns, containers,
            ))),
            _ => Err("otelResourceAttributes takes five arguments".into()),
        },
        _ => return None,
    })
}

/// Istio's `InjectionFuncmap`: JSON, YAML, protobuf and maps.
fn istio_data(name: &str) -> Option<Func> {
    Some(match name {
        "toJSON" => |_, a| {
            let v = one(a, "toJSON")?;
            Ok(Value::Str(if matches!(v, Value::Nil | Value::Zero) {
                "{}".into()
            } else {
                v.to_json().to_string()
            }))
        },
        "fromJSON" => |_, a| {
            Ok(match serde_json::from_str::<Json>(&strval(one(a, "fromJSON")?)) {
                Ok(j) => Value::from_json(&j),
                Err(_) => Value::str("{}"),
            })
        },
        "structToJSON" => |_, a| {
            let v = one(a, "structToJSON")?;
            Ok(Value::Str(match v {
                Value::Nil => "{}".into(),
                v => to_ordered_json(&v.to_json(), crate::json_order::go_struct_order),
            }))
        },
        "protoToJSON" => |_, a| {
            Ok(Value::Str(match one(a, "protoToJSON")? {
                Value::Struct(s) if s.kind == Kind::ProxyConfig => {
                    to_ordered_json(&clean_proxy_config(&Json::Object(s.json.clone())), |k| {
                        PROXY_CONFIG_ORDER.iter().position(|o| *o == k)
                    })
                }
                Value::Nil | Value::Zero => "{}".into(),
                v => v.to_json().to_string(),
            }))
        },
        "toYaml" => |_, a| Ok(Value::Str(to_yaml(&one(a, "toYaml")?.to_json()))),
        "omit" => |_, a| {
            let (dict, keys) = a.split_first().ok_or("omit needs a map")?;
            let keys: Vec<String> = keys.iter().map(strval).collect();
            let mut m = string_map(dict);
            m.retain(|k, _| !keys.contains(k));
            Ok(str_dict(m))
        },
        "strdict" => |_, a| {
            let mut m = BTreeMap::new();
            for pair in a.chunks(2) {
                m.insert(strval(&pair[0]), pair.get(1).map(strval).unwrap_or_default());
            }
            Ok(str_dict(m))
        },
        "toJsonMap" => |_, a| Ok(Value::Str(Value::map(merge_maps(a)).to_json().to_string())),
        "mergeMaps" => |_, a| {
            Ok(if a.is_empty() {
                Value::Nil
            } else {
                Value::map(merge_maps(a))
            })
        },
        "omitNil" => |_, a| Ok(omit_nil(one(a, "omitNil")?).unwrap_or(Value::Nil)),
        _ => return None,
    })
}

/// sprig's: defaults, lists, maps, quoting.
fn sprig_values(name: &str) -> Option<Func> {
    Some(match name {
        "default" => |_, a| match a {
            [d] => Ok(d.clone()),
            [d, v, ..] => Ok(if v.is_empty() { d.clone() } else { v.clone() }),
            [] => Err("default needs an argument".into()),
        },
        "empty" => |_, a| Ok(Value::Bool(one(a, "empty")?.is_empty())),
        "toString" => |_, a| Ok(Value::Str(strval(one(a, "toString")?))),
        "list" => |_, a| Ok(Value::list(a.to_vec())),
        "append" | "push" => |_, a| match a {
            [Value::List(l), v] => {
                let mut l = l.as_ref().clone();
                l.push(v.clone());
                Ok(Value::list(l))
            }
            [Value::Nil | Value::Zero, v] => Ok(Value::list(vec![v.clone()])),
            [other, _] => Err(format!("cannot append to {}", other.type_name())),
            _ => Err("append takes a list and a value".into()),
        },
        "dict" => |_, a| {
            let mut m = BTreeMap::new();
            for pair in a.chunks(2) {
                m.insert(strval(&pair[0]), pair.get(1).cloned().unwrap_or(Value::str("")));
            }
            Ok(Value::map(m))
        },
        "join" => |_, a| match a {
            [sep, list] => Ok(Value::Str(strslice(list).join(&strval(sep)))),
            _ => Err("join takes a separator and a list".into()),
        },
        "quote" => |_, a| {
            let q: Vec<String> = a
                .iter()
                .filter(|v| **v != Value::Nil)
                .map(|v| go_quote(&strval(v)))
                .collect();
            Ok(Value::Str(q.join(" ")))
        },
        "squote" => |_, a| {
            let q: Vec<String> = a
                .iter()
                .filter(|v| **v != Value::Nil)
                .map(|v| format!("'{}'", strval(v)))
                .collect();
            Ok(Value::Str(q.join(" ")))
        },
        _ => return None,
    })
}

/// sprig's: string cutting and indenting.
fn sprig_strings(name: &str) -> Option<Func> {
    Some(match name {
        "trunc" => |_, a| match a {
            [n, s] => {
                let (n, s) = (n.as_int().unwrap_or(0), strval(s));
                let len = s.len() as i64;
                let cut = |i: i64| usize::try_from(i).unwrap_or(0);
                Ok(Value::Str(match n {
                    n if n < 0 && -n < len => s.get(cut(len + n)..).unwrap_or_default().to_string(),
                    n if n >= 0 && len > n => s.get(..cut(n)).unwrap_or_default().to_string(),
                    _ => s,
                }))
            }
            _ => Err("trunc takes a length and a string".into()),
        },
        "trimAll" => |_, a| match a {
            [cut, s] => {
                let cut: Vec<char> = strval(cut).chars().collect();
                Ok(Value::Str(strval(s).trim_matches(cut.as_slice()).to_string()))
            }
            _ => Err("trimAll takes a cutset and a string".into()),
        },
        "trim" => |_, a| Ok(Value::Str(strval(one(a, "trim")?).trim().to_string())),
        "trimPrefix" => |_, a| match a {
            [p, s] => Ok(Value::Str(
                strval(s)
                    .strip_prefix(strval(p).as_str())
                    .map(str::to_string)
                    .unwrap_or_else(|| strval(s)),
            )),
            _ => Err("trimPrefix takes two strings".into()),
        },
        "trimSuffix" => |_, a| match a {
            [p, s] => Ok(Value::Str(
                strval(s)
                    .strip_suffix(strval(p).as_str())
                    .map(str::to_string)
                    .unwrap_or_else(|| strval(s)),
            )),
            _ => Err("trimSuffix takes two strings".into()),
        },
        "hasPrefix" => |_, a| match a {
            [p, s] => Ok(Value::Bool(strval(s).starts_with(&strval(p)))),
            _ => Err("hasPrefix takes two strings".into()),
        },
        "hasSuffix" => |_, a| match a {
            [p, s] => Ok(Value::Bool(strval(s).ends_with(&strval(p)))),
            _ => Err("hasSuffix takes two strings".into()),
        },
        "replace" => |_, a| match a {
            [old, new, s] => Ok(Value::Str(strval(s).replace(&strval(old), &strval(new)))),
            _ => Err("replace takes three strings".into()),
        },
        "nindent" => |_, a| match a {
            [n, s] => Ok(Value::Str(format!(
                "\n{}",
                sprig_indent(n.as_int().unwrap_or(0), &strval(s))
            ))),
            _ => Err("nindent takes a width and a string".into()),
        },
        _ => return None,
    })
}

/// istiod's environment variable, or the default (Istio's `env`).
fn env(ctx: &FuncCtx<'_>, a: &[Value]) -> Result<Value, String> {
    match a {
        [k, d] => Ok(Value::Str(
            ctx.env
                .get(&strval(k))
                .filter(|v| !v.is_empty())
                .cloned()
                .unwrap_or_else(|| strval(d)),
        )),
        _ => Err("env takes a name and a default".into()),
    }
}

/// sprig's `strval`: a string as is, anything else as `fmt.Sprint` writes it.
pub(crate) fn strval(v: &Value) -> String {
    match v {
        Value::Nil => String::new(),
        other => other.to_text(),
    }
}

/// `fmt.Sprint(v)` (a nil interface is `<nil>`).
fn sprint_value(v: &Value) -> String {
    match v {
        Value::Nil => "<nil>".into(),
        other => other.to_text(),
    }
}

fn strslice(v: &Value) -> Vec<String> {
    match v {
        Value::List(l) => l.iter().filter(|v| **v != Value::Nil).map(strval).collect(),
        Value::Nil | Value::Zero => Vec::new(),
        other => vec![strval(other)],
    }
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    match v {
        Value::Map(m) => m.entries.iter().map(|(k, v)| (k.clone(), strval(v))).collect(),
        _ => BTreeMap::new(),
    }
}

fn str_dict(m: BTreeMap<String, String>) -> Value {
    Value::map(m.into_iter().map(|(k, v)| (k, Value::Str(v))).collect())
}

fn merge_maps(a: &[Value]) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for m in a {
        for (k, v) in string_map(m) {
            out.insert(k, Value::Str(v));
        }
    }
    out
}

/// Istio's `excludeInboundPort`: adds the port to the comma-separated list unless present.
pub(crate) fn exclude_inbound_port(port: &str, excluded: &str) -> String {
    let port = port.trim();
    if port.is_empty() || port == "0" {
        return excluded.to_string();
    }
    let mut out = Vec::new();
    for p in excluded.split(',') {
        if p == port {
            return excluded.to_string();
        }
        let p = p.trim();
        if !p.is_empty() {
            out.push(p.to_string());
        }
    }
    out.push(port.to_string());
    out.join(",")
}

/// The TCP container ports of the containers that `include` keeps, comma-separated.
fn container_ports(containers: &Value, include: fn(&Value) -> bool) -> String {
    let Value::List(list) = containers else {
        return String::new();
    };
    let mut parts = Vec::new();
    for c in list.iter().filter(|c| include(c)) {
        if let Value::List(ports) = c.field("Ports") {
            for p in ports.iter() {
                let proto = p.field("Protocol").to_text();
                if proto != "UDP" && proto != "SCTP" {
                    parts.push(p.field("ContainerPort").to_text());
                }
            }
        }
    }
    parts.join(",")
}

/// Istio's `indent`: every line but the first gets `n` spaces.
fn istio_indent(n: i64, s: &str) -> String {
    let pad = " ".repeat(usize::try_from(n).unwrap_or(0));
    s.split('\n')
        .enumerate()
        .map(|(i, l)| if i > 0 { format!("{pad}{l}") } else { l.to_string() })
        .collect::<Vec<_>>()
        .join("\n")
}

/// sprig's `indent`: every line gets `n` spaces.
fn sprig_indent(n: i64, s: &str) -> String {
    let pad = " ".repeat(usize::try_from(n).unwrap_or(0));
    format!("{pad}{}", s.replace('\n', &format!("\n{pad}")))
}

/// Istio's `appendMultusNetwork`: adds the istio-cni network to a Multus networks annotation,
/// a comma-separated list or a JSON list.
pub(crate) fn append_multus_network(existing: &str, net: &str) -> String {
    if existing.is_empty() {
        return net.to_string();
    }
    if let Some(i) = existing.rfind(']') {
        let Ok(Json::Array(networks)) = serde_json::from_str::<Json>(existing) else {
            return existing.to_string();
        };
        let (ns, name) = net.split_once('/').unwrap_or(("", net));
        let found = networks.iter().any(|n| {
            n.get("name").and_then(Json::as_str) == Some(name)
                && n.get("namespace").and_then(Json::as_str).unwrap_or("") == ns
        });
        if found {
            return existing.to_string();
        }
        let add = if ns.is_empty() {
            format!(r#", {{"name": "{name}"}}"#)
        } else {
            format!(r#", {{"name": "{name}", "namespace": "{ns}"}}"#)
        };
        return format!("{}{add}{}", &existing[..i], &existing[i..]);
    }
    if existing.split(',').any(|n| n.trim() == net) {
        return existing.to_string();
    }
    format!("{existing}, {net}")
}

/// Istio's `omitNil`: nil entries removed from maps and lists, recursively; a collection left
/// empty is nil itself.
fn omit_nil(v: &Value) -> Option<Value> {
    match v {
        Value::Nil => None,
        Value::Map(m) => {
            let out: BTreeMap<String, Value> = m
                .entries
                .iter()
                .filter_map(|(k, v)| omit_nil(v).map(|v| (k.clone(), v)))
                .collect();
            (!out.is_empty()).then(|| Value::map(out))
        }
        Value::List(l) => {
            let out: Vec<Value> = l.iter().filter_map(omit_nil).collect();
            (!out.is_empty()).then(|| Value::list(out))
        }
        other => Some(other.clone()),
    }
}

/// A protobuf JSON duration (`"23s"`) as Go's `time.Duration.String` writes it (`23s`, `1m30s`).
pub(crate) fn format_duration(s: &str) -> String {
    let Some(secs) = s.strip_suffix('s').and_then(|n| n.parse::<f64>().ok()) else {
        return s.to_string();
    };
    if secs == 0.0 {
        return "0s".into();
    }
    let neg = secs < 0.0;
    let total_ns = (secs.abs() * 1e9).round() as u128;
    let mut out = String::new();
    if total_ns < 1_000_000_000 {
        let (unit, div) = if total_ns < 1_000 {
            ("ns", 1.0)
        } else if total_ns < 1_000_000 {
            ("µs", 1e3)
        } else {
            ("ms", 1e6)
        };
        out = format!("{}{unit}", crate::template::value::go_float(total_ns as f64 / div));
    } else {
        let h = total_ns / 3_600_000_000_000;
        let m = (total_ns / 60_000_000_000) % 60;
        let s = (total_ns % 60_000_000_000) as f64 / 1e9;
        if h > 0 {
            out.push_str(&format!("{h}h"));
        }
        if h > 0 || m > 0 {
            out.push_str(&format!("{m}m"));
        }
        out.push_str(&format!("{}s", crate::template::value::go_float(s)));
    }
    if neg { format!("-{out}") } else { out }
}

#[cfg(test)]
#[path = "funcs_tests.rs"]
mod tests;
