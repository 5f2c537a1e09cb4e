//! Server-side apply in the fake API server (`PATCH` with `application/apply-patch+yaml`), after
//! Kubernetes' field manager (`k8s.io/apiserver/pkg/endpoints/handlers/fieldmanager` over
//! structured-merge-diff): an apply creates the object when it is absent and merges the applied
//! configuration into it otherwise; each field belongs to the managers that set it, recorded in
//! `metadata.managedFields` (`FieldsV1`); an apply that would change a field another manager owns
//! is refused with Kubernetes' 409 `Conflict` ("Apply failed with 1 conflict: conflict with
//! \"m\" using coordination.k8s.io/v1: .spec.holderIdentity") unless `force=true`, which takes
//! the field over. Fields a manager applied before and no longer applies are removed when no one
//! else owns them.
//!
//! A fake, not structured-merge-diff: lists are atomic (a list is one field, as a list without
//! merge keys), and ownership is recorded only for objects that have been applied server-side
//! (from then on, updates by PUT and PATCH take the fields they change for their `fieldManager`,
//! or the client's User-Agent name as the API server does). A manager does not conflict with
//! itself, whichever the operation.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::store::{ApiError, metadata};

/// A field: the keys from the object's root.
type Path = Vec<String>;

/// Metadata the server keeps: never a field of a manager.
const SERVER_FIELDS: [&str; 8] = [
    "name",
    "namespace",
    "resourceVersion",
    "uid",
    "creationTimestamp",
    "generation",
    "managedFields",
    "generateName",
];

/// One entry of `metadata.managedFields`.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: String,
    fields: BTreeSet<Path>,
}

/// Who applies: `fieldManager` and `force`.
#[derive(Debug, Clone)]
pub(crate) struct Applier<'a> {
    pub manager: &'a str,
    pub force: bool,
    pub api_version: &'a str,
    pub now: &'a str,
}

/// The leaf fields of `obj` with their values (objects are descended, lists and scalars are
/// leaves), without the server's metadata.
fn leaves(obj: &Value) -> BTreeMap<Path, Value> {
    fn walk(v: &Value, path: &mut Path, out: &mut BTreeMap<Path, Value>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, child) in m {
                    let server_field = path.len() == 1 && path[0] == "metadata" && SERVER_FIELDS.contains(&k.as_str());
                    let type_field = path.is_empty() && (k == "apiVersion" || k == "kind");
                    if server_field || type_field {
                        continue;
                    }
                    path.push(k.clone());
                    walk(child, path, out);
                    path.pop();
                }
            }
            Value::Null => {}
            _ if !path.is_empty() => {
                out.insert(path.clone(), v.clone());
            }
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    walk(obj, &mut Vec::new(), &mut out);
    out
}

fn set_path(obj: &mut Value, path: &[String], v: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for k in parents {
        if !cur.is_object() {
            *cur = json!({});
        }
        let Value::Object(m) = cur else { return };
        cur = m.entry(k.clone()).or_insert_with(|| json!({}));
    }
    if !cur.is_object() {
        *cur = json!({});
    }
    if let Value::Object(m) = cur {
        m.insert(last.clone(), v);
    }
}

/// Removes the field at `path`, and the objects it leaves empty.
fn remove_path(obj: &mut Value, path: &[String]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    let Value::Object(m) = obj else { return };
    if rest.is_empty() {
        m.remove(first);
        return;
    }
    if let Some(child) = m.get_mut(first) {
        remove_path(child, rest);
        if child.as_object().is_some_and(serde_json::Map::is_empty) {
            m.remove(first);
        }
    }
}

/// `FieldsV1` (`{"f:spec": {"f:holderIdentity": {}}}`) to fields; a key of another kind
/// (`k:`, `v:`, `i:`: members of associative lists) ends the field at its parent.
fn decode_fields(v: &Value) -> BTreeSet<Path> {
    fn walk(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
        let children: Vec<(&String, &Value)> = v
            .as_object()
            .map(|m| m.iter().filter(|(k, _)| k.as_str() != ".").collect())
            .unwrap_or_default();
        if children.iter().any(|(k, _)| !k.starts_with("f:")) || children.is_empty() {
            if !path.is_empty() {
                out.insert(path.clone());
            }
            return;
        }
        for (k, child) in children {
            path.push(k.trim_start_matches("f:").to_owned());
            walk(child, path, out);
            path.pop();
        }
    }
    let mut out = BTreeSet::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

fn encode_fields(fields: &BTreeSet<Path>) -> Value {
    let mut root = json!({});
    for p in fields {
        let keyed: Vec<String> = p.iter().map(|k| format!("f:{k}")).collect();
        let mut cur = &mut root;
        for k in &keyed {
            let Value::Object(m) = cur else { break };
            cur = m.entry(k.clone()).or_insert_with(|| json!({}));
        }
    }
    root
}

fn read_entries(obj: &Value) -> Vec<Entry> {
    let str_of = |e: &Value, k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|e| Entry {
            manager: str_of(e, "manager"),
            operation: str_of(e, "operation"),
            api_version: str_of(e, "apiVersion"),
            time: str_of(e, "time"),
            fields: e.get("fieldsV1").map(decode_fields).unwrap_or_default(),
        })
        .collect()
}

fn write_entries(obj: &mut Value, entries: &[Entry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            json!({"manager": e.manager, "operation": e.operation, "apiVersion": e.api_version,
                   "time": e.time, "fieldsType": "FieldsV1", "fieldsV1": encode_fields(&e.fields)})
        })
        .collect();
    metadata(obj).insert("managedFields".into(), Value::Array(list));
}

/// `.spec.holderIdentity`, as the API server names a field.
fn dotted(p: &Path) -> String {
    p.iter().map(|k| format!(".{k}")).collect()
}

/// The object that applying `config` makes: `config` itself when there is no `current` object
/// (the caller creates it), else `current` with `config` merged in; 409 Conflict for fields
/// other managers own with another value, unless forced.
pub(crate) fn apply(current: Option<&Value>, config: &Value, who: &Applier<'_>) -> Result<Value, ApiError> {
    let applied = leaves(config);
    let Some(current) = current else {
        let mut obj = config.clone();
        let md = metadata(&mut obj);
        for k in SERVER_FIELDS {
            md.remove(k);
        }
        write_entries(&mut obj, &[own(who, "Apply", applied.keys().cloned().collect())]);
        return Ok(obj);
    };
    if let Some(rv) = config.pointer("/metadata/resourceVersion").and_then(Value::as_str)
        && Some(rv) != current.pointer("/metadata/resourceVersion").and_then(Value::as_str)
    {
        return Err(ApiError::new(
            409,
            "Conflict",
            "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    let existing = leaves(current);
    let mut entries = read_entries(current);
    let changed: Vec<&Path> = applied
        .iter()
        .filter(|(p, v)| existing.get(*p) != Some(*v))
        .map(|(p, _)| p)
        .collect();
    if !who.force {
        let mut conflicts: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for p in &changed {
            for e in entries
                .iter()
                .filter(|e| e.manager != who.manager && e.fields.contains(*p))
            {
                conflicts
                    .entry((e.manager.clone(), e.api_version.clone()))
                    .or_default()
                    .push(dotted(p));
            }
        }
        if !conflicts.is_empty() {
            return Err(conflict(&conflicts));
        }
    }
    let mut merged = current.clone();
    for (p, v) in &applied {
        set_path(&mut merged, p, v.clone());
    }
    // What this manager applied before and applies no more goes, unless someone else owns it.
    let before: BTreeSet<Path> = entries
        .iter()
        .filter(|e| e.manager == who.manager && e.operation == "Apply")
        .flat_map(|e| e.fields.iter().cloned())
        .collect();
    let mut dropped = Vec::new();
    for p in before.iter().filter(|p| !applied.contains_key(*p)) {
        let kept = entries
            .iter()
            .any(|e| !(e.manager == who.manager && e.operation == "Apply") && e.fields.contains(p));
        if !kept {
            remove_path(&mut merged, p);
            dropped.push(p.clone());
        }
    }
    for e in &mut entries {
        e.fields.retain(|p| !changed.contains(&p) && !dropped.contains(p));
    }
    entries.retain(|e| !(e.manager == who.manager && e.operation == "Apply"));
    entries.push(own(who, "Apply", applied.keys().cloned().collect()));
    write_entries(&mut merged, &entries);
    Ok(merged)
}

fn own(who: &Applier<'_>, operation: &str, fields: BTreeSet<Path>) -> Entry {
    Entry {
        manager: who.manager.to_owned(),
        operation: operation.to_owned(),
        api_version: who.api_version.to_owned(),
        time: who.now.to_owned(),
        fields,
    }
}

fn conflict(conflicts: &BTreeMap<(String, String), Vec<String>>) -> ApiError {
    let n: usize = conflicts.values().map(Vec::len).sum();
    let mut message = format!("Apply failed with {n} conflict{}:", if n == 1 { "" } else { "s" });
    for ((manager, api_version), fields) in conflicts {
        message.push_str(&format!(" conflict with {manager:?} using {api_version}:"));
        if n == 1 {
            message.push_str(&format!(" {}", fields.join("")));
        } else {
            for f in fields {
                message.push_str(&format!("\n- {f}"));
            }
        }
    }
    ApiError::new(409, "Conflict", message)
}

/// An update (PUT, or a PATCH that is not an apply) by `manager` of an object under server-side
/// apply: the fields it changes become its own (operation `Update`), taken from the others; the
/// fields it removes are no one's. Objects never applied are left without managed fields.
pub(crate) fn record_update(old: &Value, new: &mut Value, who: &Applier<'_>) {
    let mut entries = read_entries(old);
    if entries.is_empty() {
        if let Some(md) = new.get_mut("metadata").and_then(Value::as_object_mut) {
            md.remove("managedFields");
        }
        return;
    }
    let before = leaves(old);
    let after = leaves(new);
    let changed: BTreeSet<Path> = after
        .iter()
        .filter(|(p, v)| before.get(*p) != Some(*v))
        .map(|(p, _)| p.clone())
        .collect();
    let removed: BTreeSet<&Path> = before.keys().filter(|p| !after.contains_key(*p)).collect();
    for e in &mut entries {
        e.fields.retain(|p| !changed.contains(p) && !removed.contains(p));
    }
    match entries
        .iter_mut()
        .find(|e| e.manager == who.manager && e.operation == "Update")
    {
        Some(e) => {
            e.fields.extend(changed);
            e.time = who.now.to_owned();
        }
        None => entries.push(own(who, "Update", changed)),
    }
    write_entries(new, &entries);
}

/// The manager of a write without `fieldManager`: the User-Agent's program name, as the API
/// server's `prefixFromUserAgent`.
pub(crate) fn manager_from_user_agent(user_agent: &str) -> String {
    let name = user_agent.split('/').next().unwrap_or_default().trim();
    if name.is_empty() {
        "unknown".to_owned()
    } else {
        name.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(manager: &str, force: bool) -> Applier<'_> {
        Applier {
            manager,
            force,
            api_version: "coordination.k8s.io/v1",
            now: "2026-01-01T00:00:00Z",
        }
    }

    fn lease(holder: &str) -> Value {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"},
               "spec": {"holderIdentity": holder, "leaseDurationSeconds": 30}})
    }

    #[test]
    fn a_second_manager_conflicts_on_a_field_it_would_change_unless_forced() {
        let a = apply(None, &lease("a"), &who("a", false)).unwrap_or_default();
        assert_eq!(
            a.pointer("/metadata/managedFields/0/fieldsV1"),
            Some(&json!({"f:spec": {"f:holderIdentity": {}, "f:leaseDurationSeconds": {}}}))
        );
        let e = apply(Some(&a), &lease("b"), &who("b", false)).err();
        assert_eq!(
            e.map(|e| (e.code, e.reason, e.message)),
            Some((
                409,
                "Conflict",
                "Apply failed with 1 conflict: conflict with \"a\" using coordination.k8s.io/v1: .spec.holderIdentity"
                    .to_owned()
            ))
        );
        // The same value is shared, not a conflict; forcing takes the field over.
        let shared = apply(Some(&a), &lease("a"), &who("b", false)).unwrap_or_default();
        assert_eq!(read_entries(&shared).len(), 2);
        let forced = apply(Some(&a), &lease("b"), &who("b", true)).unwrap_or_default();
        assert_eq!(forced["spec"]["holderIdentity"], "b");
        let owners: Vec<(String, BTreeSet<Path>)> = read_entries(&forced)
            .into_iter()
            .map(|e| (e.manager, e.fields))
            .collect();
        let holder = vec!["spec".to_owned(), "holderIdentity".to_owned()];
        assert!(owners.iter().any(|(m, f)| m == "b" && f.contains(&holder)));
        assert!(!owners.iter().any(|(m, f)| m == "a" && f.contains(&holder)));
    }

    #[test]
    fn an_update_that_removes_a_field_frees_it_for_another_apply() {
        let a = apply(None, &lease("a"), &who("a", false)).unwrap_or_default();
        let mut released = a.clone();
        super::super::store::merge_patch(&mut released, &json!({"spec": {"holderIdentity": null}}));
        record_update(&a, &mut released, &who("c", false));
        let b = apply(Some(&released), &lease("b"), &who("b", false));
        assert_eq!(b.map(|b| b["spec"]["holderIdentity"].clone()).ok(), Some(json!("b")));
    }

    #[test]
    fn fields_no_longer_applied_are_removed() {
        let a = apply(None, &lease("a"), &who("a", false)).unwrap_or_default();
        let mut less = lease("a");
        less["spec"].as_object_mut().map(|s| s.remove("leaseDurationSeconds"));
        let a2 = apply(Some(&a), &less, &who("a", false)).unwrap_or_default();
        assert_eq!(a2["spec"], json!({"holderIdentity": "a"}));
    }
}
