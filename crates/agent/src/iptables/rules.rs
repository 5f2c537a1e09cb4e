//! Istio's sidecar capture rules, built from a `Config` in the order Istio's
//! `IptablesConfigurator.Run` adds them: interface short-circuits, the nat REDIRECT chains,
//! inbound capture (nat REDIRECT or mangle TPROXY), the ISTIO_OUTPUT chain, DNS capture and the
//! TPROXY marks. IPv6 rules are built beside the IPv4 ones when `enable_ipv6` is set.

use super::builder::{Family, RuleBuilder, RuleSet};
use super::config::{Config, NetworkRange};
use super::{dns, tproxy};

pub(crate) const NAT: &str = "nat";
pub(crate) const MANGLE: &str = "mangle";
pub(crate) const RAW: &str = "raw";

pub const ISTIO_INBOUND: &str = "ISTIO_INBOUND";
pub const ISTIO_REDIRECT: &str = "ISTIO_REDIRECT";
pub const ISTIO_IN_REDIRECT: &str = "ISTIO_IN_REDIRECT";
pub const ISTIO_OUTPUT: &str = "ISTIO_OUTPUT";
pub const ISTIO_OUTPUT_DNS: &str = "ISTIO_OUTPUT_DNS";
pub(crate) const ISTIO_DROP: &str = "ISTIO_DROP";
pub(crate) const ISTIO_DIVERT: &str = "ISTIO_DIVERT";
pub(crate) const ISTIO_TPROXY: &str = "ISTIO_TPROXY";

/// The IPv6 loopback, used where IPv4 rules use `--host-ipv4-loopback-cidr`.
pub(crate) const IPV6_LOOPBACK: &str = "::1/128";
/// Source address of the inbound passthrough cluster's connections, per family.
pub(crate) const INBOUND_PASSTHROUGH_V4: &str = "127.0.0.6/32";
pub(crate) const INBOUND_PASSTHROUGH_V6: &str = "::6/128";

/// Builds the rules as Istio does.
pub fn build(cfg: &Config) -> RuleSet {
    let mut b = RuleBuilder::new(cfg.enable_ipv6);
    let dns = dns::redirect_dns(cfg);
    let lo4 = cfg.host_ipv4_loopback_cidr.to_string();
    let include = &cfg.outbound_ip_ranges_include;
    let tunnel = cfg.inbound_tunnel_port;

    for nic in &cfg.exclude_interfaces {
        b.append(NAT, "PREROUTING", &format!("-i {nic} -j RETURN"));
        b.append(NAT, "OUTPUT", &format!("-o {nic} -j RETURN"));
    }
    if cfg.tproxy() {
        for nic in &cfg.exclude_interfaces {
            b.append(MANGLE, "PREROUTING", &format!("-i {nic} -j RETURN"));
            b.append(MANGLE, "OUTPUT", &format!("-o {nic} -j RETURN"));
        }
    }
    // Do not capture the internal (virtual) interfaces as inbound.
    for nic in &cfg.kube_virt_interfaces {
        b.insert(NAT, "PREROUTING", 1, &format!("-i {nic} -j RETURN"));
    }
    if cfg.drop_invalid {
        // Out-of-window packets are dropped instead of resetting the connection.
        b.append(
            MANGLE,
            "PREROUTING",
            &format!("-m conntrack --ctstate INVALID -j {ISTIO_DROP}"),
        );
        b.append(MANGLE, ISTIO_DROP, "-j DROP");
    }

    b.append(NAT, ISTIO_INBOUND, &format!("-p tcp --dport {tunnel} -j RETURN"));
    b.append(
        NAT,
        ISTIO_REDIRECT,
        &format!("-p tcp -j REDIRECT --to-ports {}", cfg.proxy_port),
    );
    b.append(
        NAT,
        ISTIO_IN_REDIRECT,
        &format!("-p tcp -j REDIRECT --to-ports {}", cfg.inbound_capture_port),
    );
    inbound(cfg, &mut b);

    b.append(NAT, "OUTPUT", &format!("-j {ISTIO_OUTPUT}"));
    for p in &cfg.outbound_ports_exclude {
        b.append(NAT, ISTIO_OUTPUT, &format!("-p tcp --dport {p} -j RETURN"));
        b.append(NAT, ISTIO_OUTPUT, &format!("-p udp --dport {p} -j RETURN"));
    }
    b.append_versioned(
        INBOUND_PASSTHROUGH_V4,
        INBOUND_PASSTHROUGH_V6,
        NAT,
        ISTIO_OUTPUT,
        |src| format!("-o lo -s {src} -j RETURN"),
    );

    let keep_local_return = !include.v4.has_loopback() && !include.v6.has_loopback();
    let not_dns = if dns { "-p tcp ! --dport 53 " } else { "" };
    for (matcher, owners) in [("--uid-owner", &cfg.proxy_uids), ("--gid-owner", &cfg.proxy_gids)] {
        for id in owners {
            // App calls to itself through a service VIP go back through Envoy inbound; with DNS
            // capture the proxy's own DNS on lo is left to the agent.
            let ports = if dns && matcher == "--uid-owner" {
                format!("-m multiport ! --dports 53,{tunnel}")
            } else {
                format!("! --dport {tunnel}")
            };
            b.append_versioned(&lo4, IPV6_LOOPBACK, NAT, ISTIO_OUTPUT, |lo| {
                format!("-o lo ! -d {lo} -p tcp {ports} -m owner {matcher} {id} -j {ISTIO_IN_REDIRECT}")
            });
            // App to itself by endpoint address over lo is not captured.
            if keep_local_return {
                b.append(
                    NAT,
                    ISTIO_OUTPUT,
                    &format!("-o lo {not_dns}-m owner ! {matcher} {id} -j RETURN"),
                );
            }
            // Envoy's own traffic is never captured again.
            b.append(NAT, ISTIO_OUTPUT, &format!("-m owner {matcher} {id} -j RETURN"));
        }
    }

    owner_groups(cfg, &mut b);
    if dns {
        dns::setup_dns_redir(cfg, &mut b);
    }

    // Envoy-aware apps and container-to-container traffic use localhost.
    b.append_versioned(&lo4, IPV6_LOOPBACK, NAT, ISTIO_OUTPUT, |lo| {
        format!("-d {lo} -j RETURN")
    });
    for (family, range) in [
        (Family::V4, &cfg.outbound_ip_ranges_exclude.v4),
        (Family::V6, &cfg.outbound_ip_ranges_exclude.v6),
    ] {
        for c in &range.cidrs {
            b.append_to(family, NAT, ISTIO_OUTPUT, &format!("-d {c} -j RETURN"));
        }
    }
    for p in &cfg.outbound_ports_include {
        b.append(NAT, ISTIO_OUTPUT, &format!("-p tcp --dport {p} -j {ISTIO_REDIRECT}"));
    }
    outbound_include(cfg, Family::V4, &include.v4, &mut b);
    outbound_include(cfg, Family::V6, &include.v6, &mut b);

    if cfg.tproxy() {
        tproxy::marks(cfg, &mut b);
    }
    b.build()
}

/// Istio's `handleInboundPortsInclude`: nat `ISTIO_IN_REDIRECT` or mangle `ISTIO_TPROXY`.
fn inbound(cfg: &Config, b: &mut RuleBuilder) {
    let Some(include) = &cfg.inbound_ports_include else {
        return;
    };
    let table = if cfg.tproxy() {
        tproxy::divert_chains(cfg, b);
        MANGLE
    } else {
        NAT
    };
    b.append(table, "PREROUTING", &format!("-p tcp -j {ISTIO_INBOUND}"));
    let capture = |b: &mut RuleBuilder, dport: &str| {
        if cfg.tproxy() {
            tproxy::capture(b, dport);
        } else {
            b.append(NAT, ISTIO_INBOUND, &format!("-p tcp {dport}-j {ISTIO_IN_REDIRECT}"));
        }
    };
    if include.is_empty() {
        for p in &cfg.inbound_ports_exclude {
            b.append(table, ISTIO_INBOUND, &format!("-p tcp --dport {p} -j RETURN"));
        }
        capture(b, "");
    } else {
        for p in include {
            capture(b, &format!("--dport {p} "));
        }
    }
}

/// Istio's `handleCaptureByOwnerGroup`.
fn owner_groups(cfg: &Config, b: &mut RuleBuilder) {
    if !cfg.owner_groups_exclude.is_empty() {
        for g in &cfg.owner_groups_exclude {
            b.append(NAT, ISTIO_OUTPUT, &format!("-m owner --gid-owner {g} -j RETURN"));
        }
    } else if !cfg.owner_groups_include.iter().any(|g| g == "*") && !cfg.owner_groups_include.is_empty() {
        let none_of: Vec<String> = cfg
            .owner_groups_include
            .iter()
            .map(|g| format!("-m owner ! --gid-owner {g}"))
            .collect();
        b.append(NAT, ISTIO_OUTPUT, &format!("{} -j RETURN", none_of.join(" ")));
    }
}

/// Istio's `handleOutboundIncludeRules` for one family.
fn outbound_include(cfg: &Config, family: Family, include: &NetworkRange, b: &mut RuleBuilder) {
    if include.is_wildcard {
        b.append_to(family, NAT, ISTIO_OUTPUT, &format!("-j {ISTIO_REDIRECT}"));
        for nic in &cfg.kube_virt_interfaces {
            b.insert_to(family, NAT, "PREROUTING", 1, &format!("-i {nic} -j {ISTIO_REDIRECT}"));
        }
        return;
    }
    for c in &include.cidrs {
        for nic in &cfg.kube_virt_interfaces {
            b.insert_to(
                family,
                NAT,
                "PREROUTING",
                1,
                &format!("-i {nic} -d {c} -j {ISTIO_REDIRECT}"),
            );
        }
        b.append_to(family, NAT, ISTIO_OUTPUT, &format!("-d {c} -j {ISTIO_REDIRECT}"));
    }
}
