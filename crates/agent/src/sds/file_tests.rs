//! Secret files Envoy names (`file-root:`, `file-cert:`) that are not certificates (issue 28): a
//! FIFO or a device is refused before it is read, a huge file is refused at the bound, a file
//! that is not PEM (`/etc/shadow`) is refused, a key that is not the certificate's is refused;
//! each error names the path and is counted.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use rcgen::KeyPair;

use super::tests::{config, write_certs};
use super::*;

const ID: &str = "spiffe://cluster.local/ns/default/sa/reviews";

fn manager(dir: &Path) -> SecretManager {
    SecretManager::new(ID.into(), None, config(), dir.join("etc/certs"))
}

#[tokio::test]
async fn a_fifo_is_refused_before_it_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("root.pem");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    // a writer feeding whoever opens the FIFO to read, for 3 s: a read of the FIFO would get
    // this instead of hanging
    let writer_path = fifo.clone();
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            let open = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
                .open(&writer_path);
            if let Ok(mut f) = open {
                let _ = f.write_all(b"root:$6$salt$hash:19000:0:99999:7:::\n");
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let m = manager(tmp.path());
    let name = format!("file-root:{}", fifo.display());
    let err = tokio::time::timeout(Duration::from_secs(20), m.generate(&name))
        .await
        .expect("the FIFO is refused, not read")
        .expect_err("a FIFO is not a root certificate");
    assert!(
        matches!(err, SecretError::File(FileSecretError::NotRegular { .. })),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&fifo.display().to_string()) && text.contains("a FIFO"),
        "{text}"
    );
    assert_eq!(m.file_secret_failures(), 1);
}

#[tokio::test]
async fn devices_and_huge_files_are_refused_at_the_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let m = manager(tmp.path());
    let err = m.generate("file-root:/dev/zero").await.unwrap_err().to_string();
    assert!(err.contains("/dev/zero") && err.contains("a character device"), "{err}");

    let huge = tmp.path().join("bundle.pem");
    let file = std::fs::File::create(&huge).unwrap();
    file.set_len(MAX_SECRET_FILE + 1).unwrap();
    let err = m
        .generate(&format!("file-root:{}", huge.display()))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("bundle.pem") && err.contains("larger than"), "{err}");
    assert_eq!(m.file_secret_failures(), 2);
}

#[tokio::test]
async fn files_that_are_not_pem_certificates_are_not_served() {
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("etc/certs");
    let cert = write_certs(&certs);
    let m = manager(tmp.path());

    let shadow = tmp.path().join("shadow");
    std::fs::write(
        &shadow,
        "root:$6$salt$hash:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n",
    )
    .unwrap();
    let err = m
        .generate(&format!("file-root:{}", shadow.display()))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("shadow") && err.contains("not a PEM root certificate file"),
        "{err}"
    );

    // a key is not a root; a bundle keeps its certificates and drops what is not one
    let key = certs.join("key.pem");
    let err = m
        .generate(&format!("file-root:{}", key.display()))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("key.pem") && err.contains("not a PEM root certificate file"),
        "{err}"
    );
    let bundle = tmp.path().join("bundle.pem");
    let junk = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";
    std::fs::write(&bundle, format!("{junk}{cert}")).unwrap();
    assert_eq!(
        m.generate(&format!("file-root:{}", bundle.display())).await.unwrap(),
        SecretItem::Root { root_pem: cert.clone() }
    );

    // a certificate with someone else's key, and a certificate file that is not one
    let other = tmp.path().join("other-key.pem");
    std::fs::write(&other, KeyPair::generate().unwrap().serialize_pem()).unwrap();
    let chain = certs.join("cert-chain.pem");
    let err = m
        .generate(&format!("file-cert:{}~{}", chain.display(), other.display()))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("other-key.pem") && err.contains("does not match"), "{err}");
    let err = m
        .generate(&format!("file-cert:{}~{}", shadow.display(), key.display()))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("shadow") && err.contains("no PEM certificate"), "{err}");
    let err = m
        .generate(&format!("file-cert:{}~{}", chain.display(), shadow.display()))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("shadow") && err.contains("not a PEM private key"), "{err}");
    assert_eq!(m.file_secret_failures(), 5);

    // the matching pair is served as written
    assert_eq!(
        m.generate(&format!("file-cert:{}~{}", chain.display(), key.display()))
            .await
            .unwrap(),
        SecretItem::Certificate {
            cert_chain_pem: cert,
            key_pem: std::fs::read_to_string(&key).unwrap(),
        }
    );
}
