//! The DNS proxy's lookup table, built from the NDS name table as Istio's agent builds it
//! (`BuildAlternateHosts`, `buildDNSAnswers`): each host answers as its FQDN; a Kubernetes
//! service also as `<name>.<namespace>`, `<name>.<namespace>.svc`, and `<name>` in the proxy's
//! own namespace; each of those also with the first search domain of the pod's resolv.conf
//! appended (what a resolver tries first). Those expanded names are answered with the addresses
//! directly, under the asked name (no CNAME). `*.example.com` hosts answer every name below them.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use istio_api::nds::NameTable;

/// The addresses of one name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Addresses {
    pub v4: Vec<Ipv4Addr>,
    pub v6: Vec<Ipv6Addr>,
}

/// Lower-case absolute names (`reviews.default.svc.cluster.local.`) to their addresses.
#[derive(Debug, Default, PartialEq)]
pub struct LookupTable {
    /// A host's names share its addresses.
    names: HashMap<String, Arc<Addresses>>,
}

/// Where the proxy is: what short names mean.
#[derive(Debug, Clone, Default)]
pub struct ProxyDomain {
    /// The proxy's namespace.
    pub namespace: String,
    /// The cluster's domain after `svc` (`cluster.local`), from the proxy's `<ns>.svc.<domain>`.
    pub domain: String,
    /// `svc`, the first label of the proxy's domain after its namespace.
    pub first_label: String,
}

impl ProxyDomain {
    /// From the proxy's namespace and DNS domain (`<ns>.svc.cluster.local`), as Istio's
    /// `NewLocalDNSServer`: the domain without the namespace label.
    pub fn new(namespace: &str, proxy_domain: &str) -> ProxyDomain {
        let mut parts: Vec<&str> = proxy_domain.split('.').filter(|p| !p.is_empty()).collect();
        if parts.first() == Some(&namespace) {
            parts.remove(0);
        }
        ProxyDomain {
            namespace: namespace.to_owned(),
            first_label: parts.first().map(|s| (*s).to_owned()).unwrap_or_default(),
            domain: parts.join("."),
        }
    }
}

impl LookupTable {
    pub fn build(nt: &NameTable, proxy: &ProxyDomain, search: &[String]) -> LookupTable {
        let mut names: HashMap<String, Arc<Addresses>> = HashMap::new();
        for (hostname, info) in &nt.table {
            let mut addresses = Addresses::default();
            for ip in info.ips.iter().filter_map(|ip| ip.parse::<IpAddr>().ok()) {
                match ip {
                    IpAddr::V4(a) => addresses.v4.push(a),
                    IpAddr::V6(a) => addresses.v6.push(a),
                }
            }
            if addresses.v4.is_empty() && addresses.v6.is_empty() {
                continue;
            }
            addresses.v4.shrink_to_fit();
            addresses.v6.shrink_to_fit();
            let addresses = Arc::new(addresses);
            let alt = if info.registry == "Kubernetes" {
                alt_hosts(hostname, &info.shortname, &info.namespace, proxy)
            } else if hostname.ends_with('.') {
                vec![hostname.clone()]
            } else {
                vec![format!("{hostname}.")]
            };
            let first_search = search.first().map(|s| s.trim_end_matches('.').to_ascii_lowercase());
            for h in alt {
                let h = h.to_ascii_lowercase();
                if let Some(s) = &first_search
                    && !s.is_empty()
                    && !h.ends_with(&format!("{s}."))
                {
                    names.entry(format!("{h}{s}.")).or_insert_with(|| addresses.clone());
                }
                names.insert(h, addresses.clone());
            }
        }
        names.shrink_to_fit();
        LookupTable { names }
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The addresses of `name` (absolute, any case), or of the closest `*.` host above it.
    pub fn lookup(&self, name: &str) -> Option<&Addresses> {
        let name = name.to_ascii_lowercase();
        let name = if name.ends_with('.') { name } else { format!("{name}.") };
        if let Some(a) = self.names.get(&name) {
            return Some(a.as_ref());
        }
        let mut rest = name.as_str();
        while let Some((_, parent)) = rest.split_once('.') {
            if parent.is_empty() {
                break;
            }
            if let Some(a) = self.names.get(&format!("*.{parent}")) {
                return Some(a.as_ref());
            }
            rest = parent;
        }
        None
    }
}

/// Istio's `generateAltHosts` for a Kubernetes service in the proxy's cluster domain.
fn alt_hosts(hostname: &str, shortname: &str, namespace: &str, proxy: &ProxyDomain) -> Vec<String> {
    if hostname.ends_with('.') {
        return Vec::new();
    }
    let mut out = vec![format!("{hostname}.")];
    if proxy.domain.is_empty() || !hostname.ends_with(&proxy.domain) || shortname.is_empty() {
        return out;
    }
    out.push(format!("{shortname}.{namespace}."));
    if proxy.namespace == namespace {
        out.push(format!("{shortname}."));
    }
    out.push(format!("{shortname}.{namespace}.{}.", proxy.first_label));
    out
}

#[cfg(test)]
mod tests {
    use istio_api::nds::name_table::NameInfo;

    use super::*;

    fn table() -> LookupTable {
        let mut nt = NameTable::default();
        nt.table.insert(
            "reviews.default.svc.cluster.local".into(),
            NameInfo {
                ips: vec!["240.240.0.10".into()],
                registry: "Kubernetes".into(),
                shortname: "reviews".into(),
                namespace: "default".into(),
                ..Default::default()
            },
        );
        nt.table.insert(
            "ratings.prod.svc.cluster.local".into(),
            NameInfo {
                ips: vec!["10.0.0.1".into(), "fd00::1".into()],
                registry: "Kubernetes".into(),
                shortname: "ratings".into(),
                namespace: "prod".into(),
                ..Default::default()
            },
        );
        nt.table.insert(
            "*.wild.example.com".into(),
            NameInfo {
                ips: vec!["240.240.0.11".into()],
                registry: "External".into(),
                ..Default::default()
            },
        );
        nt.table.insert(
            "nothing.example.com".into(),
            NameInfo {
                ips: vec!["not-an-ip".into()],
                registry: "External".into(),
                ..Default::default()
            },
        );
        let proxy = ProxyDomain::new("default", "default.svc.cluster.local");
        LookupTable::build(
            &nt,
            &proxy,
            &["default.svc.cluster.local".into(), "svc.cluster.local".into()],
        )
    }

    #[test]
    fn kubernetes_short_names_search_expansion_and_wildcards() {
        let t = table();
        let v4 = |n: &str| t.lookup(n).map(|a| a.v4.clone());
        let vip = Some(vec![Ipv4Addr::new(240, 240, 0, 10)]);
        for name in [
            "reviews.default.svc.cluster.local.",
            "Reviews.Default.svc.cluster.local",
            "reviews.",
            "reviews.default.",
            "reviews.default.svc.",
            // what a resolver asks first for `reviews` with the pod's search list
            "reviews.default.svc.cluster.local.",
            "reviews.default.default.svc.cluster.local.",
        ] {
            assert_eq!(v4(name), vip, "{name}");
        }
        // another namespace: no bare short name
        assert!(t.lookup("ratings.").is_none());
        assert!(t.lookup("ratings.prod.").is_some());
        assert_eq!(t.lookup("ratings.prod.svc.cluster.local.").unwrap().v6.len(), 1);
        assert_eq!(v4("a.b.wild.example.com."), Some(vec![Ipv4Addr::new(240, 240, 0, 11)]));
        assert!(t.lookup("wild.example.com.").is_none());
        assert!(t.lookup("nothing.example.com.").is_none(), "no usable address");
        assert!(t.lookup("google.com.").is_none());
    }
}
