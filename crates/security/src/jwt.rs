//! Istio's `JwtAuthenticator` (security/pkg/server/ca/authenticate/oidc.go), for pilot-discovery
//! without a cluster: bearer JWTs checked against `JWT_RULE` (JSON: `issuer`, `jwksUri` or inline
//! `jwks`, `audiences`). The signing keys are the rule's `jwks`, else those at `jwksUri`, else
//! those the issuer's OpenID discovery document names; fetched keys are refreshed every few
//! minutes and when a token names a key not seen yet. The caller is the service account of the
//! token's `sub` (`system:serviceaccount:<ns>:<sa>`).

use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{DecodingKey, Validation, decode, decode_header};
use serde::Deserialize;
use tokio::sync::Mutex;

use crate::authn::{AuthContext, AuthError, AuthFuture, AuthSource, Authenticator, Caller};
use crate::spiffe;

/// How long fetched keys are used before they are fetched again.
const KEYS_MAX_AGE: Duration = Duration::from_secs(5 * 60);
/// A token naming an unknown key fetches the keys again, at most this often.
const UNKNOWN_KEY_REFETCH: Duration = Duration::from_secs(10);
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Istio's `JWT_RULE` (a `security.istio.io` JWTRule, as JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct JwtRule {
    pub issuer: String,
    pub jwks_uri: String,
    /// Inline JWKS (a JSON string).
    pub jwks: String,
    pub audiences: Vec<String>,
}

impl JwtRule {
    /// Parses `JWT_RULE`; the error names what is wrong.
    pub fn parse(json: &str) -> Result<JwtRule, String> {
        let rule: JwtRule = serde_json::from_str(json).map_err(|e| format!("JWT_RULE: {e}"))?;
        if rule.issuer.is_empty() {
            return Err("JWT_RULE: issuer is required".into());
        }
        if !rule.jwks.is_empty() {
            serde_json::from_str::<JwkSet>(&rule.jwks).map_err(|e| format!("JWT_RULE: jwks: {e}"))?;
        }
        Ok(rule)
    }
}

#[derive(Debug, Default)]
struct Keys {
    set: Option<JwkSet>,
    fetched: Option<Instant>,
}

pub struct JwtAuthenticator {
    rule: JwtRule,
    /// The rule's audiences, else `TOKEN_AUDIENCES`.
    audiences: Vec<String>,
    trust_domain: String,
    keys: Mutex<Keys>,
    http: reqwest::Client,
}

impl std::fmt::Debug for JwtAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtAuthenticator")
            .field("issuer", &self.rule.issuer)
            .field("audiences", &self.audiences)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Deserialize)]
struct Claims {
    #[serde(default)]
    sub: String,
    #[serde(default)]
    aud: Audiences,
}

#[derive(Debug, Default, Deserialize)]
#[serde(untagged)]
enum Audiences {
    #[default]
    None,
    One(String),
    Many(Vec<String>),
}

impl Audiences {
    fn contains_any(&self, expected: &[String]) -> bool {
        match self {
            Audiences::None => false,
            Audiences::One(a) => expected.contains(a),
            Audiences::Many(v) => v.iter().any(|a| expected.contains(a)),
        }
    }
}

#[derive(Debug, Deserialize)]
struct Discovery {
    jwks_uri: String,
}

impl JwtAuthenticator {
    /// `default_audiences` (Istio's `TOKEN_AUDIENCES`, `istio-ca`) apply when the rule names none.
    pub fn new(rule: JwtRule, default_audiences: Vec<String>, trust_domain: &str) -> JwtAuthenticator {
        let audiences = if rule.audiences.is_empty() {
            default_audiences
        } else {
            rule.audiences.clone()
        };
        let keys = Keys {
            set: (!rule.jwks.is_empty())
                .then(|| serde_json::from_str(&rule.jwks).ok())
                .flatten(),
            fetched: None,
        };
        JwtAuthenticator {
            rule,
            audiences,
            trust_domain: trust_domain.to_owned(),
            keys: Mutex::new(keys),
            http: reqwest::Client::builder()
                .timeout(FETCH_TIMEOUT)
                .build()
                .unwrap_or_default(),
        }
    }

    /// The key set to check a token whose header names `kid`.
    async fn key_set(&self, kid: Option<&str>) -> Result<JwkSet, AuthError> {
        let mut keys = self.keys.lock().await;
        if !self.rule.jwks.is_empty() {
            return keys
                .set
                .clone()
                .ok_or_else(|| AuthError::Invalid("JWT_RULE jwks is not a key set".into()));
        }
        let knows = |set: &JwkSet| kid.is_none_or(|k| set.find(k).is_some());
        let stale = keys.fetched.is_none_or(|t| t.elapsed() > KEYS_MAX_AGE);
        let unknown = keys.set.as_ref().is_none_or(|s| !knows(s))
            && keys.fetched.is_none_or(|t| t.elapsed() > UNKNOWN_KEY_REFETCH);
        if stale || unknown {
            match self.fetch().await {
                Ok(set) => {
                    keys.set = Some(set);
                    keys.fetched = Some(Instant::now());
                }
                Err(e) if keys.set.is_some() => {
                    tracing::warn!(issuer = %self.rule.issuer, "JWT_RULE: keeping the keys fetched before: {e}");
                    keys.fetched = Some(Instant::now());
                }
                Err(e) => return Err(AuthError::Invalid(e)),
            }
        }
        keys.set
            .clone()
            .ok_or_else(|| AuthError::Invalid("no signing keys for the issuer".into()))
    }

    async fn fetch(&self) -> Result<JwkSet, String> {
        let uri = if self.rule.jwks_uri.is_empty() {
            let discovery = format!(
                "{}/.well-known/openid-configuration",
                self.rule.issuer.trim_end_matches('/')
            );
            let doc: Discovery = self.get_json(&discovery).await?;
            doc.jwks_uri
        } else {
            self.rule.jwks_uri.clone()
        };
        self.get_json(&uri).await
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, uri: &str) -> Result<T, String> {
        let response = self
            .http
            .get(uri)
            .send()
            .await
            .map_err(|e| format!("fetching {uri}: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("fetching {uri}: HTTP {}", response.status()));
        }
        let bytes = response.bytes().await.map_err(|e| format!("fetching {uri}: {e}"))?;
        serde_json::from_slice(&bytes).map_err(|e| format!("{uri}: {e}"))
    }

    async fn verify(&self, token: &str) -> Result<Caller, AuthError> {
        let invalid = |what: &str, e: &dyn std::fmt::Display| AuthError::Invalid(format!("{what}: {e}"));
        let header = decode_header(token).map_err(|e| invalid("not a JWT", &e))?;
        let set = self.key_set(header.kid.as_deref()).await?;
        let jwk = match &header.kid {
            Some(kid) => set.find(kid),
            None => set.keys.first(),
        }
        .ok_or_else(|| AuthError::Invalid(format!("no key {:?} in the issuer's key set", header.kid)))?;
        let key = DecodingKey::from_jwk(jwk).map_err(|e| invalid("signing key", &e))?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.rule.issuer]);
        validation.validate_aud = false;
        validation.set_required_spec_claims(&["exp", "iss", "sub"]);
        let claims = decode::<Claims>(token, &key, &validation)
            .map_err(|e| invalid("failed to verify the JWT", &e))?
            .claims;
        let (ns, sa) = spiffe::service_account_of_subject(&claims.sub)
            .ok_or_else(|| AuthError::Invalid(format!("invalid sub {:?}", claims.sub)))?;
        if !claims.aud.contains_any(&self.audiences) {
            return Err(AuthError::Invalid(format!(
                "invalid audiences {:?}, want one of {:?}",
                claims.aud, self.audiences
            )));
        }
        Ok(Caller {
            source: AuthSource::IdToken,
            identities: vec![spiffe::identity(&self.trust_domain, ns, sa)],
        })
    }
}

impl Authenticator for JwtAuthenticator {
    fn kind(&self) -> &'static str {
        "IDTokenAuthenticator"
    }

    fn authenticate<'a>(&'a self, ctx: &'a AuthContext) -> AuthFuture<'a> {
        Box::pin(async move {
            let token = ctx
                .bearer_token
                .as_deref()
                .ok_or_else(|| AuthError::NotPresented("no bearer token".into()))?;
            self.verify(token).await
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::testing::TestIssuer;

    const ISS: &str = "https://kubernetes.default.svc";

    fn ctx(token: &str) -> AuthContext {
        AuthContext {
            bearer_token: Some(token.to_owned()),
            ..Default::default()
        }
    }

    fn inline(issuer: &TestIssuer, audiences: &[&str]) -> JwtAuthenticator {
        let rule = JwtRule {
            issuer: ISS.into(),
            jwks: issuer.jwks(),
            audiences: audiences.iter().map(|a| (*a).to_owned()).collect(),
            ..Default::default()
        };
        JwtAuthenticator::new(rule, vec!["istio-ca".into()], "cluster.local")
    }

    #[tokio::test]
    async fn a_service_account_token_proves_its_spiffe_identity() {
        let issuer = TestIssuer::new(ISS, "k1");
        let authn = inline(&issuer, &[]);
        let caller = authn
            .authenticate(&ctx(&issuer.token("default", "alice", &["istio-ca"], 600)))
            .await
            .unwrap();
        assert_eq!(caller.identities, ["spiffe://cluster.local/ns/default/sa/alice"]);
        assert_eq!(caller.source, AuthSource::IdToken);
    }

    #[tokio::test]
    async fn bad_tokens_are_refused_with_the_reason() {
        let issuer = TestIssuer::new(ISS, "k1");
        let authn = inline(&issuer, &["istio-ca"]);
        let reason = |token: String| {
            let authn = &authn;
            async move { authn.authenticate(&ctx(&token)).await.unwrap_err().to_string() }
        };
        assert!(
            reason(issuer.token("default", "alice", &["other"], 600))
                .await
                .contains("invalid audiences")
        );
        assert!(
            reason(issuer.token("default", "alice", &["istio-ca"], -600))
                .await
                .contains("ExpiredSignature")
        );
        let stranger = TestIssuer::new(ISS, "k1");
        assert!(
            reason(stranger.token("default", "alice", &["istio-ca"], 600))
                .await
                .contains("InvalidSignature")
        );
        let other_iss = TestIssuer::new("https://evil.example.com", "k1");
        let e = inline(&other_iss, &["istio-ca"])
            .authenticate(&ctx(&other_iss.token("default", "alice", &["istio-ca"], 600)))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("InvalidIssuer"), "{e}");
        assert!(
            reason(issuer.token_with(serde_json::json!({"sub": "alice", "aud": "istio-ca"}), 600))
                .await
                .contains("invalid sub")
        );
        assert!(reason("garbage".into()).await.contains("not a JWT"));
        let e = authn.authenticate(&AuthContext::default()).await.unwrap_err();
        assert!(matches!(e, AuthError::NotPresented(_)));
    }

    /// Serves `body()` over HTTP for every request, counting them.
    async fn serve(body: impl Fn() -> String + Send + Sync + 'static) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let body = Arc::new(body);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let b = body();
                let _ = s
                    .write_all(
                        format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{b}", b.len())
                            .as_bytes(),
                    )
                    .await;
            }
        });
        (format!("http://{addr}/jwks"), hits)
    }

    #[tokio::test]
    async fn keys_come_from_jwks_uri_and_a_new_key_is_fetched_again() {
        let first = Arc::new(TestIssuer::new(ISS, "k1"));
        let second = Arc::new(TestIssuer::new(ISS, "k2"));
        let current = Arc::new(std::sync::Mutex::new(first.jwks()));
        let served = current.clone();
        let (uri, hits) = serve(move || served.lock().unwrap().clone()).await;
        let rule = JwtRule {
            issuer: ISS.into(),
            jwks_uri: uri,
            ..Default::default()
        };
        let authn = JwtAuthenticator::new(rule, vec!["istio-ca".into()], "cluster.local");
        let t1 = first.token("ns1", "a", &["istio-ca"], 600);
        assert!(authn.authenticate(&ctx(&t1)).await.is_ok());
        assert!(authn.authenticate(&ctx(&t1)).await.is_ok());
        assert_eq!(hits.load(Ordering::SeqCst), 1, "keys are cached");
        // the issuer rotates its key: a token with the new kid fetches the keys again
        *current.lock().unwrap() = second.jwks();
        authn.keys.lock().await.fetched = Some(Instant::now() - UNKNOWN_KEY_REFETCH * 2);
        let t2 = second.token("ns1", "a", &["istio-ca"], 600);
        assert!(authn.authenticate(&ctx(&t2)).await.is_ok());
        assert_eq!(hits.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn jwt_rule_is_parsed_with_reasons() {
        assert!(JwtRule::parse(r#"{"issuer": "a", "jwksUri": "http://x/keys", "audiences": ["istio-ca"]}"#).is_ok());
        assert!(
            JwtRule::parse(r#"{"jwksUri": "http://x"}"#)
                .unwrap_err()
                .contains("issuer is required")
        );
        assert!(JwtRule::parse("{").unwrap_err().starts_with("JWT_RULE:"));
        assert!(
            JwtRule::parse(r#"{"issuer": "a", "jwks": "nope"}"#)
                .unwrap_err()
                .contains("jwks")
        );
    }
}
