//! Istio's resource names: `outbound|9080|v1|reviews.default.svc.cluster.local`, `http.8080`, ...

/// Traffic direction of a cluster, as Istio's `model.TrafficDirection`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TrafficDirection {
    Inbound,
    Outbound,
}

impl TrafficDirection {
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            TrafficDirection::Inbound => "inbound",
            TrafficDirection::Outbound => "outbound",
        }
    }
}

/// `direction|port|subset|hostname`, as Istio's `model.BuildSubsetKey`.
pub(crate) fn subset_key(direction: TrafficDirection, subset: &str, host: &str, port: u16) -> String {
    format!("{}|{}|{}|{}", direction.as_str(), port, subset, host)
}

/// `direction_.port_.subset_.hostname`, as Istio's `model.BuildDNSSrvSubsetKey`: the SNI of
/// ISTIO_MUTUAL clusters (a DNS-safe form of the cluster name).
pub(crate) fn dns_srv_subset_key(direction: TrafficDirection, subset: &str, host: &str, port: u16) -> String {
    format!("{}_.{}_.{}_.{}", direction.as_str(), port, subset, host)
}

/// Parses a subset key back into (direction, subset, host, port), as Istio's `ParseSubsetKey`.
pub(crate) fn parse_subset_key(key: &str) -> Option<(TrafficDirection, &str, &str, u16)> {
    let mut parts = key.splitn(4, '|');
    let direction = match parts.next()? {
        "inbound" => TrafficDirection::Inbound,
        "outbound" => TrafficDirection::Outbound,
        _ => return None,
    };
    let port = parts.next()?.parse().ok()?;
    let subset = parts.next()?;
    let host = parts.next()?;
    Some((direction, subset, host, port))
}

/// Parses `direction_.port_.subset_.hostname` (an SNI-DNAT cluster's name) back into (direction,
/// subset, host, port), as Istio's `ParseSubsetKey` for that form.
pub(crate) fn parse_dns_srv_subset_key(key: &str) -> Option<(TrafficDirection, &str, &str, u16)> {
    let (direction, rest) = if let Some(rest) = key.strip_prefix("outbound_.") {
        (TrafficDirection::Outbound, rest)
    } else {
        (TrafficDirection::Inbound, key.strip_prefix("inbound_.")?)
    };
    let (port, rest) = rest.split_once("_.")?;
    let (subset, host) = rest.split_once("_.")?;
    Some((direction, subset, host, port.parse().ok()?))
}

/// Route config name of a gateway server port: `http.<port>` (Istio's plaintext HTTP servers),
/// `https.<port>.<server name or port name>.<gateway name>.<namespace>` for HTTPS servers.
pub(crate) fn gateway_http_route_name(port: u32) -> String {
    format!("http.{port}")
}

pub(crate) fn gateway_https_route_name(
    port: u32,
    port_name: &str,
    gateway_name: &str,
    gateway_namespace: &str,
) -> String {
    format!("https.{port}.{port_name}.{gateway_name}.{gateway_namespace}")
}

pub(crate) const BLACK_HOLE_CLUSTER: &str = "BlackHoleCluster";
pub(crate) const PASSTHROUGH_CLUSTER: &str = "PassthroughCluster";
pub(crate) const INBOUND_PASSTHROUGH_CLUSTER_IPV4: &str = "InboundPassthroughCluster";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subset_key_round_trip() {
        let k = subset_key(
            TrafficDirection::Outbound,
            "v1",
            "reviews.default.svc.cluster.local",
            9080,
        );
        assert_eq!(k, "outbound|9080|v1|reviews.default.svc.cluster.local");
        assert_eq!(
            parse_subset_key(&k),
            Some((
                TrafficDirection::Outbound,
                "v1",
                "reviews.default.svc.cluster.local",
                9080
            ))
        );
        assert_eq!(parse_subset_key("outbound|x||h"), None);
    }

    #[test]
    fn dns_srv_subset_key_round_trip() {
        let k = dns_srv_subset_key(
            TrafficDirection::Outbound,
            "v1",
            "reviews.default.svc.cluster.local",
            9080,
        );
        assert_eq!(k, "outbound_.9080_.v1_.reviews.default.svc.cluster.local");
        assert_eq!(
            parse_dns_srv_subset_key(&k),
            Some((
                TrafficDirection::Outbound,
                "v1",
                "reviews.default.svc.cluster.local",
                9080
            ))
        );
        assert_eq!(
            parse_dns_srv_subset_key("outbound_.15443_._.a_.b.example.com"),
            Some((TrafficDirection::Outbound, "", "a_.b.example.com", 15443)),
            "the host keeps what follows the third separator"
        );
        assert_eq!(parse_dns_srv_subset_key("outbound|9080||h"), None);
        assert_eq!(parse_dns_srv_subset_key("outbound_.x_._.h"), None);
    }
}
