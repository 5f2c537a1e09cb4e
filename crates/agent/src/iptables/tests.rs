//! Tests: flag parsing and errors, cleanup plans, and the nat rules compared with Istio's goldens
//! (tools/istio-iptables/pkg/capture/testdata) case by case, with the flags of Istio's run_test.go.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::Path;

use clap::Parser;

use super::config::{Config, ConfigError, IptablesArgs, resolv_conf_servers_v4};
use super::{cleanup_plan, rules};

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    args: IptablesArgs,
}

fn args(flags: &[&str]) -> IptablesArgs {
    let mut argv = vec!["istio-iptables"];
    argv.extend_from_slice(flags);
    Cli::try_parse_from(argv).unwrap().args
}

fn config(flags: &[&str], dns: &[Ipv4Addr]) -> Result<Config, ConfigError> {
    Config::from_args(&args(flags), dns.to_vec())
}

const GOLDEN_DIR: &str = "/work/shared/corpus/istio/tools/istio-iptables/pkg/capture/testdata";
const DNS: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 53);
const UID_GID: [&str; 4] = ["-u", "3,4", "-g", "1,2"];

/// Istio's run_test.go cases that REDIRECT mode covers; our flags and DNS servers for each.
fn cases() -> Vec<(&'static str, Vec<&'static str>, Vec<Ipv4Addr>)> {
    let with = |extra: &[&'static str], base: &[&'static str]| [base, extra].concat();
    vec![
        ("empty", vec![], vec![]),
        ("ipnets", vec!["-i", "10.0.0.0/8"], vec![]),
        (
            "ip-range",
            with(&["-x", "1.1.0.0/16", "-i", "9.9.0.0/16", "--redirect-dns"], &UID_GID),
            vec![DNS],
        ),
        ("inbound-ports-include", vec!["-b", "32000,31000"], vec![]),
        ("inbound-ports-wildcard", vec!["-b", "*"], vec![]),
        ("kube-virt-interfaces", vec!["-k", "eth1,eth2", "-i", "*"], vec![]),
        (
            "ipnets-with-kube-virt-interfaces",
            vec!["-k", "eth1,eth2", "-i", "10.0.0.0/8"],
            vec![],
        ),
        ("dns-uid-gid", with(&["--redirect-dns"], &UID_GID), vec![DNS]),
        ("ipv6-dns-uid-gid", with(&["--redirect-dns"], &UID_GID), vec![]),
        ("ipv6-empty-inbound-ports", vec!["-b", ""], vec![]),
        ("ipv6-inbound-ports", vec!["-b", "4000,5000"], vec![]),
        (
            "ipv6-virt-interfaces",
            vec!["-b", "4000,5000", "-k", "eth0,eth1"],
            vec![],
        ),
        (
            "ipv6-ipnets",
            vec![
                "-b",
                "4000,5000",
                "-d",
                "6000,7000,",
                "-k",
                "eth0,eth1",
                "-x",
                "2001:db8::/32",
                "-i",
                "2001:db8::/32",
            ],
            vec![],
        ),
        (
            "ipv6-uid-gid",
            with(
                &[
                    "-b",
                    "4000,5000",
                    "-d",
                    "6000,7000",
                    "-k",
                    "eth0,eth1",
                    "-x",
                    "2001:db8::/32",
                    "-i",
                    "2001:db8::/32",
                ],
                &UID_GID,
            ),
            vec![],
        ),
        ("ipv6-outbound-ports", vec!["-q", "32000,31000"], vec![]),
        (
            "outbound-owner-groups",
            vec!["--capture-outbound-owner-groups", "java,202"],
            vec![],
        ),
        (
            "outbound-owner-groups-exclude",
            vec!["--capture-outbound-owner-groups-exclude", "888,ftp"],
            vec![],
        ),
        (
            "ipv6-dns-outbound-owner-groups",
            vec!["--redirect-dns", "--capture-outbound-owner-groups", "java,202"],
            vec![],
        ),
        (
            "ipv6-dns-outbound-owner-groups-exclude",
            vec!["--redirect-dns", "--capture-outbound-owner-groups-exclude", "888,ftp"],
            vec![],
        ),
        ("outbound-ports-include", vec!["-q", "32000,31000"], vec![]),
        (
            "loopback-outbound-iprange",
            with(&["-i", "127.1.2.3/32", "--redirect-dns"], &UID_GID),
            vec![DNS],
        ),
        ("basic-exclude-nic", vec!["-c", "not-istio-nic"], vec![]),
        ("drop-invalid", vec!["--drop-invalid"], vec![]),
        (
            "host-ipv4-loopback-cidr",
            vec!["--host-ipv4-loopback-cidr", "127.0.0.1/8"],
            vec![],
        ),
    ]
}

/// Goldens not compared, and why.
const SKIPPED: [&str; 3] = ["tproxy", "inbound-ports-tproxy", "inbound-ports-wildcard-tproxy"];

/// The first `* <table>` section (iptables, not ip6tables) of a golden or of our output.
fn section<'a>(text: &'a str, table: &str) -> Vec<&'a str> {
    let header = format!("* {table}");
    text.lines()
        .skip_while(|l| l.trim() != header)
        .skip(1)
        .take_while(|l| l.trim() != "COMMIT")
        .map(str::trim)
        .collect()
}

/// Chains created, and each chain's `-A`/`-I` lines in order.
fn semantic(lines: &[&str]) -> (BTreeSet<String>, BTreeMap<String, Vec<String>>) {
    let mut created = BTreeSet::new();
    let mut per_chain: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in lines {
        let mut words = l.split_whitespace();
        match (words.next(), words.next()) {
            (Some("-N"), Some(c)) => {
                created.insert(c.to_string());
            }
            (Some("-A" | "-I"), Some(c)) => per_chain.entry(c.to_string()).or_default().push(l.to_string()),
            _ => panic!("unexpected line {l:?}"),
        }
    }
    (created, per_chain)
}

#[test]
fn nat_rules_match_istio_goldens() {
    if !Path::new(GOLDEN_DIR).is_dir() {
        eprintln!("skipping: {GOLDEN_DIR} not present");
        return;
    }
    let mut covered = BTreeSet::new();
    for (name, flags, dns) in cases() {
        let golden = std::fs::read_to_string(format!("{GOLDEN_DIR}/{name}.golden")).unwrap();
        let ours = rules::build(&config(&flags, &dns).unwrap()).to_restore();
        for table in ["nat", "mangle"] {
            let want = semantic(&section(&golden, table));
            let got = semantic(&section(&ours, table));
            assert_eq!(got, want, "golden {name} table {table}: flags {flags:?}\nours:\n{ours}");
        }
        covered.insert(name);
    }
    // Every golden is either compared or knowingly skipped.
    for entry in std::fs::read_dir(GOLDEN_DIR).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        let name = file.trim_end_matches(".golden");
        assert!(
            covered.contains(name) || SKIPPED.contains(&name),
            "golden {name} neither covered nor skipped"
        );
    }
}

#[test]
fn restore_output_is_iptables_restore_input() {
    let out =
        rules::build(&config(&["-b", "*", "-d", "22", "-o", "3306", "-x", "10.1.0.0/16"], &[]).unwrap()).to_restore();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"* nat"));
    assert_eq!(lines.last(), Some(&"COMMIT"));
    assert!(lines.contains(&"-A ISTIO_INBOUND -p tcp --dport 22 -j RETURN"));
    assert!(lines.contains(&"-A ISTIO_OUTPUT -p tcp --dport 3306 -j RETURN"));
    assert!(lines.contains(&"-A ISTIO_OUTPUT -d 10.1.0.0/16 -j RETURN"));
    // Inbound exclusions come before the catch-all redirect.
    let pos = |l: &str| lines.iter().position(|x| *x == l).unwrap();
    assert!(pos("-A ISTIO_INBOUND -p tcp --dport 22 -j RETURN") < pos("-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT"));
    // Custom ports and uid.
    let custom = rules::build(&config(&["-p", "16001", "-z", "16006", "-u", "1000"], &[]).unwrap()).to_restore();
    assert!(custom.contains("-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 16001\n"));
    assert!(custom.contains("-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 16006\n"));
    assert!(custom.contains("-A ISTIO_OUTPUT -m owner --uid-owner 1000 -j RETURN\n"));
}

#[test]
fn bad_flags_name_the_flag() {
    let err = config(&["-i", "10.0.0.0/33"], &[]).unwrap_err();
    assert!(
        matches!(err, ConfigError::Cidr { flag, .. } if flag.contains("-i")),
        "{err}"
    );
    assert!(err.to_string().contains("10.0.0.0/33"));
    let err = config(&["-x", "not-an-ip"], &[]).unwrap_err();
    assert!(err.to_string().contains("--istio-service-exclude-cidr"), "{err}");
    assert_eq!(
        config(&["-x", "*"], &[]).unwrap_err(),
        ConfigError::Wildcard {
            flag: "--istio-service-exclude-cidr (-x)"
        }
    );
    let err = config(&["-b", "80,http"], &[]).unwrap_err();
    assert!(
        err.to_string().contains("--istio-inbound-ports (-b)") && err.to_string().contains("http"),
        "{err}"
    );
    for (flag, value, name) in [
        ("-o", "70000", "(-o)"),
        ("-p", "0", "(-p)"),
        ("-z", "x", "(-z)"),
        ("-d", "1x", "(-d)"),
    ] {
        let err = config(&[flag, value], &[]).unwrap_err();
        assert!(err.to_string().contains(name), "{flag}: {err}");
    }
    assert!(matches!(config(&["-m", "TPROXY"], &[]).unwrap_err(), ConfigError::Mode(m) if m == "TPROXY"));
    assert!(matches!(
        config(&["--iptables-version", "v9"], &[]).unwrap_err(),
        ConfigError::Version(_)
    ));
    assert!(
        config(&["-k", "eth0;rm"], &[])
            .unwrap_err()
            .to_string()
            .contains("(-k)")
    );
}

#[test]
fn flags_parse_as_istio() {
    let a = args(&["--dry-run"]);
    assert!(a.dry_run);
    assert!(!args(&["--dry-run=false"]).dry_run);
    assert!(!args(&[]).dry_run);
    let c = config(
        &[
            "-b",
            "*",
            "-d",
            "15020,15021,",
            "-i",
            "10.0.0.0/8,fd00::/8",
            "-u",
            "0,1337",
        ],
        &[],
    )
    .unwrap();
    assert_eq!(c.inbound_ports_include, Some(vec![]));
    assert_eq!(c.inbound_ports_exclude, vec![15020, 15021]);
    assert_eq!(
        c.outbound_ip_ranges_include.cidrs.len(),
        1,
        "IPv6 ranges are left to ip6tables"
    );
    assert_eq!(c.proxy_uids, vec!["0", "1337"]);
    assert_eq!(
        (c.proxy_port, c.inbound_capture_port, c.inbound_tunnel_port),
        (15001, 15006, 15008)
    );
    assert_eq!(config(&["-b", ""], &[]).unwrap().inbound_ports_include, None);
    // The CLI itself rejects unknown flags with exit 2 (clap's usage error).
    let err = Cli::try_parse_from(["istio-iptables", "--no-such-flag"]).unwrap_err();
    assert_eq!(err.exit_code(), 2);
}

#[test]
fn resolv_conf_nameservers() {
    let text = "# comment\nnameserver 10.96.0.10\nnameserver fd00::10\nsearch default.svc.cluster.local\n";
    assert_eq!(resolv_conf_servers_v4(text), vec![Ipv4Addr::new(10, 96, 0, 10)]);
}

#[test]
fn cleanup_deletes_jumps_and_chains_only() {
    let saved = "# Generated by iptables-save\n*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
        :ISTIO_INBOUND - [0:0]\n:ISTIO_OUTPUT - [0:0]\n:OTHER - [0:0]\n\
        -A PREROUTING -p tcp -j ISTIO_INBOUND\n-A PREROUTING -p udp -j OTHER\n-A OUTPUT -j ISTIO_OUTPUT\n\
        -A ISTIO_OUTPUT -j ISTIO_REDIRECT\nCOMMIT\n*mangle\n:PREROUTING ACCEPT [0:0]\n:ISTIO_DROP - [0:0]\n\
        -A PREROUTING -m conntrack --ctstate INVALID -j ISTIO_DROP\n-A ISTIO_DROP -j DROP\nCOMMIT\n";
    let plan = cleanup_plan(saved);
    assert_eq!(
        plan,
        "* nat\n-D PREROUTING -p tcp -j ISTIO_INBOUND\n-D OUTPUT -j ISTIO_OUTPUT\n-F ISTIO_INBOUND\n-F ISTIO_OUTPUT\n\
         -X ISTIO_INBOUND\n-X ISTIO_OUTPUT\nCOMMIT\n* mangle\n-D PREROUTING -m conntrack --ctstate INVALID -j ISTIO_DROP\n\
         -F ISTIO_DROP\n-X ISTIO_DROP\nCOMMIT\n"
    );
    // Nothing of Istio's left: nothing to do (cleanup is idempotent).
    assert_eq!(
        cleanup_plan("*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -p udp -j OTHER\nCOMMIT\n"),
        ""
    );
}

/// Deletes the test's network namespace however the test ends.
struct NetnsGuard(String);

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .status();
    }
}

fn command_works(cmd: &str, args: &[&str]) -> bool {
    std::process::Command::new(cmd)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Real kernel: apply in a fresh network namespace, re-apply, then clean up twice.
#[test]
fn applies_and_cleans_up_in_a_network_namespace() {
    if !command_works("iptables-restore", &["--version"]) {
        eprintln!("skipping: iptables-restore not installed");
        return;
    }
    let ns = format!("istio-ipt-test-{}", std::process::id());
    if !command_works("ip", &["netns", "add", &ns]) {
        eprintln!("skipping: cannot create a network namespace (needs root)");
        return;
    }
    let _guard = NetnsGuard(ns.clone());
    let target = super::Target {
        iptables_version: String::new(),
        netns: Some(ns),
    };
    let flags = [
        "-b",
        "*",
        "-d",
        "15090",
        "-i",
        "*",
        "-x",
        "10.0.0.0/8",
        "-o",
        "3306",
        "--redirect-dns",
        "--drop-invalid",
    ];
    let cfg = config(&flags, &[DNS]).unwrap();
    let rule_set = rules::build(&cfg);
    target.apply(&rule_set).unwrap();
    // Applying again replaces the rules instead of failing on existing chains or duplicating jumps.
    target.apply(&rule_set).unwrap();

    let nat = target.save(Some("nat")).unwrap();
    for chain in [
        rules::ISTIO_INBOUND,
        rules::ISTIO_REDIRECT,
        rules::ISTIO_IN_REDIRECT,
        rules::ISTIO_OUTPUT,
        rules::ISTIO_OUTPUT_DNS,
    ] {
        assert!(
            nat.contains(&format!(":{chain} - [0:0]")),
            "chain {chain} missing:\n{nat}"
        );
    }
    assert_eq!(nat.matches("-A OUTPUT -j ISTIO_OUTPUT").count(), 1, "{nat}");
    assert_eq!(nat.matches("-A PREROUTING -p tcp -j ISTIO_INBOUND").count(), 1, "{nat}");
    assert!(nat.contains("-j REDIRECT --to-ports 15001"), "{nat}");
    assert!(nat.contains("-j REDIRECT --to-ports 15006"), "{nat}");
    assert!(nat.contains("--dport 15090 -j RETURN"), "{nat}");
    assert!(nat.contains("-A ISTIO_OUTPUT -d 10.0.0.0/8 -j RETURN"), "{nat}");
    assert!(nat.contains("--uid-owner 1337 -j RETURN"), "{nat}");
    assert!(target.save(Some("mangle")).unwrap().contains(":ISTIO_DROP"));

    target.cleanup().unwrap();
    let after = target.save(None).unwrap();
    assert!(!after.contains("ISTIO_"), "left behind:\n{after}");
    target.cleanup().unwrap();
}
