//! Istio's `KubeJWTAuthenticator` (security/pkg/server/ca/authenticate/kubeauth): with a cluster,
//! a bearer token is what the API server says it is. A `TokenReview` with the expected audiences
//! (`TOKEN_AUDIENCES`, `istio-ca`) must come back authenticated, for a service account
//! (`system:serviceaccount:<ns>:<sa>`) and one of those audiences.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use security::{AuthContext, AuthError, AuthSource, Authenticator, Caller};

pub struct TokenReviewAuthenticator {
    client: kube::Client,
    audiences: Vec<String>,
    trust_domain: String,
}

impl TokenReviewAuthenticator {
    pub fn new(client: kube::Client, audiences: Vec<String>, trust_domain: &str) -> TokenReviewAuthenticator {
        TokenReviewAuthenticator {
            client,
            audiences,
            trust_domain: trust_domain.to_owned(),
        }
    }

    async fn review(&self, token: &str) -> Result<Caller, AuthError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(self.audiences.clone()),
            },
            ..Default::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AuthError::Invalid(format!("TokenReview failed: {e}")))?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err(AuthError::Invalid(format!(
                "the API server did not authenticate the token: {}",
                status.error.unwrap_or_default()
            )));
        }
        let audiences = status.audiences.unwrap_or_default();
        if !audiences.iter().any(|a| self.audiences.contains(a)) {
            return Err(AuthError::Invalid(format!(
                "invalid audiences {audiences:?}, want one of {:?}",
                self.audiences
            )));
        }
        let user = status.user.and_then(|u| u.username).unwrap_or_default();
        let (ns, sa) = security::spiffe::service_account_of_subject(&user)
            .ok_or_else(|| AuthError::Invalid(format!("{user:?} is not a service account")))?;
        Ok(Caller {
            source: AuthSource::IdToken,
            identities: vec![security::spiffe::identity(&self.trust_domain, ns, sa)],
        })
    }
}

impl Authenticator for TokenReviewAuthenticator {
    fn kind(&self) -> &'static str {
        "KubeJWTAuthenticator"
    }

    fn authenticate<'a>(&'a self, ctx: &'a AuthContext) -> security::AuthFuture<'a> {
        Box::pin(async move {
            let token = ctx
                .bearer_token
                .as_deref()
                .ok_or_else(|| AuthError::NotPresented("no bearer token".into()))?;
            self.review(token).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use test_support::kube_api::FakeApiServer;

    async fn authenticator(api: &FakeApiServer) -> TokenReviewAuthenticator {
        let dir = tempfile::tempdir().unwrap();
        let client = crate::kubernetes::fake_api_client(api, dir.path()).await;
        TokenReviewAuthenticator::new(client, vec!["istio-ca".into()], "cluster.local")
    }

    fn ctx(token: &str) -> AuthContext {
        AuthContext {
            bearer_token: Some(token.to_owned()),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn the_api_server_says_who_a_token_is() {
        let api = FakeApiServer::start().await.unwrap();
        api.add_token(
            "t-reviews",
            "system:serviceaccount:default:bookinfo-reviews",
            &["istio-ca"],
        );
        api.add_token("t-other-aud", "system:serviceaccount:default:x", &["vault"]);
        api.add_token("t-user", "alice@example.com", &["istio-ca"]);
        let authn = authenticator(&api).await;
        let caller = authn.authenticate(&ctx("t-reviews")).await.unwrap();
        assert_eq!(
            caller.identities,
            ["spiffe://cluster.local/ns/default/sa/bookinfo-reviews"]
        );
        let reason = |t: &'static str| {
            let authn = &authn;
            async move { authn.authenticate(&ctx(t)).await.unwrap_err().to_string() }
        };
        assert!(reason("unknown").await.contains("token lookup failed"));
        assert!(reason("t-other-aud").await.contains("audiences is invalid"));
        assert!(reason("t-user").await.contains("not a service account"));
        assert!(
            api.requests()
                .iter()
                .any(|r| r.starts_with("POST /apis/authentication.k8s.io/v1/tokenreviews"))
        );
    }
}
