//! Istio's `SecretGen` (pilot/pkg/xds/sds.go): gateway and DestinationRule credentials served
//! over ADS. A server's `credentialName: <name>` is the SDS resource `kubernetes://<name>` (its
//! certificate and key) and, for MUTUAL, `kubernetes://<name>-cacert` (the CA to check clients
//! with), taken from the Kubernetes Secret `<name>`: `tls.crt`/`tls.key`/`ca.crt` (or
//! `cert`/`key`/`cacert`), or a Secret `<name>-cacert` for the CA.
//!
//! Who gets what, as Istio's `Generate` and `filterAuthorizedResources`:
//! - a proxy without a verified identity (it did not connect over the secure port with a proven
//!   identity) gets no credential at all, whatever its node metadata claims;
//! - Secrets are looked up in the verified identity's namespace (`kubernetes://<name>`), and a
//!   name of another namespace (`kubernetes://<ns>/<name>`) is refused;
//! - a CA (`-cacert`) of that namespace is public and always served;
//! - a certificate and private key only when the proxy's own config asks for it: a
//!   `tls_certificate_sds_secret_configs` of its listeners (its gateways' `credentialName(s)`) or
//!   clusters (the DestinationRule `credentialName`s that apply to it), see
//!   [`references`]. Istio asks the API server instead (a SubjectAccessReview: may the proxy's
//!   service account list the Secrets of its namespace); pilot-discovery has no such check.
//!
//! A refused or missing name is left out (Envoy keeps waiting, as with istiod), logged with the
//! proxy's ID (rate limited, names escaped and bounded) and counted: `pilot_sds_denied{reason}` and Istio's
//! `pilot_sds_certificate_errors_total`.

use std::collections::BTreeSet;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use model::{ConfigKind, ConfigSpec, Proxy, VerifiedIdentity};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use prost::Message;
use push_index::PushContext;
use serde_json::Value;
use xds_api::Resource;
use xds_api::envoy::config::cluster::v3::Cluster;
use xds_api::envoy::config::core::v3::{DataSource, TransportSocket, data_source, transport_socket};
use xds_api::envoy::config::listener::v3::Listener;
use xds_api::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, Secret, TlsCertificate, UpstreamTlsContext,
    common_tls_context::ValidationContextType, secret,
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// Why a credential was not served (`pilot_sds_denied{reason}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Denial {
    /// The proxy has no verified identity (plaintext port).
    Unauthenticated,
    /// A Secret of another namespace than the verified identity's.
    Namespace,
    /// A certificate and key the proxy's config does not ask for.
    Unreferenced,
}

impl Denial {
    fn label(self) -> &'static str {
        match self {
            Denial::Unauthenticated => "unauthenticated",
            Denial::Namespace => "namespace",
            Denial::Unreferenced => "unreferenced",
        }
    }
}

/// The SDS generator's counters. Cheap to clone (shared counters); unregistered ones count for
/// nobody.
#[derive(Clone, Debug, Default)]
pub struct SdsMetrics {
    /// `pilot_sds_denied{reason}`: credentials refused, one per name (all the names of a request
    /// for `unauthenticated`).
    denied: Family<ReasonLabel, Counter>,
    /// Istio's `pilot_sds_certificate_errors_total`: refusals (one per request that had any) and
    /// credentials that could not be read (malformed names, missing Secrets or keys).
    certificate_errors: Counter,
}

impl SdsMetrics {
    /// Counters registered in `registry`.
    pub fn register(registry: &mut Registry) -> SdsMetrics {
        let m = SdsMetrics::default();
        registry.register(
            "pilot_sds_denied",
            "Credentials (SDS kubernetes:// resources) refused to a proxy, by reason: unauthenticated \
             (no verified identity: plaintext port), namespace (another namespace's Secret), \
             unreferenced (a certificate its config does not use).",
            m.denied.clone(),
        );
        registry.register(
            "pilot_sds_certificate_errors_total",
            "Total number of failures to fetch SDS key and certificate.",
            m.certificate_errors.clone(),
        );
        m
    }

    fn deny(&self, reason: Denial, n: usize) {
        self.denied
            .get_or_create(&ReasonLabel { reason: reason.label() })
            .inc_by(n as u64);
    }

    #[cfg(test)]
    pub(crate) fn denied(&self, reason: Denial) -> u64 {
        self.denied.get_or_create(&ReasonLabel { reason: reason.label() }).get()
    }

    #[cfg(test)]
    pub(crate) fn certificate_errors(&self) -> u64 {
        self.certificate_errors.get()
    }
}

/// The credentials of `names` that `proxy` may have. `references` gives the SDS names its own
/// listeners and clusters ask for (asked only when a certificate and key is requested).
pub(crate) fn secrets(
    push: &PushContext,
    proxy: &Proxy,
    names: &[String],
    references: impl FnOnce() -> std::sync::Arc<BTreeSet<String>>,
    metrics: &SdsMetrics,
) -> Vec<Resource> {
    if names.is_empty() {
        return Vec::new();
    }
    let Some(identity) = &proxy.verified_identity else {
        refuse_unauthenticated(proxy, names, metrics);
        return Vec::new();
    };
    let mut references = Some(references);
    let mut referenced: Option<std::sync::Arc<BTreeSet<String>>> = None;
    let mut denied: Vec<(&String, Denial)> = Vec::new();
    let mut served = Vec::new();
    for name in names {
        let Some(reference) = SecretRef::parse(name, identity) else {
            metrics.certificate_errors.inc();
            if let Some(suppressed) = monitoring::throttle::allow("sds_certificate_error") {
                tracing::warn!(
                    suppressed,
                    "SDS: proxy {}: error parsing resource name {:?}: only kubernetes://[<namespace>/]<name> \
                     credentials are served",
                    proxy.id,
                    bounded(name)
                );
            }
            continue;
        };
        if reference.namespace != identity.namespace {
            denied.push((name, Denial::Namespace));
            continue;
        }
        // CA certificates are public: served to any proxy of the namespace, as Istio's.
        if !reference.name.ends_with(CA_SUFFIX) {
            let asked = referenced.get_or_insert_with(|| references.take().map(|f| f()).unwrap_or_default());
            if !asked.contains(name.as_str()) {
                denied.push((name, Denial::Unreferenced));
                continue;
            }
        }
        match secret(push, &reference, name) {
            Ok(s) => served.push(Resource::new(name.clone(), &s)),
            Err(reason) => {
                metrics.certificate_errors.inc();
                if let Some(suppressed) = monitoring::throttle::allow("sds_certificate_error") {
                    tracing::warn!(
                        suppressed,
                        "SDS: proxy {}: failed to fetch {:?}: {:?}",
                        proxy.id,
                        bounded(name),
                        bounded(&reason)
                    );
                }
            }
        }
    }
    if !denied.is_empty() {
        report_denied(proxy, identity, &denied, metrics);
    }
    served
}

/// Istio's "proxy is not authorized to receive credentials": a proxy without a verified identity.
fn refuse_unauthenticated(proxy: &Proxy, names: &[String], metrics: &SdsMetrics) {
    if let Some(suppressed) = monitoring::throttle::allow("sds_unauthenticated") {
        tracing::warn!(
            suppressed,
            "SDS: proxy {} is not authorized to receive credentials ({}): it has no verified identity. \
             Connect it over TLS to the secure port (--secureGrpcAddr, 15012) with a service account \
             token (authorization: Bearer), as pilot-agent does",
            proxy.id,
            at_most_n(names, 3)
        );
    }
    metrics.deny(Denial::Unauthenticated, names.len());
}

/// One warning for the names refused to a verified proxy (Istio's "attempted to access
/// unauthorized certificates"), each counted.
fn report_denied(proxy: &Proxy, identity: &VerifiedIdentity, denied: &[(&String, Denial)], metrics: &SdsMetrics) {
    for (_, reason) in denied {
        metrics.deny(*reason, 1);
    }
    metrics.certificate_errors.inc();
    let names: Vec<String> = denied.iter().map(|(n, _)| (*n).clone()).collect();
    let why = if denied.iter().any(|(_, r)| *r == Denial::Namespace) {
        format!("only Secrets of its own namespace {} may be read", identity.namespace)
    } else {
        "only the certificates its gateways and DestinationRules use may be read".to_owned()
    };
    if let Some(suppressed) = monitoring::throttle::allow("sds_denied") {
        tracing::warn!(
            suppressed,
            "SDS: proxy {} ({identity}) attempted to access unauthorized certificates {}: {why}",
            proxy.id,
            at_most_n(&names, 3)
        );
    }
}

/// A `kubernetes://[<namespace>/]<name>` reference, its namespace the identity's when it names
/// none (Istio's `ParseResourceName`).
struct SecretRef<'a> {
    namespace: &'a str,
    name: &'a str,
}

impl<'a> SecretRef<'a> {
    fn parse(resource: &'a str, identity: &'a VerifiedIdentity) -> Option<SecretRef<'a>> {
        let reference = resource.strip_prefix(KUBERNETES_PREFIX)?;
        let (namespace, name) = match reference.split_once('/') {
            Some((ns, n)) => (ns, n),
            None => (identity.namespace.as_str(), reference),
        };
        (!name.is_empty()).then_some(SecretRef { namespace, name })
    }
}

fn secret(push: &PushContext, r: &SecretRef<'_>, resource: &str) -> Result<Secret, String> {
    let namespace = r.namespace;
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
    if let Some(base) = r.name.strip_suffix(CA_SUFFIX) {
        // the CA: a Secret `<name>-cacert`, else the `ca.crt` of `<name>`
        let ca = find(r.name)
            .and_then(|o| value(o, &["ca.crt", "cacert"]))
            .or_else(|| find(base).and_then(|o| value(o, &["ca.crt", "cacert"])))
            .ok_or_else(|| {
                format!(
                    "no CA (ca.crt or cacert) in Secret {namespace}/{base} or {namespace}/{}",
                    r.name
                )
            })?;
        return Ok(Secret {
            name: resource.to_owned(),
            r#type: Some(secret::Type::ValidationContext(CertificateValidationContext {
                trusted_ca: Some(inline(ca)),
                ..Default::default()
            })),
        });
    }
    let obj = find(r.name).ok_or_else(|| format!("no Secret {namespace}/{}", r.name))?;
    let cert = value(obj, &["tls.crt", "cert"])
        .ok_or_else(|| format!("Secret {namespace}/{} has no tls.crt or cert", r.name))?;
    let key = value(obj, &["tls.key", "key"])
        .ok_or_else(|| format!("Secret {namespace}/{} has no tls.key or key", r.name))?;
    Ok(Secret {
        name: resource.to_owned(),
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

/// The SDS names that `clusters` and `listeners` (a proxy's CDS and LDS, encoded) ask for as
/// certificates or CAs: Istio's `VerifiedCertificateReferences` of its gateways, and the
/// `credentialName`s of the DestinationRules that apply to it.
pub(crate) fn references(clusters: &[Resource], listeners: &[Resource]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for r in clusters {
        let Ok(c) = Cluster::decode(r.resource.value.as_slice()) else {
            continue;
        };
        let matched = c
            .transport_socket_matches
            .iter()
            .filter_map(|m| m.transport_socket.as_ref());
        for socket in c.transport_socket.iter().chain(matched) {
            if let Some(ctx) = typed::<UpstreamTlsContext>(socket) {
                common_references(ctx.common_tls_context.as_ref(), &mut out);
            }
        }
    }
    for r in listeners {
        let Ok(l) = Listener::decode(r.resource.value.as_slice()) else {
            continue;
        };
        for chain in l.filter_chains.iter().chain(l.default_filter_chain.iter()) {
            if let Some(ctx) = chain.transport_socket.as_ref().and_then(typed::<DownstreamTlsContext>) {
                common_references(ctx.common_tls_context.as_ref(), &mut out);
            }
        }
    }
    out
}

fn typed<M: Message + Default + prost::Name>(socket: &TransportSocket) -> Option<M> {
    match &socket.config_type {
        Some(transport_socket::ConfigType::TypedConfig(any)) if any.type_url == M::type_url() => {
            M::decode(any.value.as_slice()).ok()
        }
        _ => None,
    }
}

fn common_references(common: Option<&CommonTlsContext>, out: &mut BTreeSet<String>) {
    let Some(common) = common else { return };
    out.extend(common.tls_certificate_sds_secret_configs.iter().map(|s| s.name.clone()));
    match &common.validation_context_type {
        Some(ValidationContextType::ValidationContextSdsSecretConfig(s)) => {
            out.insert(s.name.clone());
        }
        Some(ValidationContextType::CombinedValidationContext(c)) => {
            out.extend(c.validation_context_sds_secret_config.iter().map(|s| s.name.clone()));
        }
        _ => {}
    }
}

/// A name as logged: at most 256 characters, escaped (it comes from the proxy).
fn bounded(name: &str) -> String {
    name.chars().take(256).collect()
}

/// Istio's `atMostNJoin`: the first `n` names, escaped, and how many more.
fn at_most_n(names: &[String], n: usize) -> String {
    let mut s = names
        .iter()
        .take(n)
        .map(|name| format!("{:?}", bounded(name)))
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > n {
        s.push_str(&format!(", and {} more", names.len() - n));
    }
    s
}

#[cfg(test)]
#[path = "sds_tests.rs"]
mod tests;
