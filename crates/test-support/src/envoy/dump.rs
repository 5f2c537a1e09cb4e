//! Reading Envoy's admin output: `/stats` text, and the sections and resource names of a
//! `/config_dump`.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde_json::Value;

/// Parses `/stats` text (`name: value` lines); histograms and text readouts are skipped.
pub fn parse_stats(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|line| line.rsplit_once(": "))
        .filter_map(|(name, value)| Some((name.to_owned(), value.trim().parse().ok()?)))
        .collect()
}

/// The sum of every stat whose name ends in `update_rejected`.
pub fn update_rejected_total(stats: &BTreeMap<String, u64>) -> u64 {
    stats
        .iter()
        .filter(|(name, _)| name.ends_with("update_rejected"))
        .map(|(_, value)| value)
        .sum()
}

pub(super) fn socket_addr(address: &Value) -> Option<SocketAddr> {
    let socket = &address["socket_address"];
    let ip = socket["address"].as_str()?.parse().ok()?;
    let port = u16::try_from(socket["port_value"].as_u64().unwrap_or(0)).ok()?;
    Some(SocketAddr::new(ip, port))
}

/// The config_dump section whose `@type` is `type.googleapis.com/envoy.admin.v3.<kind>`
/// (`ClustersConfigDump`, `ListenersConfigDump`, `RoutesConfigDump`, `EndpointsConfigDump`, ...).
pub fn dump_section<'a>(dump: &'a Value, kind: &str) -> Option<&'a Value> {
    dump["configs"]
        .as_array()?
        .iter()
        .find(|config| config["@type"].as_str().and_then(|t| t.rsplit('.').next()) == Some(kind))
}

/// The strings at `pointers` inside each item of the section's `lists`.
fn names(section: Option<&Value>, lists: &[(&str, &str)]) -> Vec<String> {
    let Some(section) = section else { return Vec::new() };
    lists
        .iter()
        .flat_map(|(list, pointer)| {
            section[*list]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |item| item.pointer(pointer))
        })
        .filter_map(|name| Some(name?.as_str()?.to_owned()))
        .collect()
}

/// Static and active dynamic clusters in a config_dump.
pub fn cluster_names(dump: &Value) -> Vec<String> {
    let section = dump_section(dump, "ClustersConfigDump");
    names(
        section,
        &[
            ("static_clusters", "/cluster/name"),
            ("dynamic_active_clusters", "/cluster/name"),
        ],
    )
}

/// Static listeners and dynamic listeners that have an active state, in a config_dump.
pub fn listener_names(dump: &Value) -> Vec<String> {
    let section = dump_section(dump, "ListenersConfigDump");
    names(
        section,
        &[
            ("static_listeners", "/listener/name"),
            ("dynamic_listeners", "/active_state/listener/name"),
        ],
    )
}

/// Static and dynamic route configurations in a config_dump.
pub fn route_config_names(dump: &Value) -> Vec<String> {
    let section = dump_section(dump, "RoutesConfigDump");
    names(
        section,
        &[
            ("static_route_configs", "/route_config/name"),
            ("dynamic_route_configs", "/route_config/name"),
        ],
    )
}

/// The endpoint addresses of `cluster` in a config_dump taken with `include_eds`.
pub fn endpoint_addresses(dump: &Value, cluster: &str) -> Vec<SocketAddr> {
    let Some(section) = dump_section(dump, "EndpointsConfigDump") else {
        return Vec::new();
    };
    ["static_endpoint_configs", "dynamic_endpoint_configs"]
        .iter()
        .flat_map(|list| section[*list].as_array().into_iter().flatten())
        .map(|config| &config["endpoint_config"])
        .filter(|assignment| assignment["cluster_name"] == cluster)
        .flat_map(|assignment| assignment["endpoints"].as_array().into_iter().flatten())
        .flat_map(|locality| locality["lb_endpoints"].as_array().into_iter().flatten())
        .filter_map(|lb_endpoint| socket_addr(&lb_endpoint["endpoint"]["address"]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_text_is_parsed_and_rejections_summed() {
        let text = "cluster.outbound|80||a.default.svc.cluster.local.update_rejected: 2\n\
                    cluster_manager.cds.update_rejected: 1\n\
                    http.inbound_0.0.0.0_8080.rds.http.80.update_rejected: 3\n\
                    cluster_manager.cds.update_success: 7\n\
                    server.version: \"1.40.0\"\n\
                    cluster_manager.cds.update_duration: P0(nan,0) P25(nan,0)\n";
        let stats = parse_stats(text);
        assert_eq!(stats.len(), 4);
        assert_eq!(
            stats["cluster.outbound|80||a.default.svc.cluster.local.update_rejected"],
            2
        );
        assert_eq!(update_rejected_total(&stats), 6);
    }
}
