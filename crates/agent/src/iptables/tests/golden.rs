//! Istio's capture goldens (tools/istio-iptables/pkg/capture/testdata), each with the flags of
//! its case in Istio's run_test.go, compared line for line: the `iptables-restore` input, then
//! the `ip6tables-restore` input when IPv6 is enabled.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::Path;

use super::super::config::DnsServers;
use super::super::rules;
use super::{DNS, config_with};

/// In the shared corpus beside the repository (`../shared`).
const GOLDEN_DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/corpus/istio/tools/istio-iptables/pkg/capture/testdata"
);
const UID_GID: [&str; 4] = ["-u", "3,4", "-g", "1,2"];
const IPV6: &str = "--enable-inbound-ipv6";

struct Case {
    name: &'static str,
    flags: Vec<&'static str>,
    dns: DnsServers,
}

fn case(name: &'static str, flags: &[&[&'static str]], dns_v4: &[Ipv4Addr], dns_v6: &[&str]) -> Case {
    Case {
        name,
        flags: flags.concat(),
        dns: DnsServers {
            v4: dns_v4.to_vec(),
            v6: dns_v6.iter().map(ToString::to_string).collect(),
        },
    }
}

/// Istio's run_test.go cases; our flags and DNS servers for each.
fn cases() -> Vec<Case> {
    let v6_ranges = ["-x", "2001:db8::/32", "-i", "2001:db8::/32"];
    let virt = ["-b", "4000,5000", "-k", "eth0,eth1"];
    vec![
        case("ipv6-empty-inbound-ports", &[&["-b", "", IPV6]], &[], &[]),
        case(
            "ip-range",
            &[&UID_GID, &["-x", "1.1.0.0/16", "-i", "9.9.0.0/16", "--redirect-dns"]],
            &[DNS],
            &[],
        ),
        case(
            "tproxy",
            &[&[
                "-m",
                "TPROXY",
                "-b",
                "*",
                "-x",
                "1.1.0.0/16",
                "-i",
                "9.9.0.0/16",
                "--redirect-dns",
                "-c",
                "not-istio-nic",
                IPV6,
            ]],
            &[DNS],
            &[],
        ),
        case("ipv6-inbound-ports", &[&["-b", "4000,5000", IPV6]], &[], &[]),
        case("ipv6-virt-interfaces", &[&virt, &[IPV6]], &[], &[]),
        case(
            "ipv6-ipnets",
            &[&virt, &["-d", "6000,7000,"], &v6_ranges, &[IPV6]],
            &[],
            &[],
        ),
        case(
            "ipv6-uid-gid",
            &[&virt, &["-d", "6000,7000"], &UID_GID, &v6_ranges, &[IPV6]],
            &[],
            &[],
        ),
        case("ipv6-outbound-ports", &[&["-q", "32000,31000", IPV6]], &[], &[]),
        case("empty", &[], &[], &[]),
        case("kube-virt-interfaces", &[&["-k", "eth1,eth2", "-i", "*"]], &[], &[]),
        case("ipnets", &[&["-i", "10.0.0.0/8"]], &[], &[]),
        case(
            "ipnets-with-kube-virt-interfaces",
            &[&["-k", "eth1,eth2", "-i", "10.0.0.0/8"]],
            &[],
            &[],
        ),
        case("inbound-ports-include", &[&["-b", "32000,31000"]], &[], &[]),
        case("inbound-ports-wildcard", &[&["-b", "*"]], &[], &[]),
        case(
            "inbound-ports-tproxy",
            &[&["-b", "32000,31000", "-m", "TPROXY"]],
            &[],
            &[],
        ),
        case(
            "inbound-ports-wildcard-tproxy",
            &[&["-b", "*", "-m", "TPROXY"]],
            &[],
            &[],
        ),
        case(
            "dns-uid-gid",
            &[&UID_GID, &["--redirect-dns", IPV6]],
            &[DNS],
            &["::127.0.0.53"],
        ),
        case("ipv6-dns-uid-gid", &[&UID_GID, &["--redirect-dns", IPV6]], &[], &[]),
        case(
            "outbound-owner-groups",
            &[&["--capture-outbound-owner-groups", "java,202"]],
            &[],
            &[],
        ),
        case(
            "outbound-owner-groups-exclude",
            &[&["--capture-outbound-owner-groups-exclude", "888,ftp"]],
            &[],
            &[],
        ),
        case(
            "ipv6-dns-outbound-owner-groups",
            &[&["--redirect-dns", "--capture-outbound-owner-groups", "java,202", IPV6]],
            &[],
            &[],
        ),
        case(
            "ipv6-dns-outbound-owner-groups-exclude",
            &[&[
                "--redirect-dns",
                "--capture-outbound-owner-groups-exclude",
                "888,ftp",
                IPV6,
            ]],
            &[],
            &[],
        ),
        case("outbound-ports-include", &[&["-q", "32000,31000"]], &[], &[]),
        case(
            "loopback-outbound-iprange",
            &[&UID_GID, &["-i", "127.1.2.3/32", "--redirect-dns"]],
            &[DNS],
            &[],
        ),
        case("basic-exclude-nic", &[&["-c", "not-istio-nic"]], &[], &[]),
        case("drop-invalid", &[&["--drop-invalid"]], &[], &[]),
        case(
            "host-ipv4-loopback-cidr",
            &[&["--host-ipv4-loopback-cidr", "127.0.0.1/8"]],
            &[],
            &[],
        ),
    ]
}

/// A golden is what Istio's dry-run dependencies saw: `iptables-save` and `ip6tables-save`
/// (state checks), the restore inputs, then `iptables-save` (and `ip6tables-save` with IPv6).
/// Returns the restore lines and whether IPv6 was enabled.
fn restore_lines(golden: &str) -> (Vec<&str>, bool) {
    let lines: Vec<&str> = golden.lines().collect();
    let ipv6 = lines.last() == Some(&"ip6tables-save");
    let restore = lines
        .into_iter()
        .filter(|l| !matches!(*l, "iptables-save" | "ip6tables-save"))
        .collect();
    (restore, ipv6)
}

#[test]
fn rules_match_istio_goldens_line_for_line() {
    assert!(
        Path::new(GOLDEN_DIR).is_dir(),
        "Istio's iptables goldens are missing: {GOLDEN_DIR} is not a directory \
         (the tests read the shared corpus in ../shared)"
    );
    let mut covered = BTreeSet::new();
    for Case { name, flags, dns } in cases() {
        let golden = std::fs::read_to_string(format!("{GOLDEN_DIR}/{name}.golden")).unwrap();
        let (want, want_ipv6) = restore_lines(&golden);
        let cfg = config_with(&flags, dns).unwrap();
        assert_eq!(cfg.enable_ipv6, want_ipv6, "golden {name}: IPv6 flag");
        let set = rules::build(&cfg);
        let ours = set.restore_v4() + &set.restore_v6().unwrap_or_default();
        let got: Vec<&str> = ours.lines().collect();
        assert_eq!(got, want, "golden {name}: flags {flags:?}\nours:\n{ours}");
        covered.insert(name);
    }
    // Every golden is compared.
    for entry in std::fs::read_dir(GOLDEN_DIR).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        let name = file.trim_end_matches(".golden");
        assert!(covered.contains(name), "golden {name} is not compared");
    }
    assert_eq!(covered.len(), 27);
}
