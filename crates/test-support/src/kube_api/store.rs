//! The fake API server's state: objects by resource type, namespace and name, one resourceVersion
//! counter for everything (as etcd's revision), and the event history watches replay from.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;

use serde_json::{Value, json};

use super::resources::{RESOURCES, ResourceType};

/// Index into [`RESOURCES`].
pub(crate) type Res = usize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as watches see it.
#[derive(Debug)]
pub(crate) struct Event {
    pub rv: u64,
    pub kind: EventType,
    pub res: Res,
    /// The object before (for selector transitions), and after (for DELETED: its last state).
    pub old: Option<Arc<Value>>,
    pub new: Arc<Value>,
}

/// An API error: HTTP code, reason, message.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
        }
    }

    pub fn not_found(rt: &ResourceType, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{}.{} \"{name}\" not found", rt.plural, rt.group),
        )
    }

    pub fn expired(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    /// The `Status` object the API server sends.
    pub fn status(&self) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": self.message, "reason": self.reason, "code": self.code})
    }
}

type Key = (Res, String, String);

#[derive(Debug, Default)]
pub(crate) struct Store {
    pub rv: u64,
    objects: BTreeMap<Key, Arc<Value>>,
    history: VecDeque<Arc<Event>>,
    /// Events up to this revision are gone: asking for them is 410 Gone.
    pub compacted: u64,
    pub uninstalled: HashSet<&'static str>,
    uid: u64,
}

pub(crate) fn res_index(rt: &ResourceType) -> Res {
    RESOURCES.iter().position(|r| r == rt).unwrap_or(0)
}

fn name_of(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/name").and_then(Value::as_str)
}

impl Store {
    pub(super) fn installed(&self, rt: &ResourceType) -> bool {
        !self.uninstalled.contains(rt.group)
    }

    pub(super) fn get(&self, res: Res, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.objects.get(&(res, ns.to_owned(), name.to_owned())).cloned()
    }

    /// Objects of `res` (in `ns` if given), in key order.
    pub(super) fn list(&self, res: Res, ns: Option<&str>) -> Vec<Arc<Value>> {
        let from = (res, ns.unwrap_or("").to_owned(), String::new());
        self.objects
            .range(from..)
            .take_while(|((r, n, _), _)| *r == res && ns.is_none_or(|ns| ns == n))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Events after `rv` (all resource types); `None` when some of them were compacted away.
    pub(super) fn events_after(&self, rv: u64) -> Option<Vec<Arc<Event>>> {
        if rv < self.compacted {
            return None;
        }
        Some(self.history.iter().filter(|e| e.rv > rv).cloned().collect())
    }

    pub(super) fn compact(&mut self) {
        self.compacted = self.rv;
        self.history.clear();
    }

    fn record(&mut self, kind: EventType, res: Res, old: Option<Arc<Value>>, new: Arc<Value>) -> Arc<Event> {
        let e = Arc::new(Event {
            rv: self.rv,
            kind,
            res,
            old,
            new,
        });
        self.history.push_back(e.clone());
        // Keep a bounded history, as etcd compacts.
        while self.history.len() > 100_000 {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
        e
    }

    /// POST: a new object; its namespace from the path, metadata filled in as the server does.
    pub(super) fn create(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        mut obj: Value,
        now: &str,
    ) -> Result<(Value, Arc<Event>), ApiError> {
        let res = res_index(rt);
        let name = match name_of(&obj) {
            Some(n) if !n.is_empty() => n.to_owned(),
            _ => {
                let prefix = obj
                    .pointer("/metadata/generateName")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if prefix.is_empty() {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        format!("{} is invalid: metadata.name: Required value", rt.kind),
                    ));
                }
                self.uid += 1;
                format!("{prefix}{:05x}", self.uid)
            }
        };
        if self.objects.contains_key(&(res, ns.to_owned(), name.clone())) {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{}.{} \"{name}\" already exists", rt.plural, rt.group),
            ));
        }
        self.rv += 1;
        self.uid += 1;
        let md = metadata(&mut obj);
        md.insert("name".into(), json!(name));
        if rt.namespaced {
            md.insert("namespace".into(), json!(ns));
        } else {
            md.remove("namespace");
        }
        md.insert(
            "uid".into(),
            json!(format!("00000000-0000-0000-0000-{:012x}", self.uid)),
        );
        md.insert("resourceVersion".into(), json!(self.rv.to_string()));
        md.insert("creationTimestamp".into(), json!(now));
        md.insert("generation".into(), json!(1));
        let obj = Arc::new(obj);
        self.objects.insert((res, ns.to_owned(), name), obj.clone());
        let e = self.record(EventType::Added, res, None, obj.clone());
        Ok(((*obj).clone(), e))
    }

    /// PUT: replaces an object; a `resourceVersion` in it must be the current one.
    pub(super) fn replace(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        mut obj: Value,
    ) -> Result<(Value, Arc<Event>), ApiError> {
        let res = res_index(rt);
        let key = (res, ns.to_owned(), name.to_owned());
        let Some(old) = self.objects.get(&key).cloned() else {
            return Err(ApiError::not_found(rt, name));
        };
        let current = old
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        if let Some(given) = obj.pointer("/metadata/resourceVersion").and_then(Value::as_str)
            && !given.is_empty()
            && given != current
        {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {}.{} \"{name}\": the object has been modified",
                    rt.plural, rt.group
                ),
            ));
        }
        self.rv += 1;
        let md = metadata(&mut obj);
        for k in ["uid", "creationTimestamp", "name", "namespace"] {
            match old.pointer(&format!("/metadata/{k}")) {
                Some(v) => md.insert(k.into(), v.clone()),
                None => md.remove(k),
            };
        }
        let generation = old.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(1);
        let spec_changed = old.get("spec") != obj.get("spec");
        let md = metadata(&mut obj);
        md.insert("resourceVersion".into(), json!(self.rv.to_string()));
        md.insert(
            "generation".into(),
            json!(if spec_changed { generation + 1 } else { generation }),
        );
        let obj = Arc::new(obj);
        self.objects.insert(key, obj.clone());
        let e = self.record(EventType::Modified, res, Some(old), obj.clone());
        Ok(((*obj).clone(), e))
    }

    pub(super) fn delete(&mut self, rt: &ResourceType, ns: &str, name: &str) -> Result<(Value, Arc<Event>), ApiError> {
        let res = res_index(rt);
        let Some(old) = self.objects.remove(&(res, ns.to_owned(), name.to_owned())) else {
            return Err(ApiError::not_found(rt, name));
        };
        self.rv += 1;
        let mut last = (*old).clone();
        metadata(&mut last).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let last = Arc::new(last);
        let e = self.record(EventType::Deleted, res, Some(old), last.clone());
        Ok(((*last).clone(), e))
    }
}

/// `obj.metadata` as a map, created if missing.
pub(crate) fn metadata(obj: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !obj.is_object() {
        *obj = json!({});
    }
    let Value::Object(o) = obj else {
        unreachable!("made an object above")
    };
    let md = o.entry("metadata").or_insert_with(|| json!({}));
    if !md.is_object() {
        *md = json!({});
    }
    let Value::Object(m) = md else {
        unreachable!("made an object above")
    };
    m
}

/// RFC 7386 JSON merge patch.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_as_rfc_7386() {
        let mut t = json!({"a": {"b": 1, "c": 2}, "d": [1]});
        merge_patch(&mut t, &json!({"a": {"b": null, "e": 3}, "d": [2]}));
        assert_eq!(t, json!({"a": {"c": 2, "e": 3}, "d": [2]}));
    }
}
