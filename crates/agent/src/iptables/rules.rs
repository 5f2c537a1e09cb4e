//! Istio's sidecar capture rules (IPv4), built from a `Config` in the order Istio's
//! `IptablesConfigurator.Run` emits them and rendered as `iptables-restore` input.

use super::config::{Config, NetworkRange};

pub const ISTIO_INBOUND: &str = "ISTIO_INBOUND";
pub const ISTIO_REDIRECT: &str = "ISTIO_REDIRECT";
pub const ISTIO_IN_REDIRECT: &str = "ISTIO_IN_REDIRECT";
pub const ISTIO_OUTPUT: &str = "ISTIO_OUTPUT";
pub const ISTIO_OUTPUT_DNS: &str = "ISTIO_OUTPUT_DNS";
pub const ISTIO_DROP: &str = "ISTIO_DROP";
/// The agent's DNS proxy port.
pub const DNS_LISTENER_PORT: u16 = 15053;

/// One table's chains to create and rule lines (`-A ...`, `-I ...`) in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    pub name: &'static str,
    pub chains: Vec<&'static str>,
    pub rules: Vec<String>,
}

impl Table {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            chains: Vec::new(),
            rules: Vec::new(),
        }
    }

    fn append(&mut self, chain: &str, params: &str) {
        self.rules.push(format!("-A {chain} {params}"));
    }

    fn insert(&mut self, chain: &str, position: u32, params: &str) {
        self.rules.push(format!("-I {chain} {position} {params}"));
    }
}

/// The IPv4 rule set: a mangle table only for `--drop-invalid`, then the nat table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSet {
    pub tables: Vec<Table>,
}

impl RuleSet {
    /// `iptables-restore` input, tables in order, each ending in `COMMIT`.
    pub fn to_restore(&self) -> String {
        let mut out = String::new();
        for t in &self.tables {
            out.push_str(&format!("* {}\n", t.name));
            for c in &t.chains {
                out.push_str(&format!("-N {c}\n"));
            }
            for r in &t.rules {
                out.push_str(r);
                out.push('\n');
            }
            out.push_str("COMMIT\n");
        }
        out
    }

    pub fn table(&self, name: &str) -> Option<&Table> {
        self.tables.iter().find(|t| t.name == name)
    }
}

/// Whether DNS is captured for IPv4: requested, and there is something to capture.
fn redirect_dns(cfg: &Config) -> bool {
    cfg.redirect_dns && (cfg.capture_all_dns || !cfg.dns_servers_v4.is_empty())
}

/// Builds the rules as Istio does (REDIRECT mode, IPv4).
pub fn build(cfg: &Config) -> RuleSet {
    let dns = redirect_dns(cfg);
    let lo = cfg.host_ipv4_loopback_cidr.to_string();
    let include = &cfg.outbound_ip_ranges_include;
    let mut nat = Table::new("nat");
    nat.chains = vec![ISTIO_INBOUND, ISTIO_REDIRECT, ISTIO_IN_REDIRECT, ISTIO_OUTPUT];
    if dns {
        nat.chains.push(ISTIO_OUTPUT_DNS);
    }

    for nic in &cfg.exclude_interfaces {
        nat.append("PREROUTING", &format!("-i {nic} -j RETURN"));
        nat.append("OUTPUT", &format!("-o {nic} -j RETURN"));
    }
    // Do not capture the internal (virtual) interfaces as inbound.
    for nic in &cfg.kube_virt_interfaces {
        nat.insert("PREROUTING", 1, &format!("-i {nic} -j RETURN"));
    }

    let tunnel = cfg.inbound_tunnel_port;
    nat.append(ISTIO_INBOUND, &format!("-p tcp --dport {tunnel} -j RETURN"));
    nat.append(
        ISTIO_REDIRECT,
        &format!("-p tcp -j REDIRECT --to-ports {}", cfg.proxy_port),
    );
    nat.append(
        ISTIO_IN_REDIRECT,
        &format!("-p tcp -j REDIRECT --to-ports {}", cfg.inbound_capture_port),
    );

    inbound(cfg, &mut nat);

    nat.append("OUTPUT", &format!("-j {ISTIO_OUTPUT}"));
    for p in &cfg.outbound_ports_exclude {
        nat.append(ISTIO_OUTPUT, &format!("-p tcp --dport {p} -j RETURN"));
    }
    // 127.0.0.6 is the source of the inbound passthrough cluster's connections.
    nat.append(ISTIO_OUTPUT, "-o lo -s 127.0.0.6/32 -j RETURN");

    let keep_local_return = !include.has_loopback();
    let not_dns = if dns { "-p tcp ! --dport 53 " } else { "" };
    for (matcher, owners) in [("--uid-owner", &cfg.proxy_uids), ("--gid-owner", &cfg.proxy_gids)] {
        for id in owners {
            // App calls to itself through a service VIP go back through Envoy inbound.
            let ports = if dns && matcher == "--uid-owner" {
                format!("-m multiport ! --dports 53,{tunnel}")
            } else {
                format!("! --dport {tunnel}")
            };
            nat.append(
                ISTIO_OUTPUT,
                &format!("-o lo ! -d {lo} -p tcp {ports} -m owner {matcher} {id} -j {ISTIO_IN_REDIRECT}"),
            );
            // App to itself by endpoint address over lo is not captured.
            if keep_local_return {
                nat.append(
                    ISTIO_OUTPUT,
                    &format!("-o lo {not_dns}-m owner ! {matcher} {id} -j RETURN"),
                );
            }
            // Envoy's own traffic is never captured again.
            nat.append(ISTIO_OUTPUT, &format!("-m owner {matcher} {id} -j RETURN"));
        }
    }

    owner_groups(cfg, &mut nat);
    if dns {
        dns_rules(cfg, &mut nat);
    }

    // Envoy-aware apps and container-to-container traffic use localhost.
    nat.append(ISTIO_OUTPUT, &format!("-d {lo} -j RETURN"));
    for c in &cfg.outbound_ip_ranges_exclude.cidrs {
        nat.append(ISTIO_OUTPUT, &format!("-d {c} -j RETURN"));
    }
    for p in &cfg.outbound_ports_include {
        nat.append(ISTIO_OUTPUT, &format!("-p tcp --dport {p} -j {ISTIO_REDIRECT}"));
    }
    outbound_include(cfg, include, &mut nat);

    let mut tables = Vec::new();
    if cfg.drop_invalid {
        // Out-of-window packets are dropped instead of resetting the connection.
        let mut mangle = Table::new("mangle");
        mangle.chains.push(ISTIO_DROP);
        mangle.append("PREROUTING", &format!("-m conntrack --ctstate INVALID -j {ISTIO_DROP}"));
        mangle.append(ISTIO_DROP, "-j DROP");
        tables.push(mangle);
    }
    tables.push(nat);
    RuleSet { tables }
}

fn inbound(cfg: &Config, nat: &mut Table) {
    let Some(include) = &cfg.inbound_ports_include else {
        return;
    };
    nat.append("PREROUTING", &format!("-p tcp -j {ISTIO_INBOUND}"));
    if include.is_empty() {
        for p in &cfg.inbound_ports_exclude {
            nat.append(ISTIO_INBOUND, &format!("-p tcp --dport {p} -j RETURN"));
        }
        nat.append(ISTIO_INBOUND, &format!("-p tcp -j {ISTIO_IN_REDIRECT}"));
    } else {
        for p in include {
            nat.append(ISTIO_INBOUND, &format!("-p tcp --dport {p} -j {ISTIO_IN_REDIRECT}"));
        }
    }
}

fn owner_groups(cfg: &Config, nat: &mut Table) {
    if !cfg.owner_groups_exclude.is_empty() {
        for g in &cfg.owner_groups_exclude {
            nat.append(ISTIO_OUTPUT, &format!("-m owner --gid-owner {g} -j RETURN"));
        }
    } else if !cfg.owner_groups_include.iter().any(|g| g == "*") && !cfg.owner_groups_include.is_empty() {
        let none_of: Vec<String> = cfg
            .owner_groups_include
            .iter()
            .map(|g| format!("-m owner ! --gid-owner {g}"))
            .collect();
        nat.append(ISTIO_OUTPUT, &format!("{} -j RETURN", none_of.join(" ")));
    }
}

fn dns_rules(cfg: &Config, nat: &mut Table) {
    nat.append(ISTIO_OUTPUT, &format!("-j {ISTIO_OUTPUT_DNS}"));
    if cfg.capture_all_dns {
        nat.append(
            ISTIO_OUTPUT_DNS,
            &format!("-p tcp --dport 53 -j REDIRECT --to-ports {DNS_LISTENER_PORT}"),
        );
        nat.append(
            ISTIO_OUTPUT_DNS,
            &format!("-p udp --dport 53 -j REDIRECT --to-port {DNS_LISTENER_PORT}"),
        );
        return;
    }
    for s in &cfg.dns_servers_v4 {
        nat.append(
            ISTIO_OUTPUT_DNS,
            &format!("-p tcp --dport 53 -d {s}/32 -j REDIRECT --to-ports {DNS_LISTENER_PORT}"),
        );
    }
    for s in &cfg.dns_servers_v4 {
        nat.append(
            ISTIO_OUTPUT_DNS,
            &format!("-p udp --dport 53 -d {s}/32 -j REDIRECT --to-port {DNS_LISTENER_PORT}"),
        );
    }
}

fn outbound_include(cfg: &Config, include: &NetworkRange, nat: &mut Table) {
    if include.is_wildcard {
        nat.append(ISTIO_OUTPUT, &format!("-j {ISTIO_REDIRECT}"));
        for nic in &cfg.kube_virt_interfaces {
            nat.insert("PREROUTING", 1, &format!("-i {nic} -j {ISTIO_REDIRECT}"));
        }
        return;
    }
    for c in &include.cidrs {
        for nic in &cfg.kube_virt_interfaces {
            nat.insert("PREROUTING", 1, &format!("-i {nic} -d {c} -j {ISTIO_REDIRECT}"));
        }
        nat.append(ISTIO_OUTPUT, &format!("-d {c} -j {ISTIO_REDIRECT}"));
    }
}
