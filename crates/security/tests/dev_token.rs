//! `scripts/dev-token.py`, the README's developer issuer, against the `JwtAuthenticator` that
//! checks `JWT_RULE` (Istio's `JwtAuthenticator`, security/pkg/server/ca/authenticate/oidc.go):
//! the rule it prints parses, its token authenticates as the service account asked for, a token
//! or of another key, or with its claims changed, does not. Needs `python3` and `openssl`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use security::{AuthContext, Authenticator, JwtAuthenticator, JwtRule};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/dev-token.py")
}

/// Runs the script in `work`; its standard output. Fails the test, saying why, when it cannot run.
fn run(work: &Path, args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg(script())
        .args(args)
        .current_dir(work)
        .output()
        .expect("python3 is needed to run scripts/dev-token.py");
    assert!(
        out.status.success(),
        "dev-token.py {args:?} failed (it needs python3 and openssl): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn authenticator(rule_json: &str) -> JwtAuthenticator {
    let rule = JwtRule::parse(rule_json.trim()).unwrap();
    assert_eq!(rule.audiences, ["istio-ca"]);
    JwtAuthenticator::new(rule, vec!["istio-ca".into()], "cluster.local")
}

async fn identities(auth: &JwtAuthenticator, token: &str) -> Result<Vec<String>, String> {
    let ctx = AuthContext {
        bearer_token: Some(token.trim().to_owned()),
        ..Default::default()
    };
    auth.authenticate(&ctx)
        .await
        .map(|c| c.identities)
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn dev_tokens_authenticate_as_their_service_account_under_the_printed_rule() {
    let work = tempfile::tempdir().unwrap();
    let rule = run(work.path(), &["rule"]);
    let auth = authenticator(&rule);
    // the key is kept: the same rule on a second run
    assert_eq!(run(work.path(), &["rule"]), rule);

    // defaults: istio-system/default, where pilot-agent reads it
    run(work.path(), &["token"]);
    let token = std::fs::read_to_string(work.path().join("var/run/secrets/tokens/istio-token")).unwrap();
    assert_eq!(
        identities(&auth, &token).await.unwrap(),
        ["spiffe://cluster.local/ns/istio-system/sa/default"]
    );

    let out = work.path().join("reviews-token");
    run(
        work.path(),
        &[
            "token",
            "-n",
            "default",
            "-s",
            "reviews",
            "--ttl",
            "1h",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    let token = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        identities(&auth, &token).await.unwrap(),
        ["spiffe://cluster.local/ns/default/sa/reviews"]
    );

    // its claims changed (another service account), the signature no longer holds
    let parts: Vec<&str> = token.trim().split('.').collect();
    assert_eq!(parts.len(), 3, "{token}");
    let admin = run(
        work.path(),
        &[
            "token",
            "-s",
            "admin",
            "-o",
            work.path().join("admin").to_str().unwrap(),
        ],
    );
    assert!(admin.is_empty(), "the token goes to the file, not stdout: {admin}");
    let admin = std::fs::read_to_string(work.path().join("admin")).unwrap();
    let forged = format!("{}.{}.{}", parts[0], admin.split('.').nth(1).unwrap(), parts[2]);
    let e = identities(&auth, &forged).await.unwrap_err();
    assert!(e.contains("failed to verify"), "{e}");

    // a token of another key directory (another issuer's key) is refused by this rule
    let other = tempfile::tempdir().unwrap();
    run(other.path(), &["token"]);
    let foreign = std::fs::read_to_string(other.path().join("var/run/secrets/tokens/istio-token")).unwrap();
    let e = identities(&auth, &foreign).await.unwrap_err();
    assert!(e.contains("no key"), "{e}");
}
