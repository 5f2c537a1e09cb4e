//! The JWKS resolver, as istiod's `JwksResolver` with `PILOT_JWT_ENABLE_REMOTE_JWKS=false`: the
//! JWKS of every RequestAuthentication rule without inline `jwks` are fetched here (from
//! `jwksUri`, else the one the issuer's OpenID discovery document names) and inlined into the
//! proxies' `jwt_authn` filters, so Envoy needs no route to the issuer. Keys are fetched when a
//! rule first names them and again every `PILOT_JWT_PUB_KEY_REFRESH_INTERVAL` (a failed fetch is
//! tried again after a minute, doubling up to the refresh interval, and keeps the keys fetched
//! before); a change of keys pushes the RequestAuthentications that use them. Until a JWKS has
//! been fetched the filter carries a key set nobody can sign for, so tokens are rejected, never
//! accepted (fail closed). Counted as Istio's `pilot_jwks_resolver_network_fetch_{success,fail}_total`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use environment::Environment;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use push_index::security_policies::{JwksKey, JwksKeys};
use tokio::sync::Notify;
use tokio::time::Instant;
use xds_server::DiscoveryServer;

/// Istio's `JwtPubKeyRefreshIntervalOnFailure`.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(60);
/// Each request (Istio's default rule `timeout`).
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Istio's `getRemoteContentWithRetry`: three attempts, a second apart.
const ATTEMPTS: u32 = 3;
const ATTEMPT_INTERVAL: Duration = Duration::from_secs(1);
/// The largest JWKS or discovery document read.
const MAX_DOCUMENT: usize = 1 << 20;

#[derive(Clone, Default)]
pub(crate) struct JwksMetrics {
    success: Counter,
    fail: Counter,
}

impl JwksMetrics {
    pub(crate) fn register(registry: &mut Registry) -> JwksMetrics {
        let m = JwksMetrics::default();
        registry.register(
            "pilot_jwks_resolver_network_fetch_success",
            "Total number of successfully network fetch by pilot jwks resolver",
            m.success.clone(),
        );
        registry.register(
            "pilot_jwks_resolver_network_fetch_fail",
            "Total number of failed network fetch by pilot jwks resolver",
            m.fail.clone(),
        );
        m
    }
}

struct Entry {
    jwks: Option<String>,
    next_fetch: Instant,
    /// The wait after the next failure.
    backoff: Duration,
}

/// Wakes the resolver after config changes.
#[derive(Clone, Default)]
pub(crate) struct JwksWake(Arc<Notify>);

impl JwksWake {
    pub(crate) fn configs_changed(&self) {
        self.0.notify_one();
    }
}

/// Starts the resolver; returns what the config loop pings after each change.
pub(crate) fn spawn(
    env: Arc<Environment>,
    server: Arc<DiscoveryServer<Environment>>,
    refresh: Duration,
    metrics: JwksMetrics,
) -> JwksWake {
    let wake = JwksWake::default();
    let notified = wake.0.clone();
    let http = reqwest::Client::builder()
        .timeout(FETCH_TIMEOUT)
        .build()
        .unwrap_or_default();
    tokio::spawn(async move {
        let mut entries: BTreeMap<JwksKey, Entry> = BTreeMap::new();
        loop {
            let wanted = env.jwks_wanted();
            entries.retain(|k, _| wanted.contains_key(k));
            let now = Instant::now();
            for k in wanted.keys() {
                entries.entry(k.clone()).or_insert(Entry {
                    jwks: None,
                    next_fetch: now,
                    backoff: RETRY_AFTER_FAILURE,
                });
            }
            let due: Vec<JwksKey> = entries
                .iter()
                .filter(|(_, e)| e.next_fetch <= now)
                .map(|(k, _)| k.clone())
                .collect();
            let fetched = futures::future::join_all(due.iter().map(|k| fetch(&http, k))).await;
            let mut changed_users = Vec::new();
            for (key, result) in due.into_iter().zip(fetched) {
                let Some(e) = entries.get_mut(&key) else { continue };
                match result {
                    Ok(jwks) => {
                        metrics.success.inc();
                        if e.jwks.as_ref() != Some(&jwks) {
                            changed_users.extend(wanted.get(&key).cloned().unwrap_or_default());
                        }
                        e.jwks = Some(jwks);
                        e.next_fetch = Instant::now() + refresh;
                        e.backoff = RETRY_AFTER_FAILURE;
                    }
                    Err(why) => {
                        metrics.fail.inc();
                        tracing::warn!(
                            issuer = %key.issuer,
                            jwks_uri = %key.jwks_uri,
                            "JWKS fetch failed, tokens of this issuer are rejected until it succeeds: {why}"
                        );
                        e.next_fetch = Instant::now() + e.backoff;
                        e.backoff = (e.backoff * 2).min(refresh.max(RETRY_AFTER_FAILURE));
                    }
                }
            }
            let keys: JwksKeys = entries
                .iter()
                .filter_map(|(k, e)| e.jwks.clone().map(|j| (k.clone(), j)))
                .collect();
            changed_users.sort();
            changed_users.dedup();
            crate::push::dispatch(&server, env.set_jwks(keys, changed_users));
            let next = entries.values().map(|e| e.next_fetch).min();
            tokio::select! {
                _ = notified.notified() => {}
                _ = sleep_until(next) => {}
            }
        }
    });
    wake
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The key's JWKS document: `jwksUri`, else the issuer's discovery document's `jwks_uri`.
async fn fetch(http: &reqwest::Client, key: &JwksKey) -> Result<String, String> {
    let uri = if key.jwks_uri.is_empty() {
        if key.issuer.is_empty() {
            return Err("jwksUri and issuer are both empty".into());
        }
        let discovery = format!("{}/.well-known/openid-configuration", key.issuer.trim_end_matches('/'));
        let doc = get(http, &discovery).await?;
        let v: serde_json::Value =
            serde_json::from_slice(&doc).map_err(|e| format!("{discovery}: not an OpenID discovery document: {e}"))?;
        v.get("jwks_uri")
            .and_then(serde_json::Value::as_str)
            .filter(|u| !u.is_empty())
            .ok_or_else(|| format!("{discovery}: no jwks_uri"))?
            .to_owned()
    } else {
        key.jwks_uri.clone()
    };
    let body = get(http, &uri).await?;
    let text = String::from_utf8(body).map_err(|_| format!("{uri}: not UTF-8"))?;
    check_jwks(&text).map_err(|e| format!("{uri}: not a JWKS: {e}"))?;
    Ok(text)
}

/// A JSON object with a non-empty `keys` array of objects with a `kty` each.
fn check_jwks(text: &str) -> Result<(), String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let keys = v
        .get("keys")
        .and_then(serde_json::Value::as_array)
        .filter(|k| !k.is_empty())
        .ok_or("no keys")?;
    if keys
        .iter()
        .any(|k| k.get("kty").and_then(serde_json::Value::as_str).is_none())
    {
        return Err("a key without \"kty\"".into());
    }
    Ok(())
}

/// GET with Istio's retries; the body, at most `MAX_DOCUMENT` bytes.
async fn get(http: &reqwest::Client, uri: &str) -> Result<Vec<u8>, String> {
    let mut last = String::new();
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(ATTEMPT_INTERVAL).await;
        }
        match http.get(uri).send().await {
            Ok(r) if r.status().is_success() => {
                if r.content_length().is_some_and(|n| n > MAX_DOCUMENT as u64) {
                    return Err(format!("GET {uri}: larger than {MAX_DOCUMENT} bytes"));
                }
                let body = r.bytes().await.map_err(|e| format!("GET {uri}: {e}"))?;
                if body.len() > MAX_DOCUMENT {
                    return Err(format!("GET {uri}: larger than {MAX_DOCUMENT} bytes"));
                }
                return Ok(body.to_vec());
            }
            Ok(r) => last = format!("GET {uri}: HTTP {}", r.status()),
            Err(e) => last = format!("GET {uri}: {e}"),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwks_documents_need_keys_with_a_type() {
        assert!(check_jwks(r#"{"keys": [{"kty": "RSA", "n": "x", "e": "AQAB"}]}"#).is_ok());
        assert!(check_jwks(r#"{"keys": []}"#).is_err());
        assert!(check_jwks(r#"{"keys": [{}]}"#).is_err());
        assert!(check_jwks("<html>").is_err());
    }

    #[tokio::test]
    async fn keys_come_from_jwks_uri_or_openid_discovery() {
        use axum::routing::get as route;
        let jwks = r#"{"keys": [{"kty": "EC", "crv": "P-256", "x": "a", "y": "b"}]}"#;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let issuer = base.clone();
        let app = axum::Router::new()
            .route("/jwks", route(move || async move { jwks }))
            .route(
                "/.well-known/openid-configuration",
                route(move || {
                    let uri = format!("{issuer}/jwks");
                    async move { axum::Json(serde_json::json!({"issuer": "x", "jwks_uri": uri})) }
                }),
            )
            .route("/html", route(|| async { "<html>" }));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let http = reqwest::Client::new();
        let key = |issuer: &str, uri: &str| JwksKey {
            issuer: issuer.into(),
            jwks_uri: uri.into(),
        };
        assert_eq!(fetch(&http, &key("i", &format!("{base}/jwks"))).await.unwrap(), jwks);
        assert_eq!(fetch(&http, &key(&base, "")).await.unwrap(), jwks);
        let bad = fetch(&http, &key("i", &format!("{base}/html"))).await.unwrap_err();
        assert!(bad.contains("not a JWKS"), "{bad}");
    }
}
