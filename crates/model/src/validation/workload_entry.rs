//! `WorkloadEntry` validation as Istio's `validateWorkloadEntry` and the CRD's rules: an address
//! that is an IP, a hostname or a unix socket (unless only a network is set), named ports, labels.
//! Also used for a ServiceEntry's inline endpoints.

use std::collections::BTreeSet;

use super::common::{Errors, check_labels, validate_port, validate_port_name, validate_unix_address};
use super::hosts::{is_ip, validate_fqdn};
use crate::networking::WorkloadEntry;

const UNIX_PREFIX: &str = "unix://";

/// How the address of a workload is checked.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Addresses {
    /// IP, FQDN or unix socket (a WorkloadEntry, or a DNS ServiceEntry's endpoint).
    IpOrHostname,
    /// IP or unix socket only (a STATIC ServiceEntry's endpoint).
    IpOnly,
}

pub(crate) fn check_workload_entry(errs: &mut Errors, path: &str, we: &WorkloadEntry) {
    check_workload(errs, path, we, Addresses::IpOrHostname, None);
}

/// `service_ports`: the port names of the ServiceEntry this endpoint belongs to, if any.
pub(crate) fn check_workload(
    errs: &mut Errors,
    path: &str,
    we: &WorkloadEntry,
    addresses: Addresses,
    service_ports: Option<&BTreeSet<&str>>,
) {
    let apath = format!("{path}.address");
    let addr = we.address.as_str();
    if addr.is_empty() && we.network.is_empty() {
        errs.add(&apath, "address is required");
        return;
    }
    if let Some(socket) = addr.strip_prefix(UNIX_PREFIX) {
        errs.check(&apath, validate_unix_address(socket));
        if !we.ports.is_empty() {
            errs.add(
                &format!("{path}.ports"),
                format!("unix endpoint {addr} must not include ports"),
            );
        }
        if service_ports.is_some_and(|p| p.len() != 1) {
            errs.add(&apath, "exactly 1 service port required for unix endpoints");
        }
    } else if !addr.is_empty() && !is_ip(addr) {
        match addresses {
            Addresses::IpOnly => errs.add(&apath, format!("endpoint address {addr:?} is not a valid IP address")),
            Addresses::IpOrHostname => {
                if validate_fqdn(addr).is_err() {
                    errs.add(
                        &apath,
                        format!("endpoint address {addr:?} is not a valid FQDN or an IP address"),
                    );
                }
            }
        }
    }
    check_ports(errs, path, we, service_ports);
    check_labels(errs, &format!("{path}.labels"), &we.labels);
}

/// Port names are DNS labels known to the ServiceEntry (when there is one); numbers are 1..65535.
pub(crate) fn check_ports(errs: &mut Errors, path: &str, we: &WorkloadEntry, service_ports: Option<&BTreeSet<&str>>) {
    for (name, port) in &we.ports {
        let ppath = format!("{path}.ports[{name}]");
        if service_ports.is_some_and(|p| !p.contains(name.as_str())) {
            errs.add(
                &ppath,
                format!("endpoint port {port} is not defined by the service entry"),
            );
        }
        errs.check(&ppath, validate_port_name(name));
        errs.check(&ppath, validate_port((*port).into()));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn errors(we: &WorkloadEntry) -> Vec<String> {
        let mut errs = Errors::default();
        check_workload_entry(&mut errs, "spec", we);
        errs.into_vec()
    }

    fn entry(address: &str, ports: &[(&str, u32)]) -> WorkloadEntry {
        WorkloadEntry {
            address: address.into(),
            ports: ports.iter().map(|(n, p)| (n.to_string(), *p)).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn addresses() {
        for ok in [
            "1.2.3.4",
            "2001:db8::1",
            "example.com",
            "unix:///var/run/app.sock",
            "unix://@abstract",
        ] {
            assert!(errors(&entry(ok, &[])).is_empty(), "{ok}");
        }
        assert!(
            errors(&WorkloadEntry {
                network: "net".into(),
                ..Default::default()
            })
            .is_empty()
        );
        assert_eq!(errors(&entry("", &[])), ["spec.address: address is required"]);
        assert!(errors(&entry("unix:///dir/", &[]))[0].contains("directory"));
        assert!(errors(&entry("unix://relative", &[]))[0].contains("absolute path"));
        assert!(errors(&entry("unix://@foo", &[("http", 80)]))[0].contains("must not include ports"));
        assert!(errors(&entry("not_a_host!", &[]))[0].contains("not a valid FQDN or an IP"));
    }

    #[test]
    fn ports_and_labels() {
        assert!(errors(&entry("1.1.1.1", &[("http", 80), ("grpc-x", 9090)])).is_empty());
        assert_eq!(
            errors(&entry("1.1.1.1", &[("http", 99999)])),
            ["spec.ports[http]: port number 99999 must be in the range 1..65535"]
        );
        assert!(errors(&entry("1.1.1.1", &[("@", 80)]))[0].contains("invalid port name"));
        let mut we = entry("1.1.1.1", &[]);
        we.labels = BTreeMap::from([("app".into(), "bad value".into())]);
        assert!(errors(&we)[0].starts_with("spec.labels: invalid tag value"));
    }

    #[test]
    fn service_entry_endpoints() {
        let names = BTreeSet::from(["http"]);
        let mut errs = Errors::default();
        check_workload(
            &mut errs,
            "spec.endpoints[0]",
            &entry("example.com", &[("tcp", 80)]),
            Addresses::IpOnly,
            Some(&names),
        );
        let errs = errs.into_vec();
        assert!(errs[0].contains("not a valid IP address"), "{errs:?}");
        assert!(errs[1].contains("not defined by the service entry"), "{errs:?}");
        let mut errs = Errors::default();
        let two = BTreeSet::from(["http", "grpc"]);
        check_workload(
            &mut errs,
            "spec.endpoints[0]",
            &entry("unix:///sock", &[]),
            Addresses::IpOnly,
            Some(&two),
        );
        assert!(errs.into_vec()[0].contains("exactly 1 service port"));
    }
}
