//! Tests of the strategic merge patch against apimachinery's behaviour on Pods.

use serde_json::json;

use super::*;

fn smp(o: Json, p: Json) -> Json {
    strategic_merge(&o, &p).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn containers_merge_by_name_and_new_patch_items_come_first() {
    let o = json!({"spec": {"containers": [{"name": "app", "image": "a", "env": [{"name": "A", "value": "1"}]}]}});
    let p = json!({"spec": {"containers": [
        {"name": "istio-proxy", "image": "p", "emptyDir": null},
        {"name": "app", "env": [{"name": "B", "value": "2"}, {"name": "A", "value": "3"}]}
    ]}});
    let got = smp(o, p);
    assert_eq!(
        got,
        json!({"spec": {"containers": [
            {"name": "istio-proxy", "image": "p"},
            {"name": "app", "image": "a", "env": [{"name": "B", "value": "2"}, {"name": "A", "value": "3"}]}
        ]}})
    );
}

#[test]
fn server_only_items_keep_their_place_before_known_patch_items() {
    let o = json!({"spec": {"volumes": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}});
    let p = json!({"spec": {"volumes": [{"name": "x"}, {"name": "c", "emptyDir": {}}]}});
    let names: Vec<Json> = smp(o, p)["spec"]["volumes"]
        .as_array()
        .map(|a| a.iter().map(|v| v["name"].clone()).collect())
        .unwrap_or_default();
    assert_eq!(names, vec![json!("x"), json!("a"), json!("b"), json!("c")]);
}

#[test]
fn ports_merge_by_container_port_mounts_by_path_args_replace() {
    let o = json!({"spec": {"containers": [{"name": "c", "args": ["a"], "ports": [{"containerPort": 80, "name": "http"}],
        "volumeMounts": [{"mountPath": "/x", "name": "v"}]}]}});
    let p = json!({"spec": {"containers": [{"name": "c", "args": ["b"], "ports": [{"containerPort": 80, "protocol": "TCP"}],
        "volumeMounts": [{"mountPath": "/x", "readOnly": true}]}]}});
    assert_eq!(
        smp(o, p)["spec"]["containers"][0],
        json!({"name": "c", "args": ["b"], "ports": [{"containerPort": 80, "name": "http", "protocol": "TCP"}],
            "volumeMounts": [{"mountPath": "/x", "name": "v", "readOnly": true}]})
    );
}

#[test]
fn null_deletes_and_patch_directives() {
    let o = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"initContainers": [{"name": "i"}], "volumes": [{"name": "v"}]}});
    let p = json!({"metadata": {"labels": {"a": null}},
        "spec": {"initContainers": [{"$patch": "replace"}], "volumes": [{"name": "v", "$patch": "delete"}],
                 "securityContext": {"$patch": "replace", "runAsUser": 1}}});
    assert_eq!(
        smp(o, p),
        json!({"metadata": {"labels": {"b": "2"}}, "spec": {"initContainers": [], "volumes": [], "securityContext": {"runAsUser": 1}}})
    );
}

#[test]
fn bad_patches_are_errors_not_panics() {
    assert!(strategic_merge(&json!({}), &json!([1])).is_err());
    assert!(
        strategic_merge(
            &json!({"spec": {"containers": []}}),
            &json!({"spec": {"containers": [1]}})
        )
        .is_err()
    );
    assert!(strategic_merge(&json!({}), &json!({"spec": {"containers": [{"image": "x"}]}})).is_err());
}
