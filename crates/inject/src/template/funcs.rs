//! Go's predefined template functions (`text/template/funcs.go`: `not`, `eq`, `ne`, `lt`, `le`,
//! `gt`, `ge`, `len`, `index`, `print`, `printf`, `println`) and the `fmt` verbs they need;
//! `lookup` adds Istio's and sprig's from `crate::funcs`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::value::Value;

/// What functions may read besides their arguments: istiod's environment for `env`.
pub(crate) struct FuncCtx<'a> {
    pub env: &'a BTreeMap<String, String>,
}

pub(crate) type Func = fn(&FuncCtx<'_>, &[Value]) -> Result<Value, String>;

pub(crate) fn lookup(name: &str) -> Option<Func> {
    Some(match name {
        "not" => |_, a| one(a, "not").map(|v| Value::Bool(!v.truthy())),
        "eq" => eq,
        "ne" => |_, a| match a {
            [x, y] => Ok(Value::Bool(!equal(x, y))),
            _ => Err("ne takes two arguments".into()),
        },
        "lt" => |_, a| compare(a, |o| o.is_lt()),
        "le" => |_, a| compare(a, |o| o.is_le()),
        "gt" => |_, a| compare(a, |o| o.is_gt()),
        "ge" => |_, a| compare(a, |o| o.is_ge()),
        "len" => |_, a| {
            let v = one(a, "len")?;
            v.len()
                .map(|n| Value::Int(n as i64))
                .ok_or_else(|| format!("len of type {}", v.type_name()))
        },
        "index" => |_, a| {
            let (first, keys) = a.split_first().ok_or("index needs an argument")?;
            keys.iter().try_fold(first.clone(), |v, k| v.index(k))
        },
        "print" => |_, a| Ok(Value::Str(sprint(a))),
        "println" => |_, a| {
            Ok(Value::Str(
                a.iter().map(|v| v.to_text()).collect::<Vec<_>>().join(" ") + "\n",
            ))
        },
        "printf" => |_, a| match a.split_first() {
            Some((Value::Str(f), rest)) => Ok(Value::Str(sprintf(f, rest))),
            _ => Err("printf needs a format string".into()),
        },
        other => return crate::funcs::lookup(other),
    })
}

pub(crate) fn one<'v>(a: &'v [Value], name: &str) -> Result<&'v Value, String> {
    match a {
        [v] => Ok(v),
        _ => Err(format!("{name} takes one argument, got {}", a.len())),
    }
}

/// Go's `eq arg1 arg2 ...`: whether arg1 equals any of the others.
fn eq(_: &FuncCtx<'_>, a: &[Value]) -> Result<Value, String> {
    let (first, rest) = a.split_first().ok_or("eq needs two arguments")?;
    if rest.is_empty() {
        return Err("eq needs two arguments".into());
    }
    Ok(Value::Bool(rest.iter().any(|v| equal(first, v))))
}

/// Equality of basic values; numbers by value across int and float, and a zero value (absent
/// field) equal to the zero of the other side's type.
pub(crate) fn equal(x: &Value, y: &Value) -> bool {
    match (x, y) {
        (Value::Zero | Value::Nil, other) | (other, Value::Zero | Value::Nil) => other.is_empty(),
        (Value::Str(a), Value::Str(b)) => a == b,
        (Value::Bool(a), Value::Bool(b)) => a == b,
        (a, b) => match (num(a), num(b)) {
            (Some(a), Some(b)) => a == b,
            _ => a == b,
        },
    }
}

fn num(v: &Value) -> Option<f64> {
    match v {
        Value::Int(i) => Some(*i as f64),
        Value::Float(f) => Some(*f),
        _ => None,
    }
}

fn compare(a: &[Value], ok: fn(std::cmp::Ordering) -> bool) -> Result<Value, String> {
    let [x, y] = a else {
        return Err("comparison takes two arguments".into());
    };
    let ord = match (x, y) {
        (Value::Str(a), Value::Str(b)) => a.cmp(b),
        _ => {
            let (a, b) = (
                num(x).or(x.as_int().map(|i| i as f64)),
                num(y).or(y.as_int().map(|i| i as f64)),
            );
            match (a, b) {
                (Some(a), Some(b)) => a.partial_cmp(&b).ok_or("NaN in comparison")?,
                _ => {
                    return Err(format!(
                        "incompatible types for comparison: {} and {}",
                        x.type_name(),
                        y.type_name()
                    ));
                }
            }
        }
    };
    Ok(Value::Bool(ok(ord)))
}

/// Go's `fmt.Sprint`: spaces between operands when neither is a string.
pub(crate) fn sprint(a: &[Value]) -> String {
    let mut out = String::new();
    for (i, v) in a.iter().enumerate() {
        if i > 0 && !matches!(v, Value::Str(_)) && !matches!(a[i - 1], Value::Str(_)) {
            out.push(' ');
        }
        out.push_str(&fmt_v(v));
    }
    out
}

fn fmt_v(v: &Value) -> String {
    match v {
        Value::Nil => "<nil>".into(),
        other => other.to_text(),
    }
}

/// Go's `strconv.Quote` (the `%q` verb, sprig's `quote`).
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\x0b' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `fmt.Sprintf` for the verbs templates use: `%s %v %d %t %q %x %f %%`, with width.
pub(crate) fn sprintf(format: &str, args: &[Value]) -> String {
    let mut out = String::new();
    let mut args = args.iter();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = String::new();
        while let Some(&d) = chars.peek() {
            if d.is_ascii_digit() || d == '-' || d == '.' || d == '+' || d == ' ' || d == '#' {
                spec.push(d);
                chars.next();
            } else {
                break;
            }
        }
        let Some(verb) = chars.next() else {
            out.push_str("%!(NOVERB)");
            break;
        };
        if verb == '%' {
            out.push('%');
            continue;
        }
        let Some(arg) = args.next() else {
            let _ = write!(out, "%!{verb}(MISSING)");
            continue;
        };
        let text = match (verb, arg) {
            ('s' | 'v', v) => fmt_v(v),
            ('d', v) => match v.as_int() {
                Some(i) => i.to_string(),
                None => format!("%!d({})", fmt_v(v)),
            },
            ('t', Value::Bool(b)) => b.to_string(),
            ('q', v) => go_quote(&fmt_v(v)),
            ('x', Value::Int(i)) => format!("{i:x}"),
            ('x', v) => fmt_v(v).bytes().map(|b| format!("{b:02x}")).collect(),
            ('f', v) => {
                let prec = spec
                    .split_once('.')
                    .and_then(|(_, p)| p.parse::<usize>().ok())
                    .unwrap_or(6);
                let f = match v {
                    Value::Float(f) => *f,
                    other => other.as_int().unwrap_or(0) as f64,
                };
                format!("{f:.prec$}")
            }
            (verb, v) => format!("%!{verb}({})", fmt_v(v)),
        };
        let width = spec
            .trim_start_matches(['-', '+', ' ', '#'])
            .split('.')
            .next()
            .and_then(|w| w.parse::<usize>().ok());
        match width {
            Some(w) if spec.starts_with('-') => {
                let _ = write!(out, "{text:<w$}");
            }
            Some(w) => {
                let _ = write!(out, "{text:>w$}");
            }
            None => out.push_str(&text),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printf_verbs() {
        let args = [Value::str("x"), Value::Int(3), Value::Bool(true), Value::str("a\"b")];
        assert_eq!(sprintf("%s-%d-%t-%q-%%", &args), "x-3-true-\"a\\\"b\"-%");
        assert_eq!(
            sprintf("--proxyLogLevel=%s", &[Value::str("warning")]),
            "--proxyLogLevel=warning"
        );
        assert_eq!(sprintf("%5s|%-3d|", &[Value::str("ab"), Value::Int(1)]), "   ab|1  |");
        assert_eq!(sprintf("%s", &[]), "%!s(MISSING)");
    }

    #[test]
    fn eq_compares_mixed_and_zero_values() {
        let ctx = FuncCtx { env: &BTreeMap::new() };
        let f = |n: &str, a: &[Value]| lookup(n).map(|f| f(&ctx, a));
        assert_eq!(
            f("eq", &[Value::Int(1), Value::Float(1.0)]),
            Some(Ok(Value::Bool(true)))
        );
        assert_eq!(f("eq", &[Value::Zero, Value::str("")]), Some(Ok(Value::Bool(true))));
        assert_eq!(
            f("eq", &[Value::str("a"), Value::str("b"), Value::str("a")]),
            Some(Ok(Value::Bool(true)))
        );
        assert_eq!(f("ne", &[Value::Nil, Value::str("x")]), Some(Ok(Value::Bool(true))));
        assert_eq!(f("ge", &[Value::Int(2), Value::Int(1)]), Some(Ok(Value::Bool(true))));
        assert_eq!(f("not", &[Value::Zero]), Some(Ok(Value::Bool(true))));
        assert_eq!(f("len", &[Value::str("abc")]), Some(Ok(Value::Int(3))));
        assert_eq!(
            f("index", &[Value::list(vec![Value::str("a")]), Value::Int(0)]),
            Some(Ok(Value::str("a")))
        );
        assert!(f("lt", &[Value::str("a"), Value::Int(1)]).is_some_and(|r| r.is_err()));
        assert_eq!(f("print", &[Value::Int(1), Value::Int(2)]), Some(Ok(Value::str("1 2"))));
    }
}
