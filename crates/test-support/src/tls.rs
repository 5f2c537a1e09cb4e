//! TLS for tests: a throwaway CA that issues server certificates (rcgen on ring), written as PEM
//! files a gateway can mount, and an HTTPS/1.1 client (tokio-rustls + hyper) that dials a loopback
//! address with any SNI and trusts only the test CA.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper::header::{HOST, HeaderMap};
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::backend::{HTTP_TIMEOUT, HttpResponse};

/// A self-signed root CA living only for one test.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A leaf certificate and its private key, PEM encoded.
pub struct IssuedCert {
    pub cert_der: CertificateDer<'static>,
    pub cert_pem: String,
    pub key_pem: String,
}

/// Where [`IssuedCert::write`] put the files (what a Gateway's `serverCertificate`/`privateKey`
/// point at).
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    /// A new root CA with the subject `CN=<common_name>` and a fresh P-256 key.
    pub fn new(common_name: &str) -> anyhow::Result<TestCa> {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?).context("self-signing the test CA")?;
        Ok(TestCa { issuer })
    }

    /// An intermediate CA signed by this one, `CN=<common_name>`, with a fresh P-256 key, valid
    /// until the first of January of `not_after_year`: what an operator plugs into istiod's
    /// `cacerts` under this root.
    pub fn intermediate(&self, common_name: &str, not_after_year: i32) -> anyhow::Result<TestCa> {
        let mut params = CertificateParams::default();
        params.not_after = rcgen::date_time_ymd(not_after_year, 1, 1);
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.use_authority_key_identifier_extension = true;
        let issuer = CertifiedIssuer::signed_by(params, KeyPair::generate()?, &self.issuer)
            .with_context(|| format!("signing the intermediate {common_name}"))?;
        Ok(TestCa { issuer })
    }

    /// This CA's private key, PKCS#8 PEM.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for `dns_names` (the first one is also the subject CN), signed by
    /// this CA, for TLS server authentication.
    pub fn issue_server(&self, dns_names: &[&str]) -> anyhow::Result<IssuedCert> {
        self.issue(dns_names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate for `dns_names` (TLS client authentication), signed by this CA.
    pub fn issue_client(&self, dns_names: &[&str]) -> anyhow::Result<IssuedCert> {
        self.issue(dns_names, ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(&self, dns_names: &[&str], usage: ExtendedKeyUsagePurpose) -> anyhow::Result<IssuedCert> {
        let mut params = CertificateParams::new(dns_names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .with_context(|| format!("bad server names {dns_names:?}"))?;
        if let Some(first) = dns_names.first() {
            params.distinguished_name.push(DnType::CommonName, *first);
        }
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .with_context(|| format!("signing a certificate for {dns_names:?}"))?;
        Ok(IssuedCert {
            cert_der: cert.der().clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

impl IssuedCert {
    /// Writes `<name>.pem` (the certificate) and `<name>-key.pem` into `dir`.
    pub fn write(&self, dir: &Path, name: &str) -> anyhow::Result<CertFiles> {
        let files = CertFiles {
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}-key.pem")),
        };
        std::fs::write(&files.cert, &self.cert_pem).with_context(|| format!("writing {}", files.cert.display()))?;
        std::fs::write(&files.key, &self.key_pem).with_context(|| format!("writing {}", files.key.display()))?;
        Ok(files)
    }
}

/// An HTTPS client that trusts only the given roots and offers ALPN `http/1.1`. Every request uses
/// a fresh connection, so each one goes through a TLS handshake with the SNI asked for.
#[derive(Clone)]
pub struct HttpsClient {
    connector: TlsConnector,
    timeout: Duration,
}

impl HttpsClient {
    /// Trusts only `ca` (no system roots).
    pub fn trusting(ca: &TestCa) -> anyhow::Result<HttpsClient> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(ca.cert_der())
            .context("adding the test CA to the root store")?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS versions of the ring provider")?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(HttpsClient {
            connector: TlsConnector::from(Arc::new(config)),
            timeout: HTTP_TIMEOUT,
        })
    }

    /// Connects to `addr` and completes a TLS handshake with `sni`, verifying the server's
    /// certificate against the roots and against `sni`.
    pub async fn connect(&self, addr: SocketAddr, sni: &str) -> anyhow::Result<TlsStream<TcpStream>> {
        let name = ServerName::try_from(sni.to_owned()).with_context(|| format!("bad SNI {sni:?}"))?;
        let handshake = async {
            let tcp = TcpStream::connect(addr)
                .await
                .with_context(|| format!("connecting to {addr}"))?;
            self.connector
                .connect(name, tcp)
                .await
                .with_context(|| format!("TLS handshake with {addr} for SNI {sni}"))
        };
        tokio::time::timeout(self.timeout, handshake).await.with_context(|| {
            format!(
                "TLS handshake with {addr} for SNI {sni}: no answer in {:?}",
                self.timeout
            )
        })?
    }

    /// GET `path` over TLS to `addr` with SNI `sni` and `Host: host`, plus `headers`; reads the
    /// whole response.
    pub async fn get(
        &self,
        addr: SocketAddr,
        sni: &str,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<HttpResponse> {
        let tls = self.connect(addr, sni).await?;
        let exchange = async {
            let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .context("HTTP/1.1 handshake")?;
            let driver = tokio::spawn(connection);
            let mut request = hyper::Request::get(path).header(HOST, host);
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            let response = sender
                .send_request(request.body(Empty::<Bytes>::new())?)
                .await
                .with_context(|| format!("GET https://{host}{path}"))?;
            let status = response.status().as_u16();
            let headers = joined_headers(response.headers());
            let body = response
                .into_body()
                .collect()
                .await
                .with_context(|| format!("GET https://{host}{path}: reading the body"))?
                .to_bytes();
            driver.abort();
            anyhow::Ok(HttpResponse {
                status,
                headers,
                body: String::from_utf8_lossy(&body).into_owned(),
            })
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .with_context(|| format!("GET https://{host}{path} via {addr}: no answer in {:?}", self.timeout))?
    }
}

/// Header names in lower case; repeated headers joined with `,` (as [`HttpResponse`] keeps them).
fn joined_headers(headers: &HeaderMap) -> BTreeMap<String, String> {
    let mut map: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        map.entry(name.as_str().to_owned())
            .and_modify(|joined| {
                joined.push(',');
                joined.push_str(&value);
            })
            .or_insert_with(|| value.into_owned());
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TLS server on loopback serving `cert` and answering one HTTP/1.1 request per connection.
    async fn serve_once(cert: &IssuedCert) -> anyhow::Result<SocketAddr> {
        use rustls::pki_types::pem::PemObject as _;
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes())?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert_der.clone()], key)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut buf = vec![0; 4096];
                    let n = tls.read(&mut buf).await.unwrap_or(0);
                    let request = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let host = request
                        .lines()
                        .find_map(|l| l.strip_prefix("host: ").or_else(|| l.strip_prefix("Host: ")))
                        .unwrap_or_default()
                        .to_owned();
                    let body = format!("host={host}");
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nx-seen: a\r\nx-seen: b\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = tls.write_all(answer.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        Ok(addr)
    }

    #[tokio::test]
    async fn client_trusts_the_test_ca_and_checks_the_name() -> anyhow::Result<()> {
        let ca = TestCa::new("test root")?;
        let cert = ca.issue_server(&["bookinfo.example.com"])?;
        let addr = serve_once(&cert).await?;
        let client = HttpsClient::trusting(&ca)?;

        let r = client.get(addr, "bookinfo.example.com", "h.example", "/x", &[]).await?;
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "host=h.example");
        assert_eq!(r.header("x-seen"), Some("a,b"));

        let tls = client.connect(addr, "bookinfo.example.com").await?;
        let served = tls.get_ref().1.peer_certificates().unwrap_or_default();
        assert_eq!(served.first(), Some(&cert.cert_der));

        // The certificate does not cover this name: verification fails.
        let err = client.connect(addr, "other.example.com").await.unwrap_err();
        assert!(format!("{err:#}").contains("not valid for name"), "{err:#}");

        // Another CA's client does not trust this server.
        let stranger = HttpsClient::trusting(&TestCa::new("other root")?)?;
        let err = stranger.connect(addr, "bookinfo.example.com").await.unwrap_err();
        assert!(format!("{err:#}").contains("UnknownIssuer"), "{err:#}");
        Ok(())
    }

    #[test]
    fn files_are_pem() -> anyhow::Result<()> {
        let ca = TestCa::new("test root")?;
        let dir = tempfile::tempdir()?;
        let files = ca
            .issue_server(&["a.example.com", "b.example.com"])?
            .write(dir.path(), "server")?;
        assert!(std::fs::read_to_string(&files.cert)?.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(std::fs::read_to_string(&files.key)?.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        Ok(())
    }
}
