//! Host names as Istio validates them (`pkg/config/validation/agent`, `pkg/config/labels`): DNS-1123
//! labels, FQDNs, wildcard domains, IPs and CIDRs, and the `namespace/host` form of Gateway and
//! Sidecar hosts.

use std::net::IpAddr;

use super::common::Check;

/// Istio's `labels.IsDNS1123Label`: like RFC 1123 but letters of either case (`[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?`).
pub(crate) fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Istio's `labels.IsWildcardDNS1123Label`: `*`, or a DNS-1123 label optionally prefixed by `*` or `*-`.
fn is_wildcard_dns1123_label(s: &str) -> bool {
    s.len() <= 63
        && (s == "*"
            || is_dns1123_label(s)
            || s.strip_prefix("*-").is_some_and(is_dns1123_label)
            || s.strip_prefix('*').is_some_and(is_dns1123_label))
}

fn check_dns1123_preconditions(name: &str) -> Check {
    if name.len() > 255 {
        return Err(format!("domain name {name:?} too long (max 255)"));
    }
    if name.is_empty() {
        return Err("empty domain name not allowed".into());
    }
    Ok(())
}

fn validate_dns1123_labels(domain: &str) -> Check {
    let parts: Vec<&str> = domain.split('.').collect();
    let tld = parts.last().copied().unwrap_or_default();
    let digits = tld.strip_prefix(['+', '-']).unwrap_or(tld);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "domain name {domain:?} invalid (top level domain {tld:?} cannot be all-numeric)"
        ));
    }
    for (i, label) in parts.iter().enumerate() {
        // a trailing dot (`istio.io.`) is allowed
        if i == parts.len() - 1 && label.is_empty() {
            return Ok(());
        }
        if !is_dns1123_label(label) {
            return Err(format!("domain name {domain:?} invalid (label {label:?} invalid)"));
        }
    }
    Ok(())
}

/// A fully-qualified domain name (`ValidateFQDN`): no wildcards, no all-numeric top-level label.
pub(crate) fn validate_fqdn(fqdn: &str) -> Check {
    check_dns1123_preconditions(fqdn)?;
    validate_dns1123_labels(fqdn)
}

/// An FQDN that may start with a wildcard label (`ValidateWildcardDomain`): `*`, `*.foo.com`, `*foo.com`.
pub(crate) fn validate_wildcard_domain(domain: &str) -> Check {
    check_dns1123_preconditions(domain)?;
    let (first, rest) = match domain.split_once('.') {
        Some((first, rest)) => (first, Some(rest)),
        None => (domain, None),
    };
    if !is_wildcard_dns1123_label(first) {
        return Err(format!("domain name {domain:?} invalid (label {first:?} invalid)"));
    }
    rest.map_or(Ok(()), validate_dns1123_labels)
}

/// `ValidatePartialWildCard`: a wildcard must be the whole host or a leading `*.` label.
pub(crate) fn validate_partial_wildcard(host: &str) -> Check {
    if host.contains('*') && host.len() != 1 && !host.starts_with("*.") {
        return Err(format!("partial wildcard {host:?} not allowed"));
    }
    Ok(())
}

/// Go's `netip.ParseAddr`: IPv4 without leading zeros, IPv6 with an optional `%zone`.
pub(crate) fn is_ip(addr: &str) -> bool {
    if let Some((ip, zone)) = addr.split_once('%') {
        return !zone.is_empty() && ip.parse::<std::net::Ipv6Addr>().is_ok();
    }
    addr.parse::<IpAddr>().is_ok()
}

pub(crate) fn validate_ip(addr: &str) -> Check {
    if is_ip(addr) {
        Ok(())
    } else {
        Err(format!("{addr} is not a valid IP"))
    }
}

/// `ValidateIPSubnet`: `a.b.c.d/xx`, `2001:1::1/64`, or a plain IP.
pub(crate) fn validate_ip_subnet(subnet: &str) -> Check {
    if subnet.matches('/').count() == 1 {
        return match subnet.parse::<ipnet::IpNet>() {
            Ok(_) => Ok(()),
            Err(_) => Err(format!("{subnet} is not a valid CIDR block")),
        };
    }
    validate_ip(subnet)
}

/// The host of a Gateway server (`isGateway`) or a Sidecar egress listener: `namespace/dnsName`
/// (`ValidateNamespaceSlashWildcardHostname`); Gateways also take a bare host or IP.
pub(crate) fn validate_namespace_slash_host(hostname: &str, is_gateway: bool) -> Vec<String> {
    let mut errs = Vec::new();
    let Some((ns, host)) = hostname.split_once('/') else {
        if is_gateway {
            host_part(&mut errs, hostname, true);
        } else {
            errs.push("host must be of form namespace/dnsName".into());
        }
        return errs;
    };
    if ns.is_empty() || host.is_empty() {
        errs.push("config namespace and dnsName in host entry cannot be empty".into());
    }
    if !is_gateway {
        let bare = ns.strip_prefix('~').unwrap_or(ns);
        if !bare.is_empty() && bare != "*" && bare != "." && !is_dns1123_label(bare) {
            errs.push(format!("invalid namespace value {ns:?} in sidecar"));
        }
    } else if ns != "*" && ns != "." && !is_dns1123_label(ns) {
        errs.push(format!("invalid namespace value {ns:?} in gateway"));
    }
    host_part(&mut errs, host, is_gateway);
    errs
}

fn host_part(errs: &mut Vec<String>, hostname: &str, is_gateway: bool) {
    if hostname != "*" && !hostname.contains('.') {
        errs.push(format!("short names (non FQDN) are not allowed: {hostname:?}"));
    }
    if let Err(e) = validate_wildcard_domain(hostname) {
        // gateways also accept an IP as the host
        if !is_gateway || !is_ip(hostname) {
            errs.push(e);
        }
    }
    if let Err(e) = validate_partial_wildcard(hostname) {
        errs.push(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fqdn_and_wildcard_domains() {
        assert!(validate_fqdn("reviews.default.svc.cluster.local").is_ok());
        assert!(validate_fqdn("istio.io.").is_ok());
        assert!(validate_fqdn("Foo.Example.com").is_ok());
        assert!(validate_fqdn("*.example.com").is_err());
        assert!(validate_fqdn("1.2.3.4").unwrap_err().contains("all-numeric"));
        assert!(validate_fqdn("").unwrap_err().contains("empty"));
        assert!(validate_fqdn(&"a".repeat(256)).unwrap_err().contains("too long"));
        assert!(validate_fqdn("foo..com").is_err());
        assert!(validate_fqdn("-foo.com").is_err());
        for ok in [
            "*",
            "*.example.com",
            "*x",
            "*-x.example.com",
            "*foo.bar.com",
            "reviews",
            "example.com",
            &"x".repeat(63),
        ] {
            assert!(validate_wildcard_domain(ok).is_ok(), "{ok}");
        }
        for bad in ["foo*", "foo.*.com", "**", "*.1", "a.*", "foo_bar.com", ""] {
            assert!(validate_wildcard_domain(bad).is_err(), "{bad}");
        }
        assert!(validate_partial_wildcard("*x").is_err());
        assert!(validate_partial_wildcard("*.x").is_ok());
        assert!(validate_partial_wildcard("*").is_ok());
    }

    #[test]
    fn ips_and_subnets() {
        assert!(is_ip("10.0.0.1") && is_ip("::1") && is_ip("001:db8::") && is_ip("fe80::1%eth0"));
        assert!(!is_ip("01.1.1.1") && !is_ip("1.1.1") && !is_ip("example.com") && !is_ip("fe80::1%"));
        assert!(validate_ip_subnet("10.0.0.0/8").is_ok());
        assert!(validate_ip_subnet("1.2.3.4/16").is_ok());
        assert!(validate_ip_subnet("2001:1::1/64").is_ok());
        assert!(validate_ip_subnet("1.2.3.4").is_ok());
        assert!(validate_ip_subnet("1.2.3.4/99").unwrap_err().contains("CIDR"));
        assert!(validate_ip_subnet("1.2.3.4/1/2").is_err());
    }

    #[test]
    fn namespace_slash_hosts() {
        assert!(validate_namespace_slash_host("*/*", false).is_empty());
        assert!(validate_namespace_slash_host("./reviews.default.svc.cluster.local", false).is_empty());
        assert!(validate_namespace_slash_host("~istio-system/*", false).is_empty());
        assert!(validate_namespace_slash_host("ns/*.example.com", false).is_empty());
        assert!(validate_namespace_slash_host("reviews.example.com", false)[0].contains("namespace/dnsName"));
        assert!(validate_namespace_slash_host("ns/reviews", false)[0].contains("short names"));
        assert!(
            validate_namespace_slash_host("ns/foo*.com", false)
                .iter()
                .any(|e| e.contains("partial wildcard"))
        );
        assert!(validate_namespace_slash_host("Bad_ns/*", false)[0].contains("invalid namespace"));
        assert!(validate_namespace_slash_host("/*", false)[0].contains("cannot be empty"));
        // gateways: bare hosts and IPs
        assert!(validate_namespace_slash_host("*.example.com", true).is_empty());
        assert!(validate_namespace_slash_host("*", true).is_empty());
        assert!(validate_namespace_slash_host("ns/10.0.0.1", true).is_empty());
        assert!(validate_namespace_slash_host("~/foo.com", true)[0].contains("in gateway"));
        assert!(validate_namespace_slash_host("foo", true)[0].contains("short names"));
    }
}
