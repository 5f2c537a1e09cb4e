//! Istio's DNS capture (`SetupDNSRedir`): TCP and UDP port 53 to the agent's DNS proxy on 15053
//! (nat `ISTIO_OUTPUT_DNS`), and the raw-table conntrack zones that keep the app's and the
//! agent's UDP DNS flows apart (`addDNSConntrackZones`).

use super::builder::RuleBuilder;
use super::config::Config;
use super::rules::{ISTIO_INBOUND, ISTIO_OUTPUT, ISTIO_OUTPUT_DNS, NAT, RAW};

/// The agent's DNS proxy port.
pub(crate) const DNS_LISTENER_PORT: u16 = 15053;

/// Whether DNS is captured at all: requested, and there is something to capture.
pub(crate) fn redirect_dns(cfg: &Config) -> bool {
    let servers = &cfg.dns_servers;
    cfg.redirect_dns && (cfg.capture_all_dns || !servers.v4.is_empty() || !servers.v6.is_empty())
}

pub(crate) fn setup_dns_redir(cfg: &Config, b: &mut RuleBuilder) {
    let servers = &cfg.dns_servers;
    let all = cfg.capture_all_dns;
    // Conntrack zones need a jump in raw OUTPUT.
    b.append(RAW, "OUTPUT", &format!("-j {ISTIO_OUTPUT_DNS}"));
    // Only families with something to capture jump to the nat DNS chain.
    if all || !servers.v4.is_empty() {
        b.append_v4(NAT, ISTIO_OUTPUT, &format!("-j {ISTIO_OUTPUT_DNS}"));
    }
    if all || !servers.v6.is_empty() {
        b.append_v6(NAT, ISTIO_OUTPUT, &format!("-j {ISTIO_OUTPUT_DNS}"));
    }

    let to = DNS_LISTENER_PORT;
    if all {
        b.append(
            NAT,
            ISTIO_OUTPUT_DNS,
            &format!("-p tcp --dport 53 -j REDIRECT --to-ports {to}"),
        );
    } else {
        // Only the resolv.conf servers: a local DNS proxy (dnsmasq) upstream would loop otherwise.
        for s in &servers.v4 {
            b.append_v4(
                NAT,
                ISTIO_OUTPUT_DNS,
                &format!("-p tcp --dport 53 -d {s}/32 -j REDIRECT --to-ports {to}"),
            );
        }
        for s in &servers.v6 {
            b.append_v6(
                NAT,
                ISTIO_OUTPUT_DNS,
                &format!("-p tcp --dport 53 -d {s}/128 -j REDIRECT --to-ports {to}"),
            );
        }
    }
    if all {
        b.append(
            NAT,
            ISTIO_OUTPUT_DNS,
            &format!("-p udp --dport 53 -j REDIRECT --to-port {to}"),
        );
    } else {
        for s in &servers.v4 {
            b.append_v4(
                NAT,
                ISTIO_OUTPUT_DNS,
                &format!("-p udp --dport 53 -d {s}/32 -j REDIRECT --to-port {to}"),
            );
        }
        for s in &servers.v6 {
            b.append_v6(
                NAT,
                ISTIO_OUTPUT_DNS,
                &format!("-p udp --dport 53 -d {s}/128 -j REDIRECT --to-port {to}"),
            );
        }
    }
    add_dns_conntrack_zones(cfg, b);
}

/// Zone 1: the agent and the upstream resolvers; zone 2: the apps and the agent.
fn add_dns_conntrack_zones(cfg: &Config, b: &mut RuleBuilder) {
    let to = DNS_LISTENER_PORT;
    for (matcher, owners) in [("--uid-owner", &cfg.proxy_uids), ("--gid-owner", &cfg.proxy_gids)] {
        for id in owners {
            b.append(
                RAW,
                ISTIO_OUTPUT_DNS,
                &format!("-p udp --dport 53 -m owner {matcher} {id} -j CT --zone 1"),
            );
            b.append(
                RAW,
                ISTIO_OUTPUT_DNS,
                &format!("-p udp --sport {to} -m owner {matcher} {id} -j CT --zone 2"),
            );
        }
    }
    let servers = &cfg.dns_servers;
    if cfg.capture_all_dns {
        b.append(RAW, "PREROUTING", &format!("-j {ISTIO_INBOUND}"));
        b.append(RAW, ISTIO_OUTPUT_DNS, "-p udp --dport 53 -j CT --zone 2");
        b.append(RAW, ISTIO_INBOUND, "-p udp --sport 53 -j CT --zone 1");
        return;
    }
    if !servers.v4.is_empty() {
        b.append_v4(RAW, "PREROUTING", &format!("-j {ISTIO_INBOUND}"));
    }
    for s in &servers.v4 {
        b.append_v4(
            RAW,
            ISTIO_OUTPUT_DNS,
            &format!("-p udp --dport 53 -d {s}/32 -j CT --zone 2"),
        );
        b.append_v4(
            RAW,
            ISTIO_INBOUND,
            &format!("-p udp --sport 53 -s {s}/32 -j CT --zone 1"),
        );
    }
    if !servers.v6.is_empty() {
        b.append_v6(RAW, "PREROUTING", &format!("-j {ISTIO_INBOUND}"));
    }
    for s in &servers.v6 {
        b.append_v6(
            RAW,
            ISTIO_OUTPUT_DNS,
            &format!("-p udp --dport 53 -d {s}/128 -j CT --zone 2"),
        );
        b.append_v6(
            RAW,
            ISTIO_INBOUND,
            &format!("-p udp --sport 53 -s {s}/128 -j CT --zone 1"),
        );
    }
}
