//! Real kernel: apply a capture in a fresh network namespace, re-apply, check `iptables-save`,
//! `ip6tables-save`, `ip rule` and `ip route`, then clean up twice. The tests fail, saying what is
//! missing, when not root, when `ip netns` or the iptables tools are missing, or (TPROXY) when the
//! kernel lacks TPROXY; `scripts/test.sh` detects that up front and skips them.

use std::process::{Command, Stdio};

use super::super::builder::Family;
use super::super::{Capture, Target, rules};
use super::{DNS, config};

/// Deletes the test's network namespace however the test ends.
struct NetnsGuard(String);

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn command_works(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Output of `ip netns exec <ns> <args>` (empty when the command fails).
fn in_ns(ns: &str, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Fails the test: this machine lacks `why`.
fn missing(why: &str) -> ! {
    panic!(
        "iptables::tests::kernel cannot run here: {why} (these tests need root, `ip netns`, iptables and \
         ip6tables, and TPROXY in the kernel; scripts/test.sh skips them on such machines)"
    )
}

/// A fresh namespace with lo up (as in a pod); fails the test when none can be made.
fn namespace(test: &str) -> (NetnsGuard, Target) {
    for tool in ["iptables-restore", "ip6tables-restore"] {
        if !command_works(tool, &["--version"]) {
            missing(&format!("{tool} is not installed"));
        }
    }
    let ns = format!("istio-ipt-{test}-{}", std::process::id());
    if !command_works("ip", &["netns", "add", &ns]) {
        missing("cannot create a network namespace (`ip netns add` failed; needs root)");
    }
    let guard = NetnsGuard(ns.clone());
    assert!(command_works(
        "ip",
        &["netns", "exec", &ns, "ip", "link", "set", "lo", "up"]
    ));
    let target = Target {
        iptables_version: String::new(),
        netns: Some(ns),
    };
    (guard, target)
}

#[test]
fn redirect_applies_and_cleans_up_in_a_network_namespace() {
    let (_guard, target) = namespace("redirect");
    let flags = [
        "-b",
        "*",
        "-d",
        "15090",
        "-i",
        "*",
        "-x",
        "10.0.0.0/8,fd00::/8",
        "-o",
        "3306",
        "-c",
        "nic0",
        "-k",
        "eth9",
        "--redirect-dns",
        "--drop-invalid",
        "--enable-inbound-ipv6",
    ];
    let capture = Capture::new(&config(&flags, &[DNS]).unwrap());
    target.apply(&capture.rules, &capture.routes).unwrap();
    // Applying again replaces the rules instead of failing on existing chains or duplicating rules.
    target.apply(&capture.rules, &capture.routes).unwrap();

    let nat = target.save(Family::V4, Some("nat")).unwrap();
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
    for once in [
        "-A OUTPUT -j ISTIO_OUTPUT",
        "-A PREROUTING -p tcp -j ISTIO_INBOUND",
        // Rules without a jump to an Istio chain are removed by the undo pass.
        "-A PREROUTING -i nic0 -j RETURN",
        "-A PREROUTING -i eth9 -j RETURN",
        "-A PREROUTING -i eth9 -j ISTIO_REDIRECT",
    ] {
        assert_eq!(nat.matches(&format!("{once}\n")).count(), 1, "{once}:\n{nat}");
    }
    assert!(nat.contains("-j REDIRECT --to-ports 15001"), "{nat}");
    assert!(nat.contains("-j REDIRECT --to-ports 15006"), "{nat}");
    assert!(nat.contains("--dport 15090 -j RETURN"), "{nat}");
    assert!(nat.contains("-A ISTIO_OUTPUT -d 10.0.0.0/8 -j RETURN"), "{nat}");
    assert!(nat.contains("--uid-owner 1337 -j RETURN"), "{nat}");
    assert!(target.save(Family::V4, Some("mangle")).unwrap().contains(":ISTIO_DROP"));
    let raw = target.save(Family::V4, Some("raw")).unwrap();
    assert!(
        raw.contains("-j CT --zone 1") && raw.contains("-A PREROUTING -j ISTIO_INBOUND"),
        "{raw}"
    );

    let nat6 = target.save(Family::V6, Some("nat")).unwrap();
    assert!(nat6.contains("-A ISTIO_OUTPUT -s ::6/128 -o lo -j RETURN"), "{nat6}");
    assert!(nat6.contains("-A ISTIO_OUTPUT -d fd00::/8 -j RETURN"), "{nat6}");
    assert!(!nat6.contains("10.0.0.0/8"), "{nat6}");
    assert_eq!(nat6.matches("-A OUTPUT -j ISTIO_OUTPUT\n").count(), 1, "{nat6}");
    let ns = target.netns.clone().unwrap();
    assert!(in_ns(&ns, &["ip", "-6", "addr", "show", "dev", "lo"]).contains("inet6 ::6/128"));

    target.cleanup(&capture.rules, &capture.routes).unwrap();
    for family in [Family::V4, Family::V6] {
        let after = target.save(family, None).unwrap();
        assert!(
            !after.contains("ISTIO_") && !after.contains("nic0") && !after.contains("eth9"),
            "left behind:\n{after}"
        );
    }
    target.cleanup(&capture.rules, &capture.routes).unwrap();
}

#[test]
fn tproxy_applies_and_cleans_up_in_a_network_namespace() {
    let (_guard, target) = namespace("tproxy");
    let ns = target.netns.clone().unwrap();
    let probe = "*mangle\n:ISTIO_PROBE - [0:0]\n-A ISTIO_PROBE -p tcp -j TPROXY --on-port 1 --tproxy-mark 1\nCOMMIT\n";
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns, "iptables-restore", "--test"])
        .stdin(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), probe.as_bytes()).unwrap();
    if !child.wait().unwrap().success() {
        missing("the kernel has no TPROXY target (iptables-restore --test rejects -j TPROXY)");
    }
    let flags = [
        "-m",
        "TPROXY",
        "-b",
        "*",
        "-d",
        "15090",
        "-i",
        "*",
        "-c",
        "nic0",
        "--enable-inbound-ipv6",
    ];
    let capture = Capture::new(&config(&flags, &[]).unwrap());
    target.apply(&capture.rules, &capture.routes).unwrap();
    target.apply(&capture.rules, &capture.routes).unwrap();

    for (family, lo) in [(Family::V4, "127.0.0.1/32"), (Family::V6, "::1/128")] {
        let mangle = target.save(family, Some("mangle")).unwrap();
        for chain in [rules::ISTIO_DIVERT, rules::ISTIO_TPROXY, rules::ISTIO_INBOUND] {
            assert!(
                mangle.contains(&format!(":{chain} - [0:0]")),
                "{chain} missing:\n{mangle}"
            );
        }
        assert!(
            mangle.contains(&format!("-A ISTIO_TPROXY ! -d {lo} -p tcp -j TPROXY --on-port 15006")),
            "{mangle}"
        );
        assert!(mangle.contains("--tproxy-mark 0x539/0xffffffff"), "{mangle}");
        for once in [
            "-A PREROUTING -p tcp -j ISTIO_INBOUND",
            "-A PREROUTING -i nic0 -j RETURN",
            "-j CONNMARK --save-mark",
            "-j CONNMARK --restore-mark",
            "--uid-owner 1337 -j MARK --set-xmark 0x53a/0xffffffff",
        ] {
            assert_eq!(mangle.matches(once).count(), 1, "{once}:\n{mangle}");
        }
        let inbound: Vec<&str> = mangle.lines().filter(|l| l.starts_with("-A ISTIO_INBOUND")).collect();
        assert_eq!(inbound.len(), 6, "{mangle}");
        assert!(inbound[0].contains("-m mark --mark 0x539 -j RETURN"), "{mangle}");
        assert!(inbound[5].ends_with("-j ISTIO_TPROXY"), "{mangle}");
        let v = if family == Family::V4 { "-4" } else { "-6" };
        let ip_rules = in_ns(&ns, &["ip", v, "rule", "show"]);
        assert_eq!(ip_rules.matches("fwmark 0x539 lookup 133").count(), 1, "{ip_rules}");
        let table = in_ns(&ns, &["ip", v, "route", "show", "table", "133"]);
        assert!(table.starts_with("local default dev lo"), "{table}");
    }

    target.cleanup(&capture.rules, &capture.routes).unwrap();
    target.cleanup(&capture.rules, &capture.routes).unwrap();
    for (family, v) in [(Family::V4, "-4"), (Family::V6, "-6")] {
        let after = target.save(family, None).unwrap();
        for gone in ["ISTIO_", "nic0", "MARK", "TPROXY"] {
            assert!(!after.contains(gone), "{gone} left behind:\n{after}");
        }
        assert!(!in_ns(&ns, &["ip", v, "rule", "show"]).contains("fwmark"));
        assert_eq!(in_ns(&ns, &["ip", v, "route", "show", "table", "133"]).trim(), "");
    }
}
