//! Target `admission_review`: one request body sent to the validating webhook on 15017 (by the
//! API server, or by anyone who reaches the port), answered as pilot-discovery answers it
//! (`webhooks::admission::serve` with `webhooks::validation::validate`). Any body gets an HTTP
//! error of Istio's or an AdmissionReview with a verdict, and the uid of the review it answers.

use serde_json::Value;

pub fn admission_review(data: &[u8]) {
    let admit = |r: &webhooks::admission::AdmissionRequest| webhooks::validation::validate(r).response;
    match webhooks::admission::serve(Some("application/json"), data, admit) {
        Ok(out) => {
            let answer: Value = serde_json::from_slice(&out).unwrap_or_else(|e| panic!("the answer is not JSON: {e}"));
            assert_eq!(answer["kind"], "AdmissionReview", "{answer}");
            assert!(answer["response"]["allowed"].is_boolean(), "{answer}");
            assert!(answer.get("request").is_none(), "{answer}");
            let asked: Option<Value> = serde_json::from_slice(data).ok();
            if let Some(uid) = asked
                .as_ref()
                .and_then(|a| a.pointer("/request/uid"))
                .and_then(Value::as_str)
                && answer["response"]["status"]["message"]
                    .as_str()
                    .is_none_or(|m| !m.starts_with("could not decode body"))
            {
                assert_eq!(answer["response"]["uid"], uid, "{answer}");
            }
        }
        Err(e) => assert!(matches!(e.status, 400 | 413 | 415), "{e:?}"),
    }
}

/// Reviews the API server sends: valid and invalid objects, v1 and v1beta1, another operation.
pub(crate) fn seeds() -> Vec<Vec<u8>> {
    let review = |version: &str, operation: &str, object: Value| {
        serde_json::json!({
            "apiVersion": version,
            "kind": "AdmissionReview",
            "request": {
                "uid": "c9a2b8e4-9c1d-4c1f-8f3e-2b6f0a7d1e55",
                "kind": {"group": "networking.istio.io", "version": "v1", "kind": object["kind"]},
                "resource": {"group": "networking.istio.io", "version": "v1", "resource": "virtualservices"},
                "namespace": "default",
                "name": "reviews",
                "operation": operation,
                "object": object,
                "dryRun": false,
            }
        })
        .to_string()
        .into_bytes()
    };
    let vs = |http: Value| {
        serde_json::json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "VirtualService",
            "metadata": {"name": "reviews", "namespace": "default"},
            "spec": {"hosts": ["reviews"], "http": http},
        })
    };
    let route = serde_json::json!([{"route": [{"destination": {"host": "reviews", "subset": "v1"}, "weight": 100}]}]);
    let bad = serde_json::json!([{"route": [{"destination": {"host": "reviews"}, "weight": -1}]}]);
    let dr = serde_json::json!({
        "apiVersion": "networking.istio.io/v1beta1",
        "kind": "DestinationRule",
        "metadata": {"name": "reviews"},
        "spec": {"host": "reviews", "subsets": [{"name": "v1", "labels": {"version": "v1"}}],
                 "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}}},
    });
    vec![
        review("admission.k8s.io/v1", "CREATE", vs(route.clone())),
        review("admission.k8s.io/v1", "UPDATE", vs(bad)),
        review("admission.k8s.io/v1beta1", "CREATE", dr),
        review("admission.k8s.io/v1", "DELETE", vs(route)),
    ]
}
