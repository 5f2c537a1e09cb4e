//! A token issuer for tests: an ES256 key, its JWKS, and service account tokens as Kubernetes
//! mints them (`iss`, `sub: system:serviceaccount:<ns>:<sa>`, `aud`, `exp`).

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use rcgen::KeyPair;
use serde_json::{Value, json};

pub struct TestIssuer {
    pub issuer: String,
    pub kid: String,
    key: KeyPair,
}

impl TestIssuer {
    pub fn new(issuer: &str, kid: &str) -> TestIssuer {
        TestIssuer {
            issuer: issuer.to_owned(),
            kid: kid.to_owned(),
            key: KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap_or_else(|e| panic!("test key: {e}")),
        }
    }

    /// The public key as a JWKS document.
    pub fn jwks(&self) -> String {
        // the uncompressed point: 0x04, X, Y
        let raw = self.key.public_key_raw();
        let (x, y) = raw[1..].split_at(32);
        json!({"keys": [{"kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": self.kid,
            "x": URL_SAFE_NO_PAD.encode(x), "y": URL_SAFE_NO_PAD.encode(y)}]})
        .to_string()
    }

    /// A token for `ns/sa` with `audiences`, expiring `ttl_secs` from now (negative: expired).
    pub fn token(&self, ns: &str, sa: &str, audiences: &[&str], ttl_secs: i64) -> String {
        self.token_with(
            json!({"sub": format!("system:serviceaccount:{ns}:{sa}"), "aud": audiences}),
            ttl_secs,
        )
    }

    /// A token with these claims plus `iss` and `exp`.
    pub fn token_with(&self, mut claims: Value, ttl_secs: i64) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default();
        claims["iss"] = json!(self.issuer);
        claims["exp"] = json!(now + ttl_secs);
        claims["iat"] = json!(now);
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        let key = EncodingKey::from_ec_der(&self.key.serialize_der());
        encode(&header, &claims, &key).unwrap_or_else(|e| panic!("minting a test token: {e}"))
    }
}
