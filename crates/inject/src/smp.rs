//! Kubernetes strategic merge patch of a Pod (apimachinery's `strategicpatch`, as Istio's
//! `applyOverlayYAML` applies each rendered template): maps merge, `null` deletes, lists with a
//! merge key (containers, initContainers, volumes and imagePullSecrets by `name`, env by `name`,
//! volumeMounts by `mountPath`, ports by `containerPort`, ...) merge item by item, other lists
//! are replaced, and the `$patch: replace|delete|merge` directives of maps and list items.
//! Items keep apimachinery's order: patch items in patch order, with the original's other items
//! placed among them by their original order (`normalizeElementOrder`).

use serde_json::{Map, Value as Json};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SmpError {
    #[error("strategic merge: {path}: {reason}")]
    Invalid { path: String, reason: String },
}

/// How a list field of the Pod merges.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ListStrategy {
    Replace,
    /// Items are maps merged by this key.
    MergeBy(&'static str),
    /// Items are scalars, the union is kept.
    MergePrimitives,
}

/// The Pod schema's merge keys (`patchStrategy:"merge" patchMergeKey:...` in `k8s.io/api`),
/// by field name path from the Pod (list items add nothing to the path).
fn list_strategy(path: &[String]) -> ListStrategy {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    let container_list = |f: &str| matches!(f, "containers" | "initContainers" | "ephemeralContainers");
    match p.as_slice() {
        ["metadata", "ownerReferences"] => ListStrategy::MergeBy("uid"),
        ["metadata", "finalizers"] => ListStrategy::MergePrimitives,
        ["spec", c] if container_list(c) => ListStrategy::MergeBy("name"),
        [
            "spec",
            "volumes" | "imagePullSecrets" | "resourceClaims" | "schedulingGates",
        ] => ListStrategy::MergeBy("name"),
        ["spec", "hostAliases"] => ListStrategy::MergeBy("ip"),
        ["spec", c, "env"] if container_list(c) => ListStrategy::MergeBy("name"),
        ["spec", c, "ports"] if container_list(c) => ListStrategy::MergeBy("containerPort"),
        ["spec", c, "volumeMounts"] if container_list(c) => ListStrategy::MergeBy("mountPath"),
        ["spec", c, "volumeDevices"] if container_list(c) => ListStrategy::MergeBy("devicePath"),
        ["status", "conditions"] => ListStrategy::MergeBy("type"),
        _ => ListStrategy::Replace,
    }
}

/// `patch` (a partial Pod, from a template's YAML) merged onto `original`; nulls in new items
/// are dropped, as Go's round trip through `corev1.Pod` drops them.
pub(crate) fn strategic_merge(original: &Json, patch: &Json) -> Result<Json, SmpError> {
    let out = match (original, patch) {
        (Json::Object(o), Json::Object(p)) => Json::Object(merge_map(o.clone(), p, &mut Vec::new())?),
        (_, Json::Null) => original.clone(),
        (_, other) => {
            return Err(SmpError::Invalid {
                path: String::new(),
                reason: format!("patch is not a map: {other}"),
            });
        }
    };
    Ok(out)
}

fn err(path: &[String], reason: impl Into<String>) -> SmpError {
    SmpError::Invalid {
        path: path.join("."),
        reason: reason.into(),
    }
}

fn merge_map(
    mut original: Map<String, Json>,
    patch: &Map<String, Json>,
    path: &mut Vec<String>,
) -> Result<Map<String, Json>, SmpError> {
    match patch.get("$patch").and_then(Json::as_str) {
        Some("replace") => {
            let mut p = patch.clone();
            p.remove("$patch");
            return Ok(p);
        }
        Some("delete") => return Ok(Map::new()),
        Some("merge") | None => {}
        Some(other) => return Err(err(path, format!("unknown patch type {other:?}"))),
    }
    for (k, pv) in patch {
        if k == "$patch" || k.starts_with("$setElementOrder/") || k == "$retainKeys" {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Json::Array(list)), Json::Array(del)) = (original.get_mut(field), pv) {
                list.retain(|v| !del.contains(v));
            }
            continue;
        }
        if pv.is_null() {
            original.remove(k);
            continue;
        }
        path.push(k.clone());
        let merged = match (original.remove(k), pv) {
            (Some(Json::Object(o)), Json::Object(p)) => Json::Object(merge_map(o, p, path)?),
            (None, Json::Object(p)) => Json::Object(merge_map(Map::new(), p, path)?),
            (Some(Json::Array(o)), Json::Array(p)) => Json::Array(merge_list(o, p, path)?),
            (None, Json::Array(p)) => Json::Array(merge_list(Vec::new(), p, path)?),
            (_, p) => p.clone(),
        };
        path.pop();
        original.insert(k.clone(), merged);
    }
    Ok(original)
}

fn merge_list(original: Vec<Json>, patch: &[Json], path: &mut Vec<String>) -> Result<Vec<Json>, SmpError> {
    let key = match list_strategy(path) {
        ListStrategy::Replace => {
            // `- $patch: replace` items are directives even here; drop them.
            return Ok(patch
                .iter()
                .filter(|v| v.get("$patch").is_none())
                .map(without_nulls)
                .collect());
        }
        ListStrategy::MergePrimitives => {
            let mut out = original;
            for v in patch {
                if !out.contains(v) {
                    out.push(v.clone());
                }
            }
            return Ok(out);
        }
        ListStrategy::MergeBy(key) => key,
    };
    // Special elements: `{$patch: replace}` replaces the whole list, `{$patch: delete, key: v}`
    // deletes the original's item with that key.
    let mut original = original;
    let mut items = Vec::new();
    for v in patch {
        let Json::Object(m) = v else {
            return Err(err(path, format!("list item is not a map: {v}")));
        };
        match m.get("$patch").and_then(Json::as_str) {
            Some("replace") => {
                let rest: Vec<Json> = patch
                    .iter()
                    .filter(|v| v.get("$patch").is_none())
                    .map(without_nulls)
                    .collect();
                return Ok(rest);
            }
            Some("delete") => {
                let kv = m
                    .get(key)
                    .ok_or_else(|| err(path, format!("delete directive without {key:?}")))?;
                original.retain(|o| o.get(key) != Some(kv));
            }
            Some("merge") | None => items.push(m),
            Some(other) => return Err(err(path, format!("unknown patch type {other:?}"))),
        }
    }
    let server_order: Vec<Option<Json>> = original.iter().map(|o| o.get(key).cloned()).collect();
    let mut merged = original;
    for m in &items {
        let kv = m
            .get(key)
            .ok_or_else(|| err(path, format!("list item has no merge key {key:?}")))?;
        match merged.iter().position(|o| o.get(key) == Some(kv)) {
            Some(i) => {
                let Json::Object(o) = std::mem::take(&mut merged[i]) else {
                    return Err(err(path, "original list item is not a map"));
                };
                merged[i] = Json::Object(merge_map(o, m, path)?);
            }
            None => merged.push(Json::Object(merge_map(Map::new(), m, path)?)),
        }
    }
    // normalizeElementOrder: patch items in patch order, server-only items in server order,
    // interleaved by the server order where both are known.
    let patch_keys: Vec<&Json> = items.iter().filter_map(|m| m.get(key)).collect();
    let (mut in_patch, server_only): (Vec<Json>, Vec<Json>) = merged
        .into_iter()
        .partition(|v| v.get(key).is_some_and(|k| patch_keys.contains(&k)));
    in_patch.sort_by_key(|v| patch_keys.iter().position(|k| Some(*k) == v.get(key)));
    let server_index = |v: &Json| server_order.iter().position(|k| k.as_ref() == v.get(key));
    Ok(merge_sorted(server_only, in_patch, server_index))
}

/// apimachinery's `mergeSortedSlice`: `left` (server-only) items go before a `right` (patch)
/// item only when both are in the server's list and the left one comes first there.
fn merge_sorted(left: Vec<Json>, right: Vec<Json>, server_index: impl Fn(&Json) -> Option<usize>) -> Vec<Json> {
    let mut out = Vec::with_capacity(left.len() + right.len());
    let mut l = left.into_iter().peekable();
    let mut r = right.into_iter().peekable();
    loop {
        match (l.peek(), r.peek()) {
            (None, None) => break,
            (Some(_), None) => out.extend(l.by_ref()),
            (None, Some(_)) => out.extend(r.by_ref()),
            (Some(a), Some(b)) => {
                let left_first = matches!((server_index(a), server_index(b)), (Some(x), Some(y)) if x < y);
                if left_first {
                    out.extend(l.next());
                } else {
                    out.extend(r.next());
                }
            }
        }
    }
    out
}

fn without_nulls(v: &Json) -> Json {
    let mut v = v.clone();
    strip_nulls(&mut v);
    v
}

/// Removes `null` values from maps (recursively); Go's typed round trip leaves none.
pub(crate) fn strip_nulls(v: &mut Json) {
    match v {
        Json::Object(m) => {
            m.retain(|_, v| !v.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        Json::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

#[cfg(test)]
#[path = "smp_tests.rs"]
mod tests;
