//! SPIFFE identities of Kubernetes service accounts (Istio's `pkg/spiffe`):
//! `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`.

/// A parsed identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub trust_domain: String,
    pub namespace: String,
    pub service_account: String,
}

impl Identity {
    /// Istio's `ParseIdentity`.
    pub fn parse(id: &str) -> Option<Identity> {
        let rest = id.strip_prefix("spiffe://")?;
        let mut parts = rest.split('/');
        let trust_domain = parts.next().filter(|t| !t.is_empty())?;
        match (parts.next(), parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("ns"), Some(ns), Some("sa"), Some(sa), None) if !ns.is_empty() && !sa.is_empty() => Some(Identity {
                trust_domain: trust_domain.to_owned(),
                namespace: ns.to_owned(),
                service_account: sa.to_owned(),
            }),
            _ => None,
        }
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

/// Istio's `MustGenSpiffeURI`.
pub fn identity(trust_domain: &str, namespace: &str, service_account: &str) -> String {
    format!("spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}")
}

/// `system:serviceaccount:<ns>:<sa>`, the subject of Kubernetes service account tokens, as
/// (namespace, service account).
pub fn service_account_of_subject(sub: &str) -> Option<(&str, &str)> {
    let rest = sub.strip_prefix("system:serviceaccount:")?;
    let (ns, sa) = rest.split_once(':')?;
    (!ns.is_empty() && !sa.is_empty() && !sa.contains(':')).then_some((ns, sa))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_round_trip_and_reject_other_shapes() {
        let id = identity("cluster.local", "default", "bookinfo");
        let parsed = Identity::parse(&id).unwrap();
        assert_eq!(
            (parsed.namespace.as_str(), parsed.service_account.as_str()),
            ("default", "bookinfo")
        );
        assert_eq!(parsed.to_string(), id);
        for bad in [
            "spiffe://td/ns/a",
            "spiffe:///ns/a/sa/b",
            "https://td/ns/a/sa/b",
            "spiffe://td/ns/a/sa/b/c",
            "spiffe://td/ns//sa/b",
        ] {
            assert_eq!(Identity::parse(bad), None, "{bad}");
        }
        assert_eq!(
            service_account_of_subject("system:serviceaccount:ns1:sa1"),
            Some(("ns1", "sa1"))
        );
        assert_eq!(service_account_of_subject("system:serviceaccount:ns1"), None);
        assert_eq!(service_account_of_subject("user:alice"), None);
    }
}
