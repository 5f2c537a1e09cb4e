//! VIPs for ServiceEntries without addresses, as Istio's (pre-controller) `autoAllocateIPs`: a
//! ServiceEntry host that is not a wildcard and not resolution NONE gets `240.240.<a>.<b>` (and
//! `2001:2::f0f0:<a><b>`), its slot chosen by the FNV-1a hash of `<namespace>/<hostname>` with
//! double hashing on collision. Candidates are taken in key order, so the same set of
//! ServiceEntries always gets the same addresses, across pushes and restarts; a host keeps its
//! address as long as the hosts hashing to its slot do not change. Only proxies that capture DNS
//! use them (`Proxy::uses_auto_allocated_ips`).

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use model::Service;
use model::service::Resolution;

/// Istio's `maxIPs` and its secondary hash's prime.
const MAX_IPS: u32 = 256 * 254;
const PRIME: u32 = 65011;

/// The addresses allocated to one service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoAllocated {
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
}

/// `(hostname, namespace)` → addresses.
pub(crate) type Allocations = HashMap<(String, String), AutoAllocated>;

fn fnv1a32(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

fn needs_address(s: &Service) -> bool {
    s.attributes.service_registry == "External"
        && s.addresses.is_empty()
        && !s.hostname.contains('*')
        && s.resolution != Resolution::Passthrough
}

/// The allocations for `services`.
pub(crate) fn allocate(services: &[Arc<Service>]) -> Allocations {
    let mut candidates: Vec<&Arc<Service>> = services.iter().filter(|s| needs_address(s)).collect();
    candidates.sort_by(|a, b| (a.namespace(), &a.hostname).cmp(&(b.namespace(), &b.hostname)));
    candidates.dedup_by(|a, b| a.namespace() == b.namespace() && a.hostname == b.hostname);
    let mut slots: Vec<Option<&Arc<Service>>> = vec![None; MAX_IPS as usize];
    for (j, svc) in candidates.iter().enumerate() {
        if j as u32 >= MAX_IPS - 1 {
            tracing::error!(max = MAX_IPS, "out of IPs to allocate for service entries");
            break;
        }
        let key = format!("{}/{}", svc.namespace(), svc.hostname);
        let h = fnv1a32(key.as_bytes());
        let mut slot = h % MAX_IPS;
        let step = PRIME - (h % PRIME);
        let mut i: u32 = 1;
        while slots[slot as usize].is_some() {
            slot = h.wrapping_add(i.wrapping_mul(step)) % (MAX_IPS - 1);
            i += 1;
        }
        slots[slot as usize] = Some(svc);
    }
    // Istio numbers the slots from 1 and skips every 255th, so that no fourth octet is 0 or 255.
    let mut out = Allocations::new();
    let mut x: u32 = 0;
    for svc in slots {
        x += 1;
        let Some(svc) = svc else { continue };
        if x.is_multiple_of(255) {
            x += 1;
        }
        let (Ok(a), Ok(b)) = (u8::try_from(x / 255), u8::try_from(x % 255)) else {
            continue;
        };
        let v6 = if a == 0 {
            format!("2001:2::f0f0:{b:x}")
        } else {
            format!("2001:2::f0f0:{a:x}{b:x}")
        };
        let Ok(v6) = v6.parse::<Ipv6Addr>() else { continue };
        out.insert(
            (svc.hostname.clone(), svc.namespace().to_owned()),
            AutoAllocated {
                v4: Ipv4Addr::new(240, 240, a, b),
                v6,
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn se(host: &str, ns: &str, resolution: Resolution, addresses: &[&str]) -> Arc<Service> {
        Arc::new(Service {
            cluster_vips: Default::default(),
            hostname: host.into(),
            ports: Vec::new(),
            addresses: addresses.iter().map(|a| (*a).to_owned()).collect(),
            resolution,
            mesh_external: true,
            attributes: model::service::ServiceAttributes {
                service_registry: "External".into(),
                namespace: ns.into(),
                ..Default::default()
            },
            origin: String::new(),
        })
    }

    #[test]
    fn stable_distinct_addresses_in_the_reserved_ranges() {
        let services: Vec<Arc<Service>> = (0..500)
            .map(|i| se(&format!("h{i}.example.com"), "default", Resolution::DnsLb, &[]))
            .chain([
                se("with-vip.example.com", "default", Resolution::DnsLb, &["10.1.1.1"]),
                se("*.wild.example.com", "default", Resolution::DnsLb, &[]),
                se("none.example.com", "default", Resolution::Passthrough, &[]),
            ])
            .collect();
        let a = allocate(&services);
        assert_eq!(
            a.len(),
            500,
            "no VIP for hosts with addresses, wildcards or resolution NONE"
        );
        let v4: std::collections::HashSet<_> = a.values().map(|x| x.v4).collect();
        assert_eq!(v4.len(), 500, "distinct");
        for x in a.values() {
            assert_eq!(&x.v4.octets()[..2], &[240, 240]);
            assert!(x.v4.octets()[3] != 0 && x.v4.octets()[3] != 255, "{}", x.v4);
            assert_eq!(&x.v6.segments()[..2], &[0x2001, 0x2]);
        }
        // the same set in another order: the same addresses
        let mut reversed = services.clone();
        reversed.reverse();
        assert_eq!(allocate(&reversed), a);
        // another host added: the first ones keep theirs (no collision with these)
        let key = ("h1.example.com".to_owned(), "default".to_owned());
        let mut more = services.clone();
        more.push(se("new.example.com", "other", Resolution::ClientSideLb, &[]));
        assert_eq!(allocate(&more)[&key], a[&key]);
    }
}
