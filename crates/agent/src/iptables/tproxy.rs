//! Istio's TPROXY inbound interception: the mangle chains (`ISTIO_DIVERT` marks and accepts
//! packets of established inbound connections, `ISTIO_TPROXY` hands new ones to Envoy's inbound
//! port), the connection marks that keep Envoy's own traffic out, and the policy routing
//! (`ip rule`/`ip route` in table 133) that delivers marked packets to lo, as Istio's
//! `tools/common/tproxy.ConfigureRoutes` sets up. Also the `::6` address IPv6 capture binds to.

use super::builder::RuleBuilder;
use super::config::Config;
use super::rules::{
    INBOUND_PASSTHROUGH_V4, INBOUND_PASSTHROUGH_V6, IPV6_LOOPBACK, ISTIO_DIVERT, ISTIO_INBOUND, ISTIO_TPROXY, MANGLE,
};

/// Marks Envoy's outbound-to-inbound packets (app calls a VIP, Envoy outbound, Envoy inbound, app)
/// so they are not captured again.
pub(crate) const OUTBOUND_MARK: u32 = 1338;

/// `ISTIO_DIVERT` and `ISTIO_TPROXY`, added before the inbound ports are captured.
pub(crate) fn divert_chains(cfg: &Config, b: &mut RuleBuilder) {
    let mark = cfg.inbound_tproxy_mark;
    // Packets of known inbound connections are marked so policy routing sends them to lo.
    b.append(MANGLE, ISTIO_DIVERT, &format!("-j MARK --set-mark {mark}"));
    b.append(MANGLE, ISTIO_DIVERT, "-j ACCEPT");
    let lo4 = cfg.host_ipv4_loopback_cidr.to_string();
    let port = cfg.inbound_capture_port;
    b.append_versioned(&lo4, IPV6_LOOPBACK, MANGLE, ISTIO_TPROXY, |lo| {
        format!("! -d {lo} -p tcp -j TPROXY --tproxy-mark {mark}/0xffffffff --on-port {port}")
    });
}

/// Captures inbound TCP (`dport` is `""` for every port or `"--dport N "`): packets of
/// established connections are diverted, new connections go to TPROXY.
pub fn capture(b: &mut RuleBuilder, dport: &str) {
    b.append(
        MANGLE,
        ISTIO_INBOUND,
        &format!("-p tcp {dport}-m conntrack --ctstate RELATED,ESTABLISHED -j {ISTIO_DIVERT}"),
    );
    b.append(MANGLE, ISTIO_INBOUND, &format!("-p tcp {dport}-j {ISTIO_TPROXY}"));
}

/// The marks added after the outbound rules.
pub fn marks(cfg: &Config, b: &mut RuleBuilder) {
    let mark = cfg.inbound_tproxy_mark;
    // The mark set by Envoy's original_src filter becomes the connection's mark.
    b.append(
        MANGLE,
        "PREROUTING",
        &format!("-p tcp -m mark --mark {mark} -j CONNMARK --save-mark"),
    );
    // Envoy to app traffic already marked is left alone.
    b.append(
        MANGLE,
        "OUTPUT",
        &format!("-p tcp -o lo -m mark --mark {mark} -j RETURN"),
    );
    let lo4 = cfg.host_ipv4_loopback_cidr.to_string();
    for (matcher, owners) in [("--uid-owner", &cfg.proxy_uids), ("--gid-owner", &cfg.proxy_gids)] {
        for id in owners {
            b.append_versioned(&lo4, IPV6_LOOPBACK, MANGLE, "OUTPUT", |lo| {
                format!("! -d {lo} -p tcp -o lo -m owner {matcher} {id} -j MARK --set-mark {OUTBOUND_MARK}")
            });
        }
    }
    // Replies of the app follow the policy route of their connection.
    b.append(
        MANGLE,
        "OUTPUT",
        &format!("-p tcp -m connmark --mark {mark} -j CONNMARK --restore-mark"),
    );
    // No redirect loop.
    b.insert(
        MANGLE,
        ISTIO_INBOUND,
        1,
        &format!("-p tcp -m mark --mark {mark} -j RETURN"),
    );
    // Envoy or the agent to the app from 127.0.0.6 / ::6 to the pod IP.
    b.insert_v4(
        MANGLE,
        ISTIO_INBOUND,
        2,
        &format!("-p tcp -s {INBOUND_PASSTHROUGH_V4} -i lo -j RETURN"),
    );
    b.insert_v6(
        MANGLE,
        ISTIO_INBOUND,
        2,
        &format!("-p tcp -s {INBOUND_PASSTHROUGH_V6} -i lo -j RETURN"),
    );
    // App to app by pod IP.
    b.insert(
        MANGLE,
        ISTIO_INBOUND,
        3,
        &format!("-p tcp -i lo -m mark ! --mark {OUTBOUND_MARK} -j RETURN"),
    );
}

/// One `ip` invocation; `ignore_exists` accepts "already there" (Istio's `ignoreExists`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpCommand {
    pub args: Vec<String>,
    pub ignore_exists: bool,
}

impl IpCommand {
    fn new(args: &str, ignore_exists: bool) -> Self {
        Self {
            args: args.split_whitespace().map(str::to_string).collect(),
            ignore_exists,
        }
    }
}

impl std::fmt::Display for IpCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ip {}", self.args.join(" "))
    }
}

/// Whether an `ip` failure means the address or route is already there.
pub(crate) fn is_exists_error(stderr: &str) -> bool {
    let s = stderr.to_ascii_lowercase();
    s.contains("file exists") || s.contains("already assigned")
}

/// What Istio's `ConfigureRoutes` does outside iptables, and how to undo the routing part.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routes {
    /// Run in order after the iptables rules; any failure but "exists" is an error.
    pub setup: Vec<IpCommand>,
    /// Run best effort, each until it fails, since `ip rule add` stacks duplicates.
    pub cleanup: Vec<IpCommand>,
}

/// The routes for `cfg`: `::6/128` on lo with IPv6, and with TPROXY capture of some inbound
/// port, per family: `ip rule add fwmark <mark> lookup <table>` and
/// `ip route add local default dev lo table <table>`.
pub fn routes(cfg: &Config) -> Routes {
    let mut routes = Routes::default();
    if cfg.enable_ipv6 {
        // IPv6 lo only allows binding ::1 by default; inbound passthrough binds ::6.
        routes.setup.push(IpCommand::new("-6 addr add ::6/128 dev lo", true));
    }
    if !cfg.tproxy() || cfg.inbound_ports_include.is_none() {
        return routes;
    }
    let (mark, table) = (cfg.inbound_tproxy_mark, cfg.inbound_tproxy_route_table);
    let mut families = vec![("-4", "0.0.0.0/0")];
    if cfg.enable_ipv6 {
        families.push(("-6", "::/0"));
    }
    for (family, _) in &families {
        routes.setup.push(IpCommand::new(
            &format!("{family} rule add fwmark {mark} lookup {table}"),
            false,
        ));
    }
    for (family, default) in &families {
        routes.setup.push(IpCommand::new(
            &format!("{family} route add local {default} dev lo table {table}"),
            true,
        ));
        routes.cleanup.push(IpCommand::new(
            &format!("{family} rule del fwmark {mark} lookup {table}"),
            false,
        ));
        routes.cleanup.push(IpCommand::new(
            &format!("{family} route del local {default} dev lo table {table}"),
            false,
        ));
    }
    routes
}
