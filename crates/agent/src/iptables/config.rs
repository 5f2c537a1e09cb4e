//! `pilot-agent istio-iptables` flags (Istio's tools/istio-iptables names and short letters) and
//! their validation into a typed `Config`; every error names the flag an operator must fix.
//!
//! As Istio's, most flags can also come from the environment: the flag's name upper-cased with
//! `_` for `-` (`REDIRECT_DNS`, `PROXY_UID`, ...), and three from the variables Istio's sidecar
//! injector sets ([`ADDITIONAL_ENV`]: `ISTIO_META_DNS_CAPTURE`, `INVALID_DROP`,
//! `ISTIO_DUAL_STACK`). A flag on the command line wins over both.

use std::net::{IpAddr, Ipv4Addr};

use thiserror::Error;

/// Istio's flags. Lists are comma separated, as Istio's.
#[derive(Debug, Clone, clap::Args)]
pub struct IptablesArgs {
    /// Envoy port to which redirect all TCP traffic.
    #[arg(short = 'p', long = "envoy-port", default_value = "15001")]
    pub proxy_port: String,
    /// Port to which all inbound TCP traffic to the pod/VM should be redirected.
    #[arg(
        short = 'z',
        long = "inbound-capture-port",
        env = "INBOUND_CAPTURE_PORT",
        default_value = "15006"
    )]
    pub inbound_capture_port: String,
    /// Envoy port on which the tunnel (HBONE) listens; never captured.
    #[arg(
        short = 'e',
        long = "inbound-tunnel-port",
        env = "INBOUND_TUNNEL_PORT",
        default_value = "15008"
    )]
    pub inbound_tunnel_port: String,
    /// User ID(s) of the proxy, whose traffic is not redirected.
    #[arg(short = 'u', long = "proxy-uid", env = "PROXY_UID", default_value = "1337")]
    pub proxy_uid: String,
    /// Group ID(s) of the proxy, whose traffic is not redirected.
    #[arg(short = 'g', long = "proxy-gid", env = "PROXY_GID", default_value = "1337")]
    pub proxy_gid: String,
    /// Inbound interception mode: REDIRECT (nat) or TPROXY (mangle; keeps the client's address).
    #[arg(
        short = 'm',
        long = "istio-inbound-interception-mode",
        env = "ISTIO_INBOUND_INTERCEPTION_MODE",
        default_value = "REDIRECT"
    )]
    pub inbound_interception_mode: String,
    /// TPROXY mode: the packet mark that routes inbound packets to lo.
    #[arg(
        short = 't',
        long = "istio-inbound-tproxy-mark",
        env = "ISTIO_INBOUND_TPROXY_MARK",
        alias = "inbound-tproxy-mark",
        default_value = "1337"
    )]
    pub inbound_tproxy_mark: String,
    /// TPROXY mode: the routing table holding `local default dev lo`.
    #[arg(
        short = 'r',
        long = "istio-inbound-tproxy-route-table",
        env = "ISTIO_INBOUND_TPROXY_ROUTE_TABLE",
        alias = "inbound-tproxy-route-table",
        default_value = "133"
    )]
    pub inbound_tproxy_route_table: String,
    /// Inbound ports to redirect to Envoy ("*" for all); empty disables inbound capture.
    #[arg(
        short = 'b',
        long = "istio-inbound-ports",
        env = "ISTIO_INBOUND_PORTS",
        default_value = ""
    )]
    pub inbound_ports_include: String,
    /// Inbound ports excluded from redirection (only with `-b '*'`).
    #[arg(
        short = 'd',
        long = "istio-local-exclude-ports",
        env = "ISTIO_LOCAL_EXCLUDE_PORTS",
        default_value = ""
    )]
    pub inbound_ports_exclude: String,
    /// Outbound ports always redirected to Envoy.
    #[arg(
        short = 'q',
        long = "istio-outbound-ports",
        alias = "istio-local-outbound-ports-include",
        env = "ISTIO_OUTBOUND_PORTS",
        default_value = ""
    )]
    pub outbound_ports_include: String,
    /// Outbound ports excluded from redirection.
    #[arg(
        short = 'o',
        long = "istio-local-outbound-ports-exclude",
        env = "ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE",
        default_value = ""
    )]
    pub outbound_ports_exclude: String,
    /// Outbound CIDRs to redirect to Envoy ("*" for all).
    #[arg(
        short = 'i',
        long = "istio-service-cidr",
        env = "ISTIO_SERVICE_CIDR",
        default_value = ""
    )]
    pub outbound_ip_ranges_include: String,
    /// Outbound CIDRs excluded from redirection.
    #[arg(
        short = 'x',
        long = "istio-service-exclude-cidr",
        env = "ISTIO_SERVICE_EXCLUDE_CIDR",
        default_value = ""
    )]
    pub outbound_ip_ranges_exclude: String,
    /// Virtual interfaces whose inbound traffic is treated as outbound.
    #[arg(
        short = 'k',
        long = "kube-virt-interfaces",
        env = "KUBE_VIRT_INTERFACES",
        default_value = ""
    )]
    pub kube_virt_interfaces: String,
    /// Interfaces excluded from all capture.
    #[arg(
        short = 'c',
        long = "istio-exclude-interfaces",
        alias = "exclude-interfaces",
        env = "ISTIO_EXCLUDE_INTERFACES",
        default_value = ""
    )]
    pub exclude_interfaces: String,
    /// Groups whose outbound traffic is captured ("*" for all).
    #[arg(long = "capture-outbound-owner-groups", default_value = "*")]
    pub owner_groups_include: String,
    /// Groups whose outbound traffic is not captured (overrides the include list).
    #[arg(long = "capture-outbound-owner-groups-exclude", default_value = "")]
    pub owner_groups_exclude: String,
    /// Loopback CIDR of the host, used to recognise app-to-itself traffic.
    #[arg(long = "host-ipv4-loopback-cidr", default_value = "127.0.0.1/32")]
    pub host_ipv4_loopback_cidr: String,
    /// Redirect DNS (port 53) to the agent's DNS proxy on 15053.
    #[arg(long = "redirect-dns", env = "REDIRECT_DNS", num_args = 0..=1, default_missing_value = "true",
          default_value = "false", action = clap::ArgAction::Set)]
    pub redirect_dns: bool,
    /// With --redirect-dns, capture DNS to every server, not only those in /etc/resolv.conf.
    #[arg(long = "capture-all-dns", env = "CAPTURE_ALL_DNS", num_args = 0..=1, default_missing_value = "true",
          default_value = "false", action = clap::ArgAction::Set)]
    pub capture_all_dns: bool,
    /// Also capture IPv6 (ip6tables), as Istio's ENABLE_INBOUND_IPV6 (Istio sets it for IPv6 pods).
    #[arg(long = "enable-inbound-ipv6", alias = "dual-stack", env = "ENABLE_INBOUND_IPV6", num_args = 0..=1, default_missing_value = "true",
          default_value = "false", action = clap::ArgAction::Set)]
    pub enable_ipv6: bool,
    /// Drop packets in INVALID conntrack state (mangle table).
    #[arg(long = "drop-invalid", env = "DROP_INVALID", num_args = 0..=1, default_missing_value = "true",
          default_value = "false", action = clap::ArgAction::Set)]
    pub drop_invalid: bool,
    /// Print the rules instead of applying them (`--dry-run=false` applies).
    #[arg(short = 'n', long = "dry-run", env = "DRY_RUN", num_args = 0..=1, default_missing_value = "true", default_value = "false",
          action = clap::ArgAction::Set)]
    pub dry_run: bool,
    /// Only remove Istio's chains and jumps, then exit.
    #[arg(long = "cleanup-only", env = "CLEANUP_ONLY", num_args = 0..=1, default_missing_value = "true",
          default_value = "false", action = clap::ArgAction::Set)]
    pub cleanup_only: bool,
    /// iptables flavour to run: "legacy", "nft" or empty for the `iptables-restore` on PATH.
    #[arg(long = "iptables-version", default_value = "")]
    pub iptables_version: String,
    /// Istio's logging flags, which the injected istio-init passes (`--log_output_level=...`).
    #[command(flatten)]
    pub log: crate::logging::LogArgs,
}

/// A boolean flag of [`IptablesArgs`], to set.
pub(crate) type BoolFlag = fn(&mut IptablesArgs) -> &mut bool;

/// Istio's `flag.AdditionalEnv`: (argument id, variable, the flag it sets). The variable
/// overrides the flag's own environment variable; the command line overrides both.
pub(crate) const ADDITIONAL_ENV: [(&str, &str, BoolFlag); 3] = [
    ("redirect_dns", "ISTIO_META_DNS_CAPTURE", |a| &mut a.redirect_dns),
    ("drop_invalid", "INVALID_DROP", |a| &mut a.drop_invalid),
    ("enable_ipv6", "ISTIO_DUAL_STACK", |a| &mut a.enable_ipv6),
];

impl IptablesArgs {
    /// What Istio's `Config.Print` logs before applying (`tools/common/config`): the settings as
    /// its variables.
    pub fn variables(&self) -> String {
        [
            ("PROXY_PORT", self.proxy_port.as_str()),
            ("PROXY_INBOUND_CAPTURE_PORT", &self.inbound_capture_port),
            ("PROXY_TUNNEL_PORT", &self.inbound_tunnel_port),
            ("PROXY_UID", &self.proxy_uid),
            ("PROXY_GID", &self.proxy_gid),
            ("INBOUND_INTERCEPTION_MODE", &self.inbound_interception_mode),
            ("INBOUND_TPROXY_MARK", &self.inbound_tproxy_mark),
            ("INBOUND_TPROXY_ROUTE_TABLE", &self.inbound_tproxy_route_table),
            ("INBOUND_PORTS_INCLUDE", &self.inbound_ports_include),
            ("INBOUND_PORTS_EXCLUDE", &self.inbound_ports_exclude),
            ("OUTBOUND_OWNER_GROUPS_INCLUDE", &self.owner_groups_include),
            ("OUTBOUND_OWNER_GROUPS_EXCLUDE", &self.owner_groups_exclude),
            ("OUTBOUND_IP_RANGES_INCLUDE", &self.outbound_ip_ranges_include),
            ("OUTBOUND_IP_RANGES_EXCLUDE", &self.outbound_ip_ranges_exclude),
            ("OUTBOUND_PORTS_INCLUDE", &self.outbound_ports_include),
            ("OUTBOUND_PORTS_EXCLUDE", &self.outbound_ports_exclude),
            ("KUBE_VIRT_INTERFACES", &self.kube_virt_interfaces),
            ("ENABLE_INBOUND_IPV6", if self.enable_ipv6 { "true" } else { "false" }),
            ("DNS_CAPTURE", if self.redirect_dns { "true" } else { "false" }),
            ("DROP_INVALID", if self.drop_invalid { "true" } else { "false" }),
            ("CAPTURE_ALL_DNS", if self.capture_all_dns { "true" } else { "false" }),
            ("EXCLUDE_INTERFACES", &self.exclude_interfaces),
            ("CLEANUP_ONLY", if self.cleanup_only { "true" } else { "false" }),
        ]
        .iter()
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect()
    }

    /// Applies [`ADDITIONAL_ENV`] (`env` looks a variable up) to the flags `matches` did not get
    /// on the command line. A value that is not a boolean is reported and ignored, as Istio
    /// ignores it.
    pub fn apply_additional_env(&mut self, matches: &clap::ArgMatches, env: impl Fn(&str) -> Option<String>) {
        for (id, var, flag) in ADDITIONAL_ENV {
            if matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine) {
                continue;
            }
            let Some(value) = env(var) else { continue };
            match parse_go_bool(&value) {
                Some(on) => *flag(self) = on,
                None => eprintln!("warning: ignoring {var}={value:?}: not a boolean"),
            }
        }
    }
}

/// Go's `strconv.ParseBool`, which Istio's flags use.
fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// A flag value that cannot be used; the message names the flag.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("invalid port {value:?} in {flag} (expected 1-65535)")]
    Port { flag: &'static str, value: String },
    #[error("invalid CIDR {value:?} in {flag} (expected e.g. 10.0.0.0/8 or '*')")]
    Cidr { flag: &'static str, value: String },
    #[error("'*' is not allowed in {flag}")]
    Wildcard { flag: &'static str },
    #[error("invalid value {value:?} in {flag}")]
    Name { flag: &'static str, value: String },
    #[error("inbound interception mode {0:?} is not supported (expected REDIRECT or TPROXY)")]
    Mode(String),
    #[error("invalid number {value:?} in {flag}")]
    Number { flag: &'static str, value: String },
    #[error("unknown --iptables-version {0:?} (expected legacy, nft or empty)")]
    Version(String),
}

/// A network as given by the operator (not masked, as Istio prints it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Istio's `NetworkRange` for one IP family: either everything or a list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkRange {
    pub is_wildcard: bool,
    pub cidrs: Vec<Cidr>,
}

impl NetworkRange {
    /// Istio's `HasLoopBackIP`: an explicit loopback include disables the app-to-itself RETURN.
    pub fn has_loopback(&self) -> bool {
        self.cidrs.iter().any(|c| c.addr.is_loopback())
    }
}

/// Istio's `SeparateV4V6`: one flag's ranges split by family ("*" is everything in both).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpRanges {
    pub v4: NetworkRange,
    pub v6: NetworkRange,
}

/// The nameservers whose DNS traffic is captured, per family. Istio keeps them as text and
/// prints them as given (its tests pass `::127.0.0.53`); `from_resolv_conf` normalises them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsServers {
    pub v4: Vec<Ipv4Addr>,
    pub v6: Vec<String>,
}

impl DnsServers {
    /// The nameservers of a resolv.conf (Istio's `IPsSplitV4V6`; unparsable entries are skipped).
    pub fn from_resolv_conf(text: &str) -> Self {
        let mut servers = Self::default();
        for addr in text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("nameserver"))
            .filter_map(|rest| rest.trim().parse::<IpAddr>().ok())
        {
            match addr {
                IpAddr::V4(a) => servers.v4.push(a),
                IpAddr::V6(a) => servers.v6.push(a.to_string()),
            }
        }
        servers
    }
}

/// How inbound traffic reaches Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterceptionMode {
    /// nat REDIRECT: Envoy sees the original destination through SO_ORIGINAL_DST.
    Redirect,
    /// mangle TPROXY plus policy routing: the client's source address is kept.
    Tproxy,
}

/// Validated capture configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub proxy_port: u16,
    pub inbound_capture_port: u16,
    pub inbound_tunnel_port: u16,
    pub proxy_uids: Vec<String>,
    pub proxy_gids: Vec<String>,
    pub inbound_interception_mode: InterceptionMode,
    pub inbound_tproxy_mark: u32,
    pub inbound_tproxy_route_table: u32,
    /// `None`: no inbound capture; `Some(empty)`: all ports ("*"); otherwise the listed ports.
    pub inbound_ports_include: Option<Vec<u16>>,
    pub inbound_ports_exclude: Vec<u16>,
    pub outbound_ports_include: Vec<u16>,
    pub outbound_ports_exclude: Vec<u16>,
    pub outbound_ip_ranges_include: IpRanges,
    pub outbound_ip_ranges_exclude: IpRanges,
    pub kube_virt_interfaces: Vec<String>,
    pub exclude_interfaces: Vec<String>,
    pub owner_groups_include: Vec<String>,
    pub owner_groups_exclude: Vec<String>,
    pub host_ipv4_loopback_cidr: Cidr,
    pub redirect_dns: bool,
    pub capture_all_dns: bool,
    pub dns_servers: DnsServers,
    pub drop_invalid: bool,
    pub enable_ipv6: bool,
}

/// Istio's `split`: comma separated, blanks dropped.
pub fn split(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|p| !p.is_empty())
}

fn port(flag: &'static str, value: &str) -> Result<u16, ConfigError> {
    match value.trim().parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(ConfigError::Port {
            flag,
            value: value.into(),
        }),
    }
}

fn ports(flag: &'static str, value: &str) -> Result<Vec<u16>, ConfigError> {
    split(value).map(|p| port(flag, p)).collect()
}

fn number(flag: &'static str, value: &str) -> Result<u32, ConfigError> {
    value.trim().parse::<u32>().map_err(|_| ConfigError::Number {
        flag,
        value: value.into(),
    })
}

fn names(flag: &'static str, value: &str) -> Result<Vec<String>, ConfigError> {
    split(value)
        .map(|n| {
            if n.chars().all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c)) {
                Ok(n.to_string())
            } else {
                Err(ConfigError::Name { flag, value: n.into() })
            }
        })
        .collect()
}

/// Parses "a.b.c.d/n", "x::/n" or a bare address (/32 or /128).
fn cidr(flag: &'static str, value: &str) -> Result<Cidr, ConfigError> {
    let bad = || ConfigError::Cidr {
        flag,
        value: value.into(),
    };
    let (addr, prefix) = match value.split_once('/') {
        Some((a, p)) => (a, Some(p.parse::<u8>().map_err(|_| bad())?)),
        None => (value, None),
    };
    let addr = addr.parse::<IpAddr>().map_err(|_| bad())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = prefix.unwrap_or(max);
    if prefix > max {
        return Err(bad());
    }
    Ok(Cidr { addr, prefix })
}

fn ip_ranges(flag: &'static str, value: &str) -> Result<IpRanges, ConfigError> {
    if value.trim() == "*" {
        let all = NetworkRange {
            is_wildcard: true,
            cidrs: Vec::new(),
        };
        return Ok(IpRanges {
            v4: all.clone(),
            v6: all,
        });
    }
    let mut ranges = IpRanges::default();
    for part in split(value) {
        let c = cidr(flag, part)?;
        match c.addr {
            IpAddr::V4(_) => ranges.v4.cidrs.push(c),
            IpAddr::V6(_) => ranges.v6.cidrs.push(c),
        }
    }
    Ok(ranges)
}

fn interception_mode(value: &str) -> Result<InterceptionMode, ConfigError> {
    if value.eq_ignore_ascii_case("REDIRECT") {
        Ok(InterceptionMode::Redirect)
    } else if value.eq_ignore_ascii_case("TPROXY") {
        Ok(InterceptionMode::Tproxy)
    } else {
        Err(ConfigError::Mode(value.into()))
    }
}

impl Config {
    /// Validates the flags; `dns_servers` come from the caller (Istio reads /etc/resolv.conf).
    pub fn from_args(args: &IptablesArgs, dns_servers: DnsServers) -> Result<Self, ConfigError> {
        let inbound_interception_mode = interception_mode(args.inbound_interception_mode.trim())?;
        if !["", "legacy", "nft"].contains(&args.iptables_version.as_str()) {
            return Err(ConfigError::Version(args.iptables_version.clone()));
        }
        let inbound_ports_include = match args.inbound_ports_include.trim() {
            "" => None,
            "*" => Some(Vec::new()),
            list => Some(ports("--istio-inbound-ports (-b)", list)?),
        };
        let exclude_flag = "--istio-service-exclude-cidr (-x)";
        let outbound_ip_ranges_exclude = ip_ranges(exclude_flag, &args.outbound_ip_ranges_exclude)?;
        if outbound_ip_ranges_exclude.v4.is_wildcard {
            return Err(ConfigError::Wildcard { flag: exclude_flag });
        }
        let loopback_flag = "--host-ipv4-loopback-cidr";
        let host_ipv4_loopback_cidr = cidr(loopback_flag, args.host_ipv4_loopback_cidr.trim())?;
        if !host_ipv4_loopback_cidr.addr.is_ipv4() {
            return Err(ConfigError::Cidr {
                flag: loopback_flag,
                value: args.host_ipv4_loopback_cidr.clone(),
            });
        }
        let (owner_groups_include, owner_groups_exclude) = match args.owner_groups_exclude.trim() {
            "" if args.owner_groups_include.trim() == "*" => (vec!["*".to_string()], Vec::new()),
            "" => (
                names("--capture-outbound-owner-groups", &args.owner_groups_include)?,
                Vec::new(),
            ),
            ex => (Vec::new(), names("--capture-outbound-owner-groups-exclude", ex)?),
        };
        Ok(Self {
            proxy_port: port("--envoy-port (-p)", &args.proxy_port)?,
            inbound_capture_port: port("--inbound-capture-port (-z)", &args.inbound_capture_port)?,
            inbound_tunnel_port: port("--inbound-tunnel-port (-e)", &args.inbound_tunnel_port)?,
            proxy_uids: names("--proxy-uid (-u)", &args.proxy_uid)?,
            proxy_gids: names("--proxy-gid (-g)", &args.proxy_gid)?,
            inbound_interception_mode,
            inbound_tproxy_mark: number("--istio-inbound-tproxy-mark (-t)", &args.inbound_tproxy_mark)?,
            inbound_tproxy_route_table: number(
                "--istio-inbound-tproxy-route-table (-r)",
                &args.inbound_tproxy_route_table,
            )?,
            inbound_ports_include,
            inbound_ports_exclude: ports("--istio-local-exclude-ports (-d)", &args.inbound_ports_exclude)?,
            outbound_ports_include: ports(
                "--istio-local-outbound-ports-include (-q)",
                &args.outbound_ports_include,
            )?,
            outbound_ports_exclude: ports(
                "--istio-local-outbound-ports-exclude (-o)",
                &args.outbound_ports_exclude,
            )?,
            outbound_ip_ranges_include: ip_ranges("--istio-service-cidr (-i)", &args.outbound_ip_ranges_include)?,
            outbound_ip_ranges_exclude,
            kube_virt_interfaces: names("--kube-virt-interfaces (-k)", &args.kube_virt_interfaces)?,
            exclude_interfaces: names("--exclude-interfaces (-c)", &args.exclude_interfaces)?,
            owner_groups_include,
            owner_groups_exclude,
            host_ipv4_loopback_cidr,
            redirect_dns: args.redirect_dns,
            capture_all_dns: args.capture_all_dns,
            dns_servers,
            drop_invalid: args.drop_invalid,
            enable_ipv6: args.enable_ipv6,
        })
    }

    pub fn tproxy(&self) -> bool {
        self.inbound_interception_mode == InterceptionMode::Tproxy
    }
}
