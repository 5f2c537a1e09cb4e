//! Hostnames as Istio's `host.Name`: FQDNs with an optional leading `*` wildcard.

/// Whether `a` matches `b` when either may be a wildcard (Istio's `host.Name.Matches`):
/// `*.foo.com` matches `bar.foo.com` and `*.foo.com`; `*` matches everything.
pub fn matches(a: &str, b: &str) -> bool {
    match (a.strip_prefix('*'), b.strip_prefix('*')) {
        (Some(a_suffix), Some(b_suffix)) => {
            // both wildcards: one suffix must contain the other
            a_suffix.ends_with(b_suffix) || b_suffix.ends_with(a_suffix)
        }
        (Some(a_suffix), None) => b.ends_with(a_suffix),
        (None, Some(b_suffix)) => a.ends_with(b_suffix),
        (None, None) => a == b,
    }
}

/// Whether `a` is a subset of `b` (Istio's `SubsetOf`): every host matched by `a` is matched by `b`.
pub fn subset_of(a: &str, b: &str) -> bool {
    match (a.strip_prefix('*'), b.strip_prefix('*')) {
        (Some(a_suffix), Some(b_suffix)) => a_suffix.ends_with(b_suffix),
        (Some(_), None) => false,
        (None, Some(b_suffix)) => a.ends_with(b_suffix),
        (None, None) => a == b,
    }
}

pub fn is_wildcard(h: &str) -> bool {
    h.starts_with('*')
}

/// Resolves a short host from config in `namespace` to an FQDN, as Istio's `ResolveShortnameToFQDN`:
/// `reviews` -> `reviews.<ns>.svc.<domain>`; names with a dot, wildcards and IPs are kept.
pub fn resolve_short_name(host: &str, namespace: &str, domain: &str) -> String {
    if host == "*" || host.contains('.') || host.parse::<std::net::IpAddr>().is_ok() {
        return host.to_owned();
    }
    if let Some(rest) = host.strip_prefix("*") {
        // "*foo" with no dot: keep as written
        return format!("*{rest}");
    }
    format!("{host}.{namespace}.svc.{domain}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_matching() {
        assert!(matches("*.foo.com", "bar.foo.com"));
        assert!(matches("bar.foo.com", "*.foo.com"));
        assert!(matches("*", "anything.example"));
        assert!(matches("*.com", "*.foo.com"));
        assert!(!matches("*.foo.com", "foo.com"));
        assert!(!matches("a.com", "b.com"));
        assert!(subset_of("*.foo.com", "*.com"));
        assert!(!subset_of("*.com", "*.foo.com"));
        assert!(subset_of("a.foo.com", "*.foo.com"));
    }

    #[test]
    fn short_names() {
        assert_eq!(
            resolve_short_name("reviews", "default", "cluster.local"),
            "reviews.default.svc.cluster.local"
        );
        assert_eq!(
            resolve_short_name("reviews.prod", "default", "cluster.local"),
            "reviews.prod"
        );
        assert_eq!(resolve_short_name("*", "default", "cluster.local"), "*");
        assert_eq!(resolve_short_name("10.0.0.1", "default", "cluster.local"), "10.0.0.1");
    }
}
