//! istiod's plugged-in CA replaced on disk while pilot-discovery runs (Istio's
//! `handleCACertsFileWatch`, pilot/pkg/bootstrap/istio_ca.go), the way kubelet updates the
//! `cacerts` Secret mount: new files in a new timestamped directory, then the `..data` symlink
//! swapped. A new intermediate under the same root signs the next CSR (pilot-agent's CA client
//! sees the chain through it) and istiod's serving certificate on the secure port is signed
//! again by it (`openssl s_client`); a new root is refused and the intermediate in use keeps
//! signing, and so does a bundle whose key is not its certificate's. Each reload is counted in `pilot_ca_cacerts_reloads{result}`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use agent::config::WorkloadKey;
use agent::sds::{CaClient, CaTls};
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::mesh_ca::MeshCa;
use test_support::tls::TestCa;

const FILES: [&str; 4] = ["ca-cert.pem", "ca-key.pem", "root-cert.pem", "cert-chain.pem"];

/// A Secret mount as kubelet writes it: `<dir>/<file>` -> `..data/<file>`, `..data` ->
/// `..<generation>`.
struct CacertsMount<'a> {
    dir: &'a Path,
    generation: u32,
}

impl CacertsMount<'_> {
    fn new<'a>(dir: &'a Path, int: &TestCa, root: &TestCa) -> CacertsMount<'a> {
        let mut m = CacertsMount { dir, generation: 0 };
        m.update(int, root);
        for f in FILES {
            std::os::unix::fs::symlink(Path::new("..data").join(f), dir.join(f)).unwrap();
        }
        m
    }

    fn update(&mut self, int: &TestCa, root: &TestCa) {
        self.update_with(int, root, |_| {});
    }

    /// Writes `int`'s files, changed by `edit`, into a new directory and swaps `..data` to it.
    fn update_with(&mut self, int: &TestCa, root: &TestCa, edit: impl FnOnce(&Path)) {
        self.generation += 1;
        let data = format!("..2026_11_28_00_00_0{}.000000001", self.generation);
        let path = self.dir.join(&data);
        std::fs::create_dir(&path).unwrap();
        let chain = format!("{}{}", int.cert_pem(), root.cert_pem());
        for (f, text) in FILES
            .iter()
            .zip([int.cert_pem(), int.key_pem(), root.cert_pem(), chain])
        {
            std::fs::write(path.join(f), text).unwrap();
        }
        edit(&path);
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&data, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
    }
}

/// The issuer (`CN=...`) of each certificate in `pem`, in order.
fn issuers(pem: &str) -> Vec<String> {
    x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes())
        .map_while(Result::ok)
        .map(|p| p.parse_x509().unwrap().issuer().to_string())
        .collect()
}

fn not_after_unix(pem: &str) -> i64 {
    let p = x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes())
        .next()
        .unwrap()
        .unwrap();
    p.parse_x509().unwrap().validity().not_after.timestamp()
}

/// The chain istiod serves on `addr` to `openssl s_client`, verified against `root`: the issuer
/// of its leaf.
async fn served_leaf_issuer(addr: std::net::SocketAddr, root: &Path) -> String {
    let out = tokio::process::Command::new("openssl")
        .args(["s_client", "-showcerts", "-connect", &addr.to_string()])
        .args([
            "-servername",
            "istiod.istio-system.svc",
            "-verify_hostname",
            "istiod.istio-system.svc",
        ])
        .args(["-CAfile", root.to_str().unwrap(), "-verify_return_error", "-alpn", "h2"])
        .stdin(Stdio::null())
        .output()
        .await
        .expect("openssl s_client (the openssl CLI is needed)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("Verify return code: 0 (ok)"),
        "s_client on {addr}: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let chain = issuers(&text);
    assert_eq!(chain.len(), 3, "leaf, intermediate, root: {text}");
    chain[0].clone()
}

async fn eventually(what: &str, discovery: &Discovery, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "not within 10s: {what}\n{}",
            discovery.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_new_intermediate_in_cacerts_signs_csrs_and_istiods_certificate_and_a_new_root_is_refused() {
    let root = TestCa::new("Mesh Root").unwrap();
    let (a, b) = (
        root.intermediate("Intermediate A", 2040).unwrap(),
        root.intermediate("Intermediate B", 2041).unwrap(),
    );
    let mesh = MeshCa::loopback().unwrap();
    let mut mount = CacertsMount::new(mesh.dir.path(), &a, &root);
    let config = tempfile::tempdir().unwrap();
    let discovery = Discovery::start(config.path(), mesh.serve(DiscoveryOptions::default()))
        .await
        .unwrap();

    // the mesh root as agents have it (the istio-ca-root-cert ConfigMap), apart from cacerts
    let work = tempfile::tempdir().unwrap();
    let root_pem = work.path().join("root-cert.pem");
    std::fs::copy(mesh.root_cert(), &root_pem).unwrap();
    let token = work.path().join("istio-token");
    std::fs::write(&token, mesh.token("default", "default")).unwrap();
    let client = CaClient::new(
        &mesh.addr.to_string(),
        CaTls {
            root_cert: root_pem.clone(),
            server_name: "istiod.istio-system.svc".into(),
        },
        token,
    );
    let identity = "spiffe://cluster.local/ns/default/sa/default";
    let csr_issuers = async || {
        let signed = client
            .sign(identity, Duration::from_secs(3600), WorkloadKey::EcdsaP256)
            .await
            .unwrap();
        issuers(&signed.cert_chain_pem)
    };
    assert_eq!(csr_issuers().await[..2], ["CN=Intermediate A", "CN=Mesh Root"]);
    assert_eq!(served_leaf_issuer(mesh.addr, &root_pem).await, "CN=Intermediate A");
    let chain_expiry = "citadel_server_cert_chain_expiry_timestamp";
    assert_eq!(
        discovery.metric(chain_expiry).await.unwrap(),
        not_after_unix(&a.cert_pem()) as f64
    );

    // intermediate B under the same root
    mount.update(&b, &root);
    eventually("a CSR answered through intermediate B", &discovery, async || {
        csr_issuers().await[..2] == ["CN=Intermediate B", "CN=Mesh Root"]
    })
    .await;
    eventually(
        "istiod's certificate signed by intermediate B",
        &discovery,
        async || served_leaf_issuer(mesh.addr, &root_pem).await == "CN=Intermediate B",
    )
    .await;
    let updated = r#"pilot_ca_cacerts_reloads{result="updated"}"#;
    assert_eq!(discovery.metric(updated).await.unwrap(), 1.0);
    assert_eq!(
        discovery.metric(chain_expiry).await.unwrap(),
        not_after_unix(&b.cert_pem()) as f64
    );
    assert!(
        discovery
            .logs()
            .contains("Istiod has detected the newly added intermediate CA and updated its key and certs"),
        "{}",
        discovery.logs()
    );

    // another root: refused, B keeps signing
    let other = TestCa::new("Other Root").unwrap();
    mount.update(&other.intermediate("Intermediate C", 2040).unwrap(), &other);
    let root_changed = r#"pilot_ca_cacerts_reloads{result="root_changed"}"#;
    eventually("the root change counted", &discovery, async || {
        discovery.metric(root_changed).await.unwrap() >= 1.0
    })
    .await;
    let logs = discovery.logs();
    assert!(
        logs.contains(&format!("{}", mesh.dir.path().display()))
            && logs.contains("updating the root CA is not supported"),
        "{logs}"
    );
    assert_eq!(csr_issuers().await[..2], ["CN=Intermediate B", "CN=Mesh Root"]);
    assert_eq!(served_leaf_issuer(mesh.addr, &root_pem).await, "CN=Intermediate B");
    assert_eq!(discovery.metric(updated).await.unwrap(), 1.0);

    // B's certificate with A's key: refused naming the file, B keeps signing
    mount.update_with(&b, &root, |data| {
        std::fs::write(data.join("ca-key.pem"), a.key_pem()).unwrap()
    });
    let invalid = r#"pilot_ca_cacerts_reloads{result="invalid"}"#;
    eventually("the broken bundle counted", &discovery, async || {
        discovery.metric(invalid).await.unwrap() >= 1.0
    })
    .await;
    let logs = discovery.logs();
    assert!(
        logs.contains("ca-key.pem: this key does not belong to ca-cert.pem"),
        "{logs}"
    );
    assert_eq!(csr_issuers().await[..2], ["CN=Intermediate B", "CN=Mesh Root"]);
    assert_eq!(served_leaf_issuer(mesh.addr, &root_pem).await, "CN=Intermediate B");
    assert!(
        !mesh.dir.path().join("istio-generated").exists(),
        "no self-signed root made"
    );
}
