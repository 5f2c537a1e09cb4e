//! All Gateways selecting one proxy merged into one logical gateway, as Istio's `MergedGateway`
//! (`mergeGateways` in `pilot/pkg/model/gateway.go`): servers grouped by port, RDS names per
//! server, duplicate TLS hosts and conflicting protocols refused. Listeners (LDS) and route
//! configurations (RDS) are both built from it.
//!
//! A server's port is the port of the Service in front of the gateway's workloads: the gateway
//! listens on that Service port's target port (`resolvePorts`), so a Gateway on port 80 of the
//! `istio-ingressgateway` Service (80 -> 8080) is served by the listener `0.0.0.0_8080` and the
//! route configuration `http.8080`.
//!
//! Differences from Istio, for now: no QUIC/HTTP3 servers, no credential-reference verification.

use std::collections::{BTreeMap, BTreeSet};

use model::networking::{Gateway, Server};
use model::{Config, ConfigSpec, Protocol, Proxy};

use crate::names;
use crate::route::PushView;

/// A port the gateway listens on, as Istio's `ServerPort`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ServerPort {
    pub(crate) number: u32,
    pub(crate) protocol: String,
    pub(crate) bind: String,
}

/// One server of one Gateway, with what merging worked out for it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MergedServer {
    /// The server, hosts sanitized (`./h` -> `<gateway ns>/h`, `*/h` -> `h`, `*/*` -> `*`).
    pub(crate) server: Server,
    /// The owning gateway, `ns/name`.
    pub(crate) gateway_name: String,
    /// RDS name for HTTP and TLS-terminating HTTPS servers; empty otherwise.
    pub(crate) route_name: String,
    /// SNI hosts for servers with TLS settings (hosts without the namespace, deduplicated, sorted).
    pub(crate) sni_hosts: Vec<String>,
}

impl MergedServer {
    pub(crate) fn port(&self) -> u32 {
        self.server.port.as_ref().map_or(0, |p| p.number)
    }
}

/// Istio's `DisableGatewayPortTranslationLabel`: a Service with this label is left out of port
/// translation (legacy, selector-based gateways only).
pub(crate) const DISABLE_PORT_TRANSLATION_LABEL: &str = "experimental.istio.io/disable-gateway-port-translation";

/// One of the gateway proxy's service targets as port translation reads it (Istio's
/// `ServiceTarget`): a port of a Service selecting the proxy and the port the proxy listens on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct GatewayTarget {
    pub(crate) service_port: u32,
    pub(crate) target_port: u32,
    /// The Service carries [`DISABLE_PORT_TRANSLATION_LABEL`].
    pub(crate) disable_translation: bool,
}

/// Istio's `resolvePorts`: the ports a server on `number` listens on. A gateway selected by labels
/// (`legacy`) takes the target port of the first service target on that port, else the number
/// itself; a gateway bound to its Services (Gateway API) takes every such target port, and none
/// when no Service has the port.
pub(crate) fn resolve_ports(number: u32, targets: &[GatewayTarget], legacy: bool) -> Vec<u32> {
    let mut ports: Vec<u32> = Vec::new();
    for t in targets {
        if legacy && t.disable_translation {
            continue;
        }
        if t.service_port == number {
            if legacy {
                return vec![t.target_port];
            }
            if !ports.contains(&t.target_port) {
                ports.push(t.target_port);
            }
        }
    }
    if ports.is_empty() && legacy {
        return vec![number];
    }
    ports
}

/// Servers sharing a `ServerPort`; `route_name` is the RDS name of plaintext HTTP ones.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct MergedServers {
    pub(crate) servers: Vec<usize>,
    pub(crate) route_name: String,
}

/// Istio's `MergedGateway`. Servers are stored once and referred to by index.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct MergedGateway {
    pub(crate) servers: Vec<MergedServer>,
    /// Ports in the order first seen (stable listener order).
    pub(crate) server_ports: Vec<ServerPort>,
    pub(crate) merged_servers: BTreeMap<ServerPort, MergedServers>,
    /// RDS name -> servers serving it (several only for plaintext HTTP).
    pub(crate) servers_by_route_name: BTreeMap<String, Vec<usize>>,
    /// Istio's `AutoPassthroughSNIHosts`: the hosts of the AUTO_PASSTHROUGH servers; any makes
    /// CDS add the `outbound_.<port>_.<subset>_.<host>` (SNI-DNAT) clusters.
    pub(crate) auto_passthrough_hosts: BTreeSet<String>,
}

/// TLS mode of a server; absent means PASSTHROUGH (the enum's zero value).
pub(crate) fn tls_mode(server: &Server) -> Option<&str> {
    server.tls.as_ref().map(|t| t.mode.as_deref().unwrap_or("PASSTHROUGH"))
}

/// `IsPassThroughServer`.
pub(crate) fn is_passthrough_server(server: &Server) -> bool {
    matches!(tls_mode(server), Some("PASSTHROUGH" | "AUTO_PASSTHROUGH"))
}

fn server_protocol(server: &Server) -> Protocol {
    Protocol::parse(server.port.as_ref().map_or("", |p| p.protocol.as_str()))
}

/// `IsTLSServer`: a non-HTTP server with TLS settings (termination or passthrough).
pub(crate) fn is_tls_server(server: &Server) -> bool {
    server.tls.is_some() && !server_protocol(server).is_http()
}

/// `IsHTTPServer`: HTTP, or HTTPS that terminates TLS.
pub(crate) fn is_http_server(server: &Server) -> bool {
    let p = server_protocol(server);
    p.is_http() || (p == Protocol::Https && !is_passthrough_server(server))
}

/// `IsHTTPSServerWithTLSTermination`.
pub(crate) fn is_https_with_tls_termination(server: &Server) -> bool {
    server.tls.is_some() && server_protocol(server) == Protocol::Https && !is_passthrough_server(server)
}

/// `gatewayRDSRouteName`: `http.<port>[.<bind>]` or `https.<port>.<port name>.<gw>.<ns>[.<bind>]`.
fn route_name(server: &Server, port: u32, gateway: &Config) -> String {
    let bind = if server.bind.is_empty() {
        String::new()
    } else {
        format!(".{}", server.bind)
    };
    let p = server_protocol(server);
    if p.is_http() {
        return format!("{}{bind}", names::gateway_http_route_name(port));
    }
    if p == Protocol::Https && !is_passthrough_server(server) {
        let port_name = server.port.as_ref().map_or("", |p| p.name.as_str());
        let name = names::gateway_https_route_name(port, port_name, &gateway.meta.name, &gateway.meta.namespace);
        return format!("{name}{bind}");
    }
    String::new()
}

/// `sanitizeServerHostNamespace`.
fn sanitize_hosts(server: &mut Server, namespace: &str) {
    let mut hosts = Vec::with_capacity(server.hosts.len());
    for h in &server.hosts {
        match h.split_once('/') {
            Some((".", host)) => hosts.push(format!("{namespace}/{host}")),
            Some(("*", "*")) => {
                hosts = vec!["*".to_owned()];
                break;
            }
            Some(("*", host)) => hosts.push(host.to_owned()),
            _ => hosts.push(h.clone()),
        }
    }
    server.hosts = hosts;
}

/// `GetSNIHostsForServer`.
fn sni_hosts(server: &Server) -> Vec<String> {
    let set: BTreeSet<String> = server
        .hosts
        .iter()
        .map(|h| h.split_once('/').map_or(h.as_str(), |(_, host)| host).to_owned())
        .collect();
    set.into_iter().collect()
}

/// `CheckDuplicates`: hosts already served with the same bind; when none, all are recorded.
pub(crate) fn check_duplicates(hosts: &[String], bind: &str, known: &mut BTreeMap<String, String>) -> Vec<String> {
    let dups: Vec<String> = hosts
        .iter()
        .filter(|h| known.get(*h).is_some_and(|b| b == bind))
        .cloned()
        .collect();
    if dups.is_empty() {
        for h in hosts {
            known.insert(h.clone(), bind.to_owned());
        }
    }
    dups
}

/// `canMergeProtocols`.
fn can_merge_protocols(current: Protocol, p: Protocol) -> bool {
    (current.is_http() || current == p) && p.is_http()
}

/// The state of one `mergeGateways` run.
#[derive(Default)]
struct Merger {
    mg: MergedGateway,
    gateway_ports: BTreeSet<u32>,
    plain_text_servers: BTreeMap<u32, ServerPort>,
    tls_hosts_by_port: BTreeMap<u32, BTreeMap<String, String>>,
    non_plain_text_binds: BTreeMap<u32, BTreeSet<String>>,
}

impl Merger {
    /// One server of `config` on the listener port `number` (its port, translated).
    fn add(&mut self, config: &Config, gateway_name: &str, server: &Server, number: u32) {
        let Some(port) = server.port.as_ref() else {
            return;
        };
        let mg = &mut self.mg;
        let route_name = route_name(server, number, config);
        let mut sni = Vec::new();
        if server.tls.is_some() {
            let known = self.tls_hosts_by_port.entry(number).or_default();
            let dups = check_duplicates(&server.hosts, &server.bind, known);
            if !dups.is_empty() {
                tracing::warn!(gateway = %gateway_name, "skipping server: duplicate host names {dups:?}");
                return;
            }
            sni = sni_hosts(server);
        }
        let sp = ServerPort {
            number,
            protocol: port.protocol.clone(),
            bind: server.bind.clone(),
        };
        let proto = server_protocol(server);
        let merged = MergedServer {
            server: server.clone(),
            gateway_name: gateway_name.to_owned(),
            route_name,
            sni_hosts: sni,
        };
        if self.gateway_ports.insert(number) {
            mg.add_first_server(merged, sp, &mut self.plain_text_servers);
            return;
        }
        if let Some(current) = self.plain_text_servers.get(&number).cloned() {
            let same_bind = current.bind == sp.bind;
            if same_bind && !can_merge_protocols(Protocol::parse(&current.protocol), proto) {
                tracing::info!(gateway = %gateway_name, port = number, "skipping server: protocol conflict");
                return;
            }
            if same_bind && merged.route_name.is_empty() {
                tracing::debug!(gateway = %gateway_name, port = number, "skipping server: no RDS name");
                return;
            }
            if same_bind {
                let idx = mg.push_server(merged);
                mg.merged_servers.entry(current).or_default().servers.push(idx);
            } else if mg.merged_servers.contains_key(&sp) {
                let route_name = merged.route_name.clone();
                let idx = mg.push_server(merged);
                if let Some(ms) = mg.merged_servers.get_mut(&sp) {
                    ms.servers.push(idx);
                    ms.route_name = route_name;
                }
            } else {
                mg.add_first_server(merged, sp, &mut self.plain_text_servers);
            }
            return;
        }
        if !is_tls_server(&merged.server) {
            // a plaintext server on a port so far used by TLS servers only
            self.plain_text_servers.insert(number, sp.clone());
            mg.add_first_server(merged, sp, &mut self.plain_text_servers);
            return;
        }
        if is_http_server(&merged.server)
            && (merged.route_name.is_empty() || mg.servers_by_route_name.contains_key(&merged.route_name))
        {
            tracing::info!(gateway = %gateway_name, port = number, "skipping server: non unique HTTPS port name");
            return;
        }
        self.non_plain_text_binds
            .entry(number)
            .or_default()
            .insert(sp.bind.clone());
        let idx = mg.push_server(merged);
        if !mg.merged_servers.contains_key(&sp) {
            mg.server_ports.push(sp.clone());
        }
        mg.merged_servers.entry(sp).or_default().servers.push(idx);
    }
}

impl MergedGateway {
    /// Merges the servers of `gateways` (Gateway configs selecting the proxy by labels, in push
    /// order), each on the ports `targets` translate its port to.
    pub(crate) fn merge(gateways: &[std::sync::Arc<Config>], targets: &[GatewayTarget]) -> MergedGateway {
        let mut m = Merger::default();
        for config in gateways {
            let ConfigSpec::Gateway(Gateway { servers, .. }) = &config.spec else {
                continue;
            };
            let gateway_name = format!("{}/{}", config.meta.namespace, config.meta.name);
            for s in servers {
                let Some(port) = s.port.as_ref() else {
                    tracing::debug!(gateway = %gateway_name, "server without port skipped");
                    continue;
                };
                let mut server = s.clone();
                sanitize_hosts(&mut server, &config.meta.namespace);
                for number in resolve_ports(port.number, targets, true) {
                    m.add(config, &gateway_name, &server, number);
                }
            }
        }
        let mut mg = m.mg;
        mg.auto_passthrough_hosts = mg
            .servers
            .iter()
            .filter(|s| tls_mode(&s.server) == Some("AUTO_PASSTHROUGH"))
            .flat_map(|s| s.sni_hosts.iter().cloned())
            .collect();
        mg
    }

    /// The gateways selecting `proxy` merged, on the ports of the proxy's Services.
    pub(crate) fn for_proxy<P: PushView>(push: &P, proxy: &Proxy) -> MergedGateway {
        MergedGateway::merge(&push.gateways_for_proxy(proxy), &push.gateway_targets(proxy))
    }

    /// Whether some server is AUTO_PASSTHROUGH (Istio's `ContainsAutoPassthroughGateways`).
    pub(crate) fn contains_auto_passthrough(&self) -> bool {
        self.servers
            .iter()
            .any(|s| tls_mode(&s.server) == Some("AUTO_PASSTHROUGH"))
    }

    /// Stores a server, registering its RDS name if it serves HTTP.
    fn push_server(&mut self, server: MergedServer) -> usize {
        let idx = self.servers.len();
        if is_http_server(&server.server) && !server.route_name.is_empty() {
            self.servers_by_route_name
                .entry(server.route_name.clone())
                .or_default()
                .push(idx);
        }
        self.servers.push(server);
        idx
    }

    /// `addPlainTextServer`: the first server of a `ServerPort`.
    fn add_first_server(&mut self, server: MergedServer, sp: ServerPort, plain: &mut BTreeMap<u32, ServerPort>) {
        if !is_tls_server(&server.server) {
            plain.insert(sp.number, sp.clone());
        }
        let route_name = server.route_name.clone();
        let idx = self.push_server(server);
        self.merged_servers.insert(
            sp.clone(),
            MergedServers {
                servers: vec![idx],
                route_name,
            },
        );
        self.server_ports.push(sp);
    }

    /// The servers serving one RDS name.
    pub(crate) fn servers_for_route(&self, route_name: &str) -> impl Iterator<Item = &MergedServer> {
        self.servers_by_route_name
            .get(route_name)
            .into_iter()
            .flatten()
            .map(|i| &self.servers[*i])
    }
}

#[cfg(test)]
mod tests;
