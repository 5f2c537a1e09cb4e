//! The fake API server against the protocol, and against a client nobody here wrote: kubectl
//! (client-go 1.32) must get, watch, create, patch and delete through it.
#![allow(clippy::unwrap_used)]

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use super::*;

fn service(name: &str, app: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
           "spec": {"ports": [{"name": "http", "port": 9080}], "selector": {"app": app}}})
}

async fn get(url: &str) -> (u16, Value) {
    let r = reqwest::get(url).await.unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(Value::Null))
}

/// The lines of a watch, until `n` arrived or `wait` passed.
async fn watch_lines(url: &str, n: usize, wait: Duration) -> Vec<Value> {
    let mut r = reqwest::get(url).await.unwrap();
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(wait, async {
        while out.len() < n {
            match r.chunk().await {
                Ok(Some(c)) => {
                    buf.extend_from_slice(&c);
                    while let Some(i) = buf.iter().position(|&b| b == b'\n') {
                        let l: Vec<u8> = buf.drain(..=i).collect();
                        out.push(serde_json::from_slice(&l).unwrap());
                    }
                }
                _ => break,
            }
        }
    })
    .await;
    out
}

#[tokio::test]
async fn lists_page_with_continue_and_select_by_label() {
    let api = FakeApiServer::start().await.unwrap();
    for i in 0..5 {
        api.apply(service(&format!("s{i}"), if i % 2 == 0 { "even" } else { "odd" }))
            .unwrap();
    }
    let base = format!("{}/api/v1/namespaces/default/services", api.url());
    let (code, page1) = get(&format!("{base}?limit=2")).await;
    assert_eq!(code, 200);
    assert_eq!(page1["kind"], "ServiceList");
    assert_eq!(page1["items"].as_array().unwrap().len(), 2);
    assert_eq!(page1["metadata"]["remainingItemCount"], 3);
    let token = page1["metadata"]["continue"].as_str().unwrap();
    let (_, page2) = get(&format!("{base}?limit=10&continue={token}")).await;
    assert_eq!(page2["items"].as_array().unwrap().len(), 3);
    assert!(page2["metadata"].get("continue").is_none());
    let (_, odd) = get(&format!("{base}?labelSelector=app%3Dodd")).await;
    assert_eq!(odd["items"].as_array().unwrap().len(), 2);
    // A continue token from before a compaction is 410 Gone, with a Status.
    api.apply(service("s9", "odd")).unwrap();
    api.compact();
    let (code, status) = get(&format!("{base}?limit=2&continue={token}")).await;
    assert_eq!(
        (code, status["kind"].as_str(), status["code"].as_u64()),
        (410, Some("Status"), Some(410))
    );
}

#[tokio::test]
async fn watches_replay_from_a_resource_version_send_bookmarks_and_expire() {
    let api = FakeApiServer::start_with(FakeApiOptions {
        bookmark_interval: Duration::from_millis(100),
        ..FakeApiOptions::default()
    })
    .await
    .unwrap();
    api.apply(service("a", "x")).unwrap();
    let rv = api.resource_version();
    api.apply(service("b", "x")).unwrap();
    api.apply(service("a", "y")).unwrap();
    api.delete(&service("b", "x")).unwrap();
    let url = format!(
        "{}/api/v1/namespaces/default/services?watch=true&resourceVersion={rv}&allowWatchBookmarks=true",
        api.url()
    );
    let events = watch_lines(&url, 4, Duration::from_secs(5)).await;
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]);
    assert_eq!(
        events[3]["object"]["metadata"]["resourceVersion"],
        api.resource_version().to_string()
    );

    // A label-selected watch sees an object that stops matching as DELETED.
    let url = format!(
        "{}/api/v1/namespaces/default/services?watch=1&labelSelector=app%3Dy",
        api.url()
    );
    let pending = tokio::spawn(async move { watch_lines(&url, 2, Duration::from_secs(5)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    api.apply(service("a", "z")).unwrap();
    let events = pending.await.unwrap();
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["ADDED", "DELETED"]);

    // Expired history: 410 as an ERROR event.
    api.compact();
    let url = format!(
        "{}/api/v1/namespaces/default/services?watch=true&resourceVersion={rv}",
        api.url()
    );
    let events = watch_lines(&url, 1, Duration::from_secs(5)).await;
    assert_eq!(events[0]["type"], "ERROR");
    assert_eq!(events[0]["object"]["code"], 410);
}

#[tokio::test]
async fn streaming_initial_list_ends_with_a_marked_bookmark_and_drops_cut_the_stream() {
    let api = FakeApiServer::start().await.unwrap();
    api.apply(service("a", "x")).unwrap();
    let url = format!(
        "{}/api/v1/services?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
        api.url()
    );
    let mut r = reqwest::get(&url).await.unwrap();
    let mut text = String::new();
    while !text.contains("initial-events-end") {
        text.push_str(&String::from_utf8_lossy(&r.chunk().await.unwrap().unwrap()));
    }
    assert!(
        text.starts_with(r#"{"object":"#) || text.contains(r#""type":"ADDED""#),
        "{text}"
    );
    api.drop_watches();
    let mut ended = false;
    for _ in 0..10 {
        match tokio::time::timeout(Duration::from_secs(2), r.chunk()).await {
            Ok(Ok(Some(_))) => continue,
            Ok(Err(_)) => {
                ended = true;
                break;
            }
            Ok(Ok(None)) => panic!("a dropped watch must not end cleanly"),
            Err(_) => panic!("the watch was not dropped"),
        }
    }
    assert!(ended);
}

#[tokio::test]
async fn istio_kinds_are_served_in_every_version_and_groups_can_be_uninstalled() {
    let api = FakeApiServer::start().await.unwrap();
    api.apply(
        json!({"apiVersion": "networking.istio.io/v1beta1", "kind": "VirtualService",
                     "metadata": {"name": "r", "namespace": "default"}, "spec": {"hosts": ["r"]}}),
    )
    .unwrap();
    let (_, v1) = get(&format!(
        "{}/apis/networking.istio.io/v1/namespaces/default/virtualservices/r",
        api.url()
    ))
    .await;
    assert_eq!(v1["apiVersion"], "networking.istio.io/v1");
    let (_, a3) = get(&format!(
        "{}/apis/networking.istio.io/v1alpha3/virtualservices",
        api.url()
    ))
    .await;
    assert_eq!(a3["items"][0]["apiVersion"], "networking.istio.io/v1alpha3");
    api.uninstall_group("security.istio.io");
    let (code, _) = get(&format!(
        "{}/apis/security.istio.io/v1/authorizationpolicies",
        api.url()
    ))
    .await;
    assert_eq!(code, 404);
    let (_, groups) = get(&format!("{}/apis", api.url())).await;
    let names: Vec<&str> = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"networking.istio.io") && !names.contains(&"security.istio.io"),
        "{names:?}"
    );
}

/// kubectl with a kubeconfig for the fake; fails the test with a message when kubectl is missing.
fn kubectl(dir: &std::path::Path) -> Command {
    let bin = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    assert!(
        std::process::Command::new(&bin)
            .arg("version")
            .arg("--client")
            .output()
            .is_ok_and(|o| o.status.success()),
        "{bin} is missing: the fake API server is proven against kubectl (client-go); install kubectl or set KUBECTL"
    );
    let mut c = Command::new(bin);
    c.arg("--kubeconfig").arg(dir.join("kubeconfig"));
    c.stdin(Stdio::null()).kill_on_drop(true);
    c
}

async fn run(mut c: Command) -> String {
    let out = c.output().await.unwrap();
    assert!(
        out.status.success(),
        "kubectl failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn kubectl_creates_gets_watches_patches_and_deletes_through_the_fake() {
    let api = FakeApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    api.write_kubeconfig(&dir.path().join("kubeconfig")).unwrap();
    std::fs::write(
        dir.path().join("reviews.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: reviews\n  labels: {app: reviews}\n\
         spec:\n  ports: [{name: http, port: 9080}]\n  selector: {app: reviews}\n---\n\
         apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews}\n\
         spec: {hosts: [reviews], http: [{route: [{destination: {host: reviews}}]}]}\n",
    )
    .unwrap();

    let mut create = kubectl(dir.path());
    create.args(["create", "-f"]).arg(dir.path().join("reviews.yaml"));
    let out = run(create).await;
    assert!(
        out.contains("service/reviews created") && out.contains("virtualservice.networking.istio.io/reviews created"),
        "{out}"
    );

    let mut get = kubectl(dir.path());
    get.args(["get", "svc", "reviews", "-o", "json"]);
    let svc: Value = serde_json::from_str(&run(get).await).unwrap();
    assert_eq!(svc["spec"]["ports"][0]["port"], 9080);
    assert_eq!(svc["metadata"]["namespace"], "default");

    let mut names = kubectl(dir.path());
    names.args(["get", "virtualservices", "-o", "name"]);
    assert_eq!(run(names).await.trim(), "virtualservice.networking.istio.io/reviews");

    // Watch, then change through the API and through kubectl patch.
    let mut w = kubectl(dir.path());
    w.args(["get", "svc", "-w", "-o", "name"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut watcher = w.spawn().unwrap();
    let mut lines = BufReader::new(watcher.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // The initial list, then the watch.
    assert!(first.ends_with("service/reviews"), "{first}");

    api.apply(service("ratings", "ratings")).unwrap();
    let mut patch = kubectl(dir.path());
    patch.args([
        "patch",
        "svc",
        "reviews",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"version":"v2"}}}"#,
    ]);
    assert!(run(patch).await.contains("service/reviews patched"));

    let mut seen = Vec::new();
    while seen.len() < 2 {
        let l = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push(l);
    }
    // The created service, then the patched one, as the watch delivered them.
    assert_eq!(seen, ["service/ratings", "service/reviews"]);
    let _ = watcher.kill().await;

    let mut labels = kubectl(dir.path());
    labels.args(["get", "svc", "-l", "version=v2", "-o", "name"]);
    assert_eq!(run(labels).await.trim(), "service/reviews");

    let mut delete = kubectl(dir.path());
    delete.args(["delete", "svc", "reviews"]);
    assert!(run(delete).await.contains("deleted"));
    let mut all = kubectl(dir.path());
    all.args(["get", "svc", "-o", "name"]);
    assert_eq!(run(all).await.trim(), "service/ratings");
}

/// kubectl's TokenReview (`kubectl create -f review.yaml -o json`), answered as the API server
/// answers: authenticated with the user for a known token and a shared audience, not otherwise.
#[tokio::test]
async fn kubectl_token_reviews_are_answered_as_the_api_server_does() {
    let api = FakeApiServer::start().await.unwrap();
    api.add_token("good", "system:serviceaccount:default:reviews", &["istio-ca"]);
    let dir = tempfile::tempdir().unwrap();
    api.write_kubeconfig(&dir.path().join("kubeconfig")).unwrap();
    let review = |token: &str, audience: &str| {
        format!(
            "apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec: {{token: {token}, audiences: [{audience}]}}\n"
        )
    };
    let create = |file: &str| {
        let mut c = kubectl(dir.path());
        c.args(["create", "-o", "json", "-f"]).arg(dir.path().join(file));
        c
    };
    std::fs::write(dir.path().join("good.yaml"), review("good", "istio-ca")).unwrap();
    let answer: Value = serde_json::from_str(&run(create("good.yaml")).await).unwrap();
    assert_eq!(answer["status"]["authenticated"], true, "{answer}");
    assert_eq!(
        answer["status"]["user"]["username"],
        "system:serviceaccount:default:reviews"
    );
    std::fs::write(dir.path().join("aud.yaml"), review("good", "vault")).unwrap();
    let answer: Value = serde_json::from_str(&run(create("aud.yaml")).await).unwrap();
    assert_eq!(answer["status"]["authenticated"], false, "{answer}");
    std::fs::write(dir.path().join("bad.yaml"), review("bad", "istio-ca")).unwrap();
    let answer: Value = serde_json::from_str(&run(create("bad.yaml")).await).unwrap();
    assert!(
        answer["status"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("token lookup failed")),
        "{answer}"
    );
}

/// Validating admission: a webhook that cannot be called fails a matching create under
/// `failurePolicy: Fail` (500, naming the webhook) and is skipped under `Ignore`; objects the
/// `objectSelector` or the rules do not match never reach it; `dryRun=All` stores nothing.
#[tokio::test]
async fn validating_webhooks_are_called_for_matching_creates_only() {
    let api = FakeApiServer::start().await.unwrap();
    let config = |policy: &str| {
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "v"},
            "webhooks": [{"name": "v.example.com", "failurePolicy": policy, "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"service": {"name": "nowhere", "namespace": "default", "path": "/validate"}},
                "objectSelector": {"matchLabels": {"checked": "yes"}},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}]}]})
    };
    api.apply(config("Fail")).unwrap();
    let url = format!("{}/api/v1/namespaces/default/configmaps", api.url());
    let post = |labels: Value, dry_run: bool| {
        let url = if dry_run {
            format!("{url}?dryRun=All")
        } else {
            url.clone()
        };
        async move {
            let r = reqwest::Client::new()
                .post(url)
                .json(&json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("cm-{}", labels.to_string().len()), "labels": labels}}))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (code, status) = post(json!({"checked": "yes"}), false).await;
    assert_eq!(code, 500, "{status}");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .starts_with("Internal error occurred: failed calling webhook \"v.example.com\""),
        "{status}"
    );
    let (code, _) = post(json!({"checked": "no"}), false).await;
    assert_eq!(code, 201, "not selected: not called");
    api.apply(config("Ignore")).unwrap();
    let (code, _) = post(json!({"checked": "yes"}), true).await;
    assert_eq!(code, 201, "Ignore: skipped");
    let (_, list) = get(&url).await;
    assert_eq!(
        list["items"].as_array().unwrap().len(),
        1,
        "the dry run stored nothing: {list}"
    );
}

/// Over HTTPS (as a cluster's API server, for clients with the in-cluster config), kubectl
/// trusts the server's CA from the kubeconfig and talks to it as over HTTP; RBAC from stored
/// bindings refuses a service account what its roles do not grant.
#[tokio::test]
async fn kubectl_over_https_and_rbac_from_stored_bindings() {
    let api = FakeApiServer::start_with(FakeApiOptions {
        tls: true,
        ..FakeApiOptions::default()
    })
    .await
    .unwrap();
    assert!(api.url().starts_with("https://"), "{}", api.url());
    let dir = tempfile::tempdir().unwrap();
    api.write_kubeconfig(&dir.path().join("kubeconfig")).unwrap();
    std::fs::write(
        dir.path().join("rbac.yaml"),
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: reader}\n\
         rules: [{apiGroups: [\"\"], resources: [services], verbs: [get, list]}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: reader}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: reader}\n\
         subjects: [{kind: ServiceAccount, name: app, namespace: default}]\n",
    )
    .unwrap();
    let mut apply = kubectl(dir.path());
    apply.args(["apply", "-f"]).arg(dir.path().join("rbac.yaml"));
    run(apply).await;
    api.authorize_by_bindings("app-token", "default", "app");
    api.write_kubeconfig_with_token(&dir.path().join("kubeconfig"), "app-token")
        .unwrap();
    let mut list = kubectl(dir.path());
    list.args(["get", "services", "-o", "name"]);
    run(list).await;
    let mut denied = kubectl(dir.path());
    denied.args(["get", "configmaps", "-o", "name"]);
    let out = denied.output().await.unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Forbidden")
            || String::from_utf8_lossy(&out.stderr).contains("forbidden"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(api.forbidden().len(), 1, "{:?}", api.forbidden());
}

/// coordination.k8s.io/v1 Leases through kubectl's server-side apply: created when absent, a
/// second field manager that would change the holder gets Kubernetes' conflict, and takes it
/// with `--force-conflicts`; `kubectl get lease` lists it.
#[tokio::test]
async fn kubectl_applies_leases_server_side_with_field_manager_conflicts() {
    let api = FakeApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    api.write_kubeconfig(&dir.path().join("kubeconfig")).unwrap();
    let lease = |holder: &str| {
        format!(
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {{name: istio-namespace-controller-election, namespace: istio-system}}\n\
             spec: {{holderIdentity: {holder}, leaseDurationSeconds: 30}}\n"
        )
    };
    let apply = |holder: &str, manager: &str, force: bool| {
        let file = dir.path().join(format!("{manager}.yaml"));
        std::fs::write(&file, lease(holder)).unwrap();
        let mut c = kubectl(dir.path());
        c.args(["apply", "--server-side", "--field-manager", manager, "-f"])
            .arg(file);
        if force {
            c.arg("--force-conflicts");
        }
        c
    };
    let out = run(apply("a", "replica-a", false)).await;
    assert!(
        out.contains("lease.coordination.k8s.io/istio-namespace-controller-election serverside-applied"),
        "{out}"
    );
    // Applying the same again is no conflict.
    run(apply("a", "replica-a", false)).await;

    let refused = apply("b", "replica-b", false).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a second manager changed the holder");
    assert!(
        stderr.contains("conflict with \"replica-a\"") && stderr.contains(".spec.holderIdentity"),
        "{stderr}"
    );
    run(apply("b", "replica-b", true)).await;

    let mut get = kubectl(dir.path());
    get.args(["get", "lease", "-n", "istio-system"]);
    let table = run(get).await;
    assert!(table.contains("istio-namespace-controller-election"), "{table}");
    let mut json = kubectl(dir.path());
    json.args([
        "get",
        "lease",
        "-n",
        "istio-system",
        "-o",
        "json",
        "--show-managed-fields",
    ]);
    let list: Value = serde_json::from_str(&run(json).await).unwrap();
    let l = &list["items"][0];
    assert_eq!(l["spec"]["holderIdentity"], "b");
    assert_eq!(l["spec"]["leaseDurationSeconds"], 30);
    let managers: Vec<&str> = l["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["manager"].as_str())
        .collect();
    assert!(managers.contains(&"replica-b"), "{managers:?}");
}

/// A Role allows in its own namespace only; a token bound to one is refused elsewhere.
#[tokio::test]
async fn a_role_allows_leases_in_its_namespace_only() {
    let api = FakeApiServer::start().await.unwrap();
    api.bind_role(
        "istiod",
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: istiod, namespace: istio-system}\n\
         rules:\n- apiGroups: [coordination.k8s.io]\n  resources: [leases]\n  verbs: [get, update, patch, create]\n",
    )
    .unwrap();
    let client = reqwest::Client::new();
    let post = |ns: &str| {
        client
            .post(format!(
                "{}/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
                api.url()
            ))
            .bearer_auth("istiod")
            .json(&json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}}))
            .send()
    };
    assert_eq!(post("istio-system").await.unwrap().status(), 201);
    assert_eq!(post("default").await.unwrap().status(), 403);
    let list = client
        .get(format!("{}/apis/coordination.k8s.io/v1/leases", api.url()))
        .bearer_auth("istiod")
        .send()
        .await
        .unwrap();
    assert_eq!(list.status(), 403, "a Role does not list across namespaces");
    assert_eq!(api.requests_by("istiod").len(), 3);
    assert_eq!(api.forbidden().len(), 2);
}

/// Mutating admission: a matching create is sent to the webhook, its JSON patch is applied before
/// the object is stored (webhooks in order, each seeing the previous one's patch), a denial
/// fails the create with the webhook's message, and a dry run fails at a webhook with side effects.
#[tokio::test]
async fn mutating_webhooks_patch_matching_creates() {
    use axum::Json;
    use base64::Engine;
    // The webhook: adds a label naming the labels it saw; denies objects labelled `deny`.
    async fn mutate(Json(review): Json<Value>) -> Json<Value> {
        let request = &review["request"];
        let labels = request["object"]["metadata"]["labels"].clone();
        let uid = request["uid"].clone();
        let response = if labels.get("deny").is_some() {
            json!({"uid": uid, "allowed": false, "status": {"message": "no, thanks"}})
        } else {
            let seen: Vec<&str> = labels
                .as_object()
                .map(|l| l.keys().map(String::as_str).collect())
                .unwrap_or_default();
            let key = format!("/metadata/labels/seen-{}", seen.len());
            let patch = json!([{"op": "add", "path": key, "value": seen.join(".")}]).to_string();
            json!({"uid": uid, "allowed": true, "patchType": "JSONPatch",
                   "patch": base64::engine::general_purpose::STANDARD.encode(patch)})
        };
        Json(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}))
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            axum::Router::new().route("/mutate", axum::routing::post(mutate)),
        )
        .await
    });
    let api = FakeApiServer::start().await.unwrap();
    let webhook = |name: &str, side_effects: &str| {
        json!({"name": name, "sideEffects": side_effects, "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": format!("http://{addr}/mutate")},
            "objectSelector": {"matchExpressions": [{"key": "mutate", "operator": "Exists"}]},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}]})
    };
    api.apply(json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "m"}, "webhooks": [webhook("a.example.com", "None"), webhook("b.example.com", "NoneOnDryRun")]}))
        .unwrap();
    let url = format!("{}/api/v1/namespaces/default/configmaps", api.url());
    let post = |name: &str, labels: Value, query: &str| {
        let url = format!("{url}{query}");
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}});
        async move {
            let r = reqwest::Client::new().post(url).json(&body).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (code, created) = post("one", json!({"mutate": "yes"}), "").await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(
        created["metadata"]["labels"],
        json!({"mutate": "yes", "seen-1": "mutate", "seen-2": "mutate.seen-1"}),
        "both webhooks, the second after the first"
    );
    let (_, stored) = get(&format!("{url}/one")).await;
    assert_eq!(stored["metadata"]["labels"]["seen-2"], "mutate.seen-1", "{stored}");
    let (code, created) = post("two", json!({"other": "x"}), "").await;
    assert_eq!(
        (code, &created["metadata"]["labels"]),
        (201, &json!({"other": "x"})),
        "not selected"
    );
    let (code, status) = post("three", json!({"mutate": "yes", "deny": "1"}), "").await;
    assert_eq!(code, 400, "{status}");
    assert_eq!(
        status["message"],
        "admission webhook \"a.example.com\" denied the request: no, thanks"
    );
    api.apply(
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "m"}, "webhooks": [webhook("c.example.com", "Some")]}),
    )
    .unwrap();
    let (code, status) = post("four", json!({"mutate": "yes"}), "?dryRun=All").await;
    assert_eq!(code, 400, "{status}");
    assert!(
        status["message"].as_str().unwrap().contains("has side effects"),
        "{status}"
    );
}
