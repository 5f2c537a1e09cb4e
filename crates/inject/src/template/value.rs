//! The values a template sees, modelled on what Go's templates see in Istio's
//! `SidecarTemplateData`: Go structs (Kubernetes objects, protobuf messages), Go maps
//! (`.Values`, labels, annotations, proxyMetadata) and scalars.
//!
//! A struct is kept as its JSON (Kubernetes or protobuf JSON names) and read by Go field name
//! (`.Spec.Containers` is `spec.containers`), so `toJSON`/`toYaml` of the same value gives the
//! API's JSON names. An absent field is Go's zero value (`Zero`, or an empty map for map-typed
//! fields such as `Annotations`); a missing key of a `map[string]any` is Go's nil (`<no value>`),
//! of a `map[string]string` the empty string.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::rc::Rc;

use serde_json::Value as Json;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// Go's nil interface: a missing key of a `map[string]any`; prints `<no value>`.
    Nil,
    /// The zero value of an absent struct field or map entry (`""`, `0`, `false`, nil pointer).
    Zero,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Rc<Vec<Value>>),
    Map(Rc<Dict>),
    Struct(Rc<Struct>),
}

/// A Go map with string keys; `strings` maps (`map[string]string`) give `""` for a missing key.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Dict {
    pub entries: BTreeMap<String, Value>,
    pub strings: bool,
}

/// Which Go type a struct is, for the zero values of its absent fields and its JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A Kubernetes API object (`corev1.PodSpec`, `metav1.ObjectMeta`, ...).
    Kube,
    /// Istio's `meshconfig.ProxyConfig`.
    ProxyConfig,
    /// Any other protobuf message (`meshconfig.MeshConfig`, `Tracing`, ...).
    Proto,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Struct {
    pub kind: Kind,
    pub json: serde_json::Map<String, Json>,
}

/// Go fields whose type is a `map[string]string` (labels, annotations, ...): data, not fields.
const STRING_MAP_FIELDS: &[&str] = &[
    "Annotations",
    "Labels",
    "ProxyMetadata",
    "NodeSelector",
    "Limits",
    "Requests",
    "MatchLabels",
    "Data",
    "StringData",
];

impl Value {
    pub(crate) fn str(s: impl Into<String>) -> Value {
        Value::Str(s.into())
    }

    /// A Go struct of `kind` holding this JSON object (anything else is its plain data).
    pub(crate) fn structure(kind: Kind, json: Json) -> Value {
        match json {
            Json::Object(map) => Value::Struct(Rc::new(Struct { kind, json: map })),
            other => Value::from_json(&other),
        }
    }

    pub(crate) fn map(entries: BTreeMap<String, Value>) -> Value {
        Value::Map(Rc::new(Dict {
            entries,
            strings: false,
        }))
    }

    pub(crate) fn list(items: Vec<Value>) -> Value {
        Value::List(Rc::new(items))
    }

    /// Plain data as Go's `map[string]any` from JSON: objects are maps, numbers stay numbers.
    pub(crate) fn from_json(json: &Json) -> Value {
        match json {
            Json::Null => Value::Nil,
            Json::Bool(b) => Value::Bool(*b),
            Json::Number(n) => match n.as_i64() {
                Some(i) => Value::Int(i),
                None => Value::Float(n.as_f64().unwrap_or(0.0)),
            },
            Json::String(s) => Value::Str(s.clone()),
            Json::Array(a) => Value::list(a.iter().map(Value::from_json).collect()),
            Json::Object(o) => Value::map(o.iter().map(|(k, v)| (k.clone(), Value::from_json(v))).collect()),
        }
    }

    fn string_map(json: &Json) -> Value {
        let entries = match json {
            Json::Object(o) => o.iter().map(|(k, v)| (k.clone(), Value::from_json(v))).collect(),
            _ => BTreeMap::new(),
        };
        Value::Map(Rc::new(Dict { entries, strings: true }))
    }

    /// The value as JSON, with the API's field names; integral floats become integers, as Go's
    /// `encoding/json` writes them.
    pub(crate) fn to_json(&self) -> Json {
        match self {
            Value::Nil | Value::Zero => Json::Null,
            Value::Bool(b) => Json::Bool(*b),
            Value::Int(i) => Json::from(*i),
            Value::Float(f) => float_json(*f),
            Value::Str(s) => Json::String(s.clone()),
            Value::List(l) => Json::Array(l.iter().map(Value::to_json).collect()),
            Value::Map(m) => Json::Object(m.entries.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()),
            Value::Struct(s) => Json::Object(s.json.clone()),
        }
    }

    /// Go's truth: false, 0, nil, and empty strings, lists and maps are false.
    pub(crate) fn truthy(&self) -> bool {
        match self {
            Value::Nil | Value::Zero => false,
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            Value::Float(f) => *f != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::List(l) => !l.is_empty(),
            Value::Map(m) => !m.entries.is_empty(),
            Value::Struct(_) => true,
        }
    }

    /// The field `name` (a Go field or getter name) of a struct, a map's key, or a method of a
    /// scalar (`.String`, `.GetValue` of a protobuf wrapper).
    pub(crate) fn field(&self, name: &str) -> Value {
        match self {
            Value::Struct(s) => s.field(name),
            Value::Map(m) => match m.entries.get(name) {
                Some(v) => v.clone(),
                None if m.strings => Value::Zero,
                None => Value::Nil,
            },
            Value::Zero => Value::Zero,
            Value::Nil => Value::Nil,
            // Methods of scalars Istio's templates call: enum `.String`, wrapper `.GetValue`.
            scalar => match name {
                "String" => Value::Str(scalar.to_text()),
                _ => scalar.clone(),
            },
        }
    }

    /// `index` of a list or a map; missing entries are zero values.
    pub(crate) fn index(&self, key: &Value) -> Result<Value, String> {
        match (self, key) {
            (Value::Map(_), k) | (Value::Struct(_), k) if matches!(k, Value::Str(_)) => {
                let Value::Str(k) = k else { return Ok(Value::Nil) };
                Ok(match self {
                    Value::Struct(s) => s.json.get(k).map(|j| s.child(k, j)).unwrap_or(Value::Zero),
                    _ => self.field(k),
                })
            }
            (Value::List(l), k) => {
                let i = k
                    .as_int()
                    .ok_or_else(|| format!("cannot index slice with {}", k.to_text()))?;
                usize::try_from(i)
                    .ok()
                    .and_then(|i| l.get(i).cloned())
                    .ok_or_else(|| format!("index out of range: {i}"))
            }
            (Value::Str(s), k) => {
                let i = k
                    .as_int()
                    .ok_or_else(|| format!("cannot index string with {}", k.to_text()))?;
                usize::try_from(i)
                    .ok()
                    .and_then(|i| s.as_bytes().get(i).copied())
                    .map(|b| Value::Int(i64::from(b)))
                    .ok_or_else(|| format!("index out of range: {i}"))
            }
            (Value::Zero, _) => Ok(Value::Zero),
            (Value::Nil, _) => Ok(Value::Nil),
            (v, k) => Err(format!(
                "can't index item of type {} with {}",
                v.type_name(),
                k.to_text()
            )),
        }
    }

    pub(crate) fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Float(f) if f.fract() == 0.0 => Some(*f as i64),
            Value::Zero => Some(0),
            _ => None,
        }
    }

    pub(crate) fn len(&self) -> Option<usize> {
        match self {
            Value::Str(s) => Some(s.len()),
            Value::List(l) => Some(l.len()),
            Value::Map(m) => Some(m.entries.len()),
            Value::Zero | Value::Nil => Some(0),
            _ => None,
        }
    }

    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Value::Nil => "nil",
            Value::Zero => "zero",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float64",
            Value::Str(_) => "string",
            Value::List(_) => "slice",
            Value::Map(_) => "map",
            Value::Struct(_) => "struct",
        }
    }

    /// The text Go's `fmt.Sprint` gives for the value (as printed by an action, `%v`).
    pub(crate) fn to_text(&self) -> String {
        let mut s = String::new();
        self.write_text(&mut s, true);
        s
    }

    fn write_text(&self, out: &mut String, top: bool) {
        match self {
            Value::Nil => out.push_str(if top { "<no value>" } else { "<nil>" }),
            Value::Zero => {}
            Value::Bool(b) => {
                let _ = write!(out, "{b}");
            }
            Value::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Value::Float(f) => out.push_str(&go_float(*f)),
            Value::Str(s) => out.push_str(s),
            Value::List(l) => {
                out.push('[');
                for (i, v) in l.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    v.write_text(out, false);
                }
                out.push(']');
            }
            Value::Map(m) => {
                out.push_str("map[");
                for (i, (k, v)) in m.entries.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    out.push_str(k);
                    out.push(':');
                    v.write_text(out, false);
                }
                out.push(']');
            }
            Value::Struct(s) => out.push_str(&Json::Object(s.json.clone()).to_string()),
        }
    }

    /// Whether the value is Go's zero value of its type (`empty` / `default` in sprig).
    pub(crate) fn is_empty(&self) -> bool {
        !self.truthy() && !matches!(self, Value::Struct(_))
    }
}

impl Struct {
    fn field(&self, name: &str) -> Value {
        // Protobuf getters (`GetTracing`) read the field and are nil-safe, as Go's.
        if let Some(rest) = name.strip_prefix("Get")
            && rest.starts_with(|c: char| c.is_ascii_uppercase())
            && !self.json.contains_key(&go_to_json(name))
        {
            return self.field(rest);
        }
        let key = go_to_json(name);
        match self.json.get(&key) {
            Some(Json::Null) | None => self.zero(name),
            Some(j) if STRING_MAP_FIELDS.contains(&name) => Value::string_map(j),
            Some(j) => self.child(&key, j),
        }
    }

    fn child(&self, _key: &str, json: &Json) -> Value {
        let kind = if self.kind == Kind::ProxyConfig {
            Kind::Proto
        } else {
            self.kind
        };
        match json {
            Json::Object(o) => Value::Struct(Rc::new(Struct { kind, json: o.clone() })),
            Json::Array(a) => Value::list(
                a.iter()
                    .map(|j| match j {
                        Json::Object(o) => Value::Struct(Rc::new(Struct { kind, json: o.clone() })),
                        other => Value::from_json(other),
                    })
                    .collect(),
            ),
            other => Value::from_json(other),
        }
    }

    fn zero(&self, name: &str) -> Value {
        if STRING_MAP_FIELDS.contains(&name) {
            return Value::string_map(&Json::Null);
        }
        match (self.kind, name) {
            // protobuf enums print their zero name
            (Kind::ProxyConfig, "InterceptionMode") => Value::str("REDIRECT"),
            _ => Value::Zero,
        }
    }
}

/// Go field name to its JSON name: `Containers` → `containers`, `APIVersion` → `apiVersion`,
/// `HTTPGet` → `httpGet`, `GRPC` → `grpc`.
pub(crate) fn go_to_json(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let upper = chars.iter().take_while(|c| c.is_ascii_uppercase()).count();
    if upper == chars.len() {
        return name.to_ascii_lowercase();
    }
    let lower_n = if upper > 1 { upper - 1 } else { upper };
    chars
        .iter()
        .enumerate()
        .map(|(i, c)| if i < lower_n { c.to_ascii_lowercase() } else { *c })
        .collect()
}

/// A float as Go's `%v` writes it: the shortest form, exponent only from 1e21.
pub(crate) fn go_float(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e21 {
        return format!("{}", f as i64);
    }
    if f.abs() >= 1e21 || (f != 0.0 && f.abs() < 1e-4) {
        let s = format!("{f:e}");
        // Rust: 1e21, Go: 1e+21
        return match s.split_once('e') {
            Some((m, e)) if !e.starts_with('-') => format!("{m}e+{e:0>2}"),
            Some((m, e)) => format!("{m}e-{:0>2}", &e[1..]),
            None => s,
        };
    }
    format!("{f}")
}

fn float_json(f: f64) -> Json {
    if f.fract() == 0.0 && f.abs() < 9.0e15 {
        Json::from(f as i64)
    } else {
        serde_json::Number::from_f64(f).map(Json::Number).unwrap_or(Json::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn go_names_map_to_json_names() {
        assert_eq!(go_to_json("Containers"), "containers");
        assert_eq!(go_to_json("APIVersion"), "apiVersion");
        assert_eq!(go_to_json("HTTPGet"), "httpGet");
        assert_eq!(go_to_json("GRPC"), "grpc");
        assert_eq!(go_to_json("ServiceAccountName"), "serviceAccountName");
    }

    #[test]
    fn structs_read_by_go_field_and_give_zero_values() {
        let pod = Value::structure(Kind::Kube, json!({"metadata": {"labels": {"app": "a"}}, "spec": {}}));
        assert_eq!(pod.field("Metadata").field("Labels").field("app"), Value::str("a"));
        // absent map field: an empty map whose missing keys are ""
        let anns = pod.field("Metadata").field("Annotations");
        assert_eq!(anns.len(), Some(0));
        assert_eq!(anns.field("x"), Value::Zero);
        assert_eq!(pod.field("Spec").field("ServiceAccountName").to_text(), "");
        let pc = Value::structure(Kind::ProxyConfig, json!({}));
        assert_eq!(pc.field("InterceptionMode").field("String"), Value::str("REDIRECT"));
        assert_eq!(pc.field("GetTracing").field("GetTlsSettings"), Value::Zero);
        assert!(!pc.field("HoldApplicationUntilProxyStarts").field("GetValue").truthy());
        // `.Values` is data: a missing key is nil
        let values = Value::from_json(&json!({"global": {}}));
        assert_eq!(values.field("global").field("x").to_text(), "<no value>");
    }

    #[test]
    fn floats_print_as_go() {
        assert_eq!(go_float(15020.0), "15020");
        assert_eq!(go_float(0.5), "0.5");
        assert_eq!(go_float(1e21), "1e+21");
    }
}
