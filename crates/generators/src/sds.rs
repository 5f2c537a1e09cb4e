//! Istio's `SecretGen` (pilot/pkg/xds/sds.go): gateway credentials served over ADS. A server's
//! `credentialName: <name>` is the SDS resource `kubernetes://<name>` (its certificate and key)
//! and, for MUTUAL, `kubernetes://<name>-cacert` (the CA to check clients with), taken from the
//! Kubernetes Secret `<name>` of the proxy's namespace: `tls.crt`/`tls.key`/`ca.crt` (or
//! `cert`/`key`/`cacert`), or a Secret `<name>-cacert` for the CA. A proxy is served the Secrets
//! of its own namespace only; a name it may not have, or that does not exist, is left out (Envoy
//! keeps waiting, as with istiod).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use model::{ConfigKind, ConfigSpec, Proxy};
use push_index::PushContext;
use serde_json::Value;
use xds_api::Resource;
use xds_api::envoy::config::core::v3::{DataSource, data_source};
use xds_api::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, Secret, TlsCertificate, secret,
};

/// Istio's `credentials.KubernetesSecretTypeURI`.
pub(crate) const KUBERNETES_PREFIX: &str = "kubernetes://";
/// Istio's `SdsCaSuffix`.
pub(crate) const CA_SUFFIX: &str = "-cacert";

/// The SDS resource name of a `credentialName` (Istio's `ToResourceName`).
pub(crate) fn resource_name(credential: &str) -> String {
    if credential.contains("://") {
        credential.to_owned()
    } else {
        format!("{KUBERNETES_PREFIX}{credential}")
    }
}

/// The secrets of `names` that `proxy` may have.
pub(crate) fn secrets(push: &PushContext, proxy: &Proxy, names: &[String]) -> Vec<Resource> {
    names
        .iter()
        .filter_map(|name| match secret(push, proxy, name) {
            Ok(s) => Some(Resource::new(name.clone(), &s)),
            Err(reason) => {
                tracing::warn!(proxy = %proxy.id, resource = name, "SDS: {reason}");
                None
            }
        })
        .collect()
}

fn secret(push: &PushContext, proxy: &Proxy, name: &str) -> Result<Secret, String> {
    let reference = name
        .strip_prefix(KUBERNETES_PREFIX)
        .ok_or_else(|| "only kubernetes:// credentials are served".to_owned())?;
    let (namespace, secret_name) = match reference.split_once('/') {
        Some((ns, n)) => (ns, n),
        None => (proxy.config_namespace.as_str(), reference),
    };
    if namespace != proxy.config_namespace {
        return Err(format!(
            "the proxy of namespace {} may not read Secrets of namespace {namespace}",
            proxy.config_namespace
        ));
    }
    let find = |n: &str| {
        push.configs().iter().find_map(|c| match (&c.kind, &c.spec) {
            (ConfigKind::Secret, ConfigSpec::Kubernetes(obj)) if c.meta.namespace == namespace && c.meta.name == n => {
                Some(obj)
            }
            _ => None,
        })
    };
    let inline = |bytes: Vec<u8>| DataSource {
        specifier: Some(data_source::Specifier::InlineBytes(bytes)),
        ..Default::default()
    };
    if let Some(base) = secret_name.strip_suffix(CA_SUFFIX) {
        // the CA: a Secret `<name>-cacert`, else the `ca.crt` of `<name>`
        let ca = find(secret_name)
            .and_then(|o| value(o, &["ca.crt", "cacert"]))
            .or_else(|| find(base).and_then(|o| value(o, &["ca.crt", "cacert"])))
            .ok_or_else(|| {
                format!("no CA (ca.crt or cacert) in Secret {namespace}/{base} or {namespace}/{secret_name}")
            })?;
        return Ok(Secret {
            name: name.to_owned(),
            r#type: Some(secret::Type::ValidationContext(CertificateValidationContext {
                trusted_ca: Some(inline(ca)),
                ..Default::default()
            })),
        });
    }
    let obj = find(secret_name).ok_or_else(|| format!("no Secret {namespace}/{secret_name}"))?;
    let cert = value(obj, &["tls.crt", "cert"])
        .ok_or_else(|| format!("Secret {namespace}/{secret_name} has no tls.crt or cert"))?;
    let key = value(obj, &["tls.key", "key"])
        .ok_or_else(|| format!("Secret {namespace}/{secret_name} has no tls.key or key"))?;
    Ok(Secret {
        name: name.to_owned(),
        r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: Some(inline(cert)),
            private_key: Some(inline(key)),
            ..Default::default()
        })),
    })
}

/// The first of `keys` in the Secret's `stringData`, or base64-decoded from its `data`.
fn value(obj: &Value, keys: &[&str]) -> Option<Vec<u8>> {
    keys.iter().find_map(|k| {
        obj.pointer(&format!("/stringData/{}", k.replace('/', "~1")))
            .and_then(Value::as_str)
            .map(|s| s.as_bytes().to_vec())
            .or_else(|| {
                obj.get("data")
                    .and_then(|d| d.get(*k))
                    .and_then(Value::as_str)
                    .and_then(|b| STANDARD.decode(b.trim()).ok())
            })
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testing::{proxy, push};

    fn secret_doc(name: &str, ns: &str, data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns},
            "type": "kubernetes.io/tls", "data": data})
    }

    #[test]
    fn credentials_of_the_proxys_namespace_are_served_by_name() {
        let b64 = |s: &str| STANDARD.encode(s);
        let p = push(vec![
            secret_doc(
                "gw-cert",
                "istio-system",
                json!({"tls.crt": b64("CERT"), "tls.key": b64("KEY"), "ca.crt": b64("CA")}),
            ),
            secret_doc("other", "default", json!({"tls.crt": b64("X"), "tls.key": b64("Y")})),
        ]);
        let gw = proxy("router", "istio-system", json!({"istio": "ingressgateway"}));
        let names: Vec<String> = [
            "kubernetes://gw-cert",
            "kubernetes://gw-cert-cacert",
            "kubernetes://default/other",
            "kubernetes://missing",
        ]
        .map(String::from)
        .to_vec();
        let served = secrets(&p, &gw, &names);
        let got: Vec<&str> = served.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            got,
            ["kubernetes://gw-cert", "kubernetes://gw-cert-cacert"],
            "other namespaces and missing ones are left out"
        );
        let decoded = |r: &Resource| <Secret as prost::Message>::decode(r.resource.value.as_slice()).unwrap();
        match decoded(&served[0]).r#type {
            Some(secret::Type::TlsCertificate(c)) => {
                assert_eq!(
                    c.certificate_chain.unwrap().specifier,
                    Some(data_source::Specifier::InlineBytes(b"CERT".to_vec()))
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decoded(&served[1]).r#type,
            Some(secret::Type::ValidationContext(_))
        ));
        assert_eq!(resource_name("gw-cert"), "kubernetes://gw-cert");
    }
}
