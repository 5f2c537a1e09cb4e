use serde_json::json;

use super::*;
use crate::testing::{node, push, service_entry};

fn dns_sidecar(capture: bool) -> Proxy {
    node(
        "sidecar",
        "10.0.0.9",
        "default",
        "default",
        json!({"DNS_CAPTURE": if capture { "true" } else { "false" }}),
    )
}

fn workload_entry(name: &str, ip: &str) -> serde_json::Value {
    crate::testing::config(
        "WorkloadEntry",
        name,
        "default",
        json!({"address": ip, "labels": {"app": "headless"}}),
    )
}

fn mesh() -> Vec<serde_json::Value> {
    vec![
        service_entry(
            "reviews",
            "default",
            json!({"hosts": ["reviews.default.svc.cluster.local"], "addresses": ["240.240.0.10"],
                "location": "MESH_INTERNAL", "resolution": "STATIC",
                "ports": [{"number": 9080, "name": "http", "protocol": "HTTP"}],
                "endpoints": [{"address": "10.1.0.1"}]}),
        ),
        // TCP without addresses: an allocated VIP for proxies that capture DNS
        service_entry(
            "db",
            "default",
            json!({"hosts": ["db.example.com"], "location": "MESH_EXTERNAL", "resolution": "DNS",
                "ports": [{"number": 5432, "name": "tcp", "protocol": "TCP"}]}),
        ),
        // resolution NONE without addresses: the endpoints' IPs
        service_entry(
            "headless",
            "default",
            json!({"hosts": ["headless.default.svc.cluster.local"], "location": "MESH_INTERNAL",
                "resolution": "NONE", "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                "workloadSelector": {"labels": {"app": "headless"}}}),
        ),
        workload_entry("h1", "10.2.0.1"),
        workload_entry("h2", "10.2.0.2"),
        // wildcard without addresses: nothing to answer
        service_entry(
            "wild",
            "default",
            json!({"hosts": ["*.wild.example.com"], "location": "MESH_EXTERNAL", "resolution": "NONE",
                "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}]}),
        ),
        // not exported to the proxy's namespace
        service_entry(
            "private",
            "other",
            json!({"hosts": ["private.other.svc.cluster.local"], "addresses": ["240.240.0.99"],
                "exportTo": ["."], "location": "MESH_INTERNAL", "resolution": "STATIC",
                "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}], "endpoints": [{"address": "10.3.0.1"}]}),
        ),
    ]
}

#[test]
fn the_table_holds_the_visible_hosts_with_their_addresses() {
    let push = push(mesh());
    let t = name_table(&push, &dns_sidecar(true)).table;
    assert_eq!(t["reviews.default.svc.cluster.local"].ips, ["240.240.0.10"]);
    assert_eq!(t["reviews.default.svc.cluster.local"].registry, "External");
    let db = &t["db.example.com"].ips;
    assert_eq!(db.len(), 1, "{db:?}");
    assert!(db[0].starts_with("240.240."), "allocated VIP: {db:?}");
    assert_eq!(t["headless.default.svc.cluster.local"].ips, ["10.2.0.1", "10.2.0.2"]);
    assert!(!t.contains_key("*.wild.example.com"));
    assert!(!t.contains_key("private.other.svc.cluster.local"), "not exported here");
    // the same VIP on every push of the same mesh
    let again = name_table(&crate::testing::push(mesh()), &dns_sidecar(true)).table;
    assert_eq!(again["db.example.com"].ips, *db);
    // a proxy that does not capture DNS has no use for allocated VIPs
    let t = name_table(&push, &dns_sidecar(false)).table;
    assert!(!t.contains_key("db.example.com"));
}

/// The VIP in the name table is the one the proxy's listeners are on: `<vip>_5432` for the TCP
/// ServiceEntry without addresses, for proxies that capture DNS; the wildcard for the others.
#[test]
fn an_allocated_vip_is_routable() {
    let push = push(mesh());
    let vip = name_table(&push, &dns_sidecar(true)).table["db.example.com"].ips[0].clone();
    let names = |p: &Proxy| -> Vec<String> {
        crate::lds::build_listeners(p, &push)
            .into_iter()
            .map(|l| l.name)
            .filter(|n| n.ends_with("_5432"))
            .collect()
    };
    assert_eq!(names(&dns_sidecar(true)), [format!("{vip}_5432")]);
    assert_eq!(names(&dns_sidecar(false)), ["0.0.0.0_5432"]);
}
