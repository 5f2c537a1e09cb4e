//! Conversion as Istio 1.7's `conversion_test.go` checks it, and what this registry adds: unique
//! port names, instances that cannot be served left out.

use super::*;

fn instance(node: &str, id: &str, addr: &str, port: i64, tags: &[&str], meta: &[(&str, &str)]) -> CatalogService {
    CatalogService {
        node: node.into(),
        address: "10.9.9.9".into(),
        datacenter: "dc1".into(),
        service_id: id.into(),
        service_name: "web".into(),
        service_tags: tags.iter().map(|t| (*t).to_owned()).collect(),
        service_address: addr.into(),
        service_meta: meta.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        service_port: port,
    }
}

#[test]
fn a_service_as_istio_1_7_converts_it() {
    let instances = [
        instance("b", "web-2", "10.0.0.2", 8080, &["version|v2"], &[("protocol", "http")]),
        instance(
            "a",
            "web-1",
            "",
            8080,
            &["version|v1", "primary", "zone|east|x"],
            &[("protocol", "http")],
        ),
    ];
    let (got, problems) = convert("web", &instances, "cluster.local");
    assert!(problems.is_empty(), "{problems:?}");
    let got = got.expect("a service");
    let s = &got.service;
    assert_eq!(s.hostname, "web.service.consul");
    assert_eq!(s.namespace(), "default");
    assert_eq!(s.attributes.name, "web.service.consul");
    assert_eq!(s.attributes.service_registry, "Consul");
    assert_eq!(
        s.attributes.service_accounts,
        ["spiffe://cluster.local/ns/default/sa/default"]
    );
    assert!(s.addresses.is_empty() && !s.mesh_external);
    assert_eq!(s.resolution, Resolution::ClientSideLb);
    assert_eq!(
        s.ports,
        [Port {
            name: "http".into(),
            port: 8080,
            protocol: Protocol::Http
        }]
    );
    // sorted by node: a before b; no ServiceAddress: the node's address
    let e = &got.endpoints;
    assert_eq!((e[0].address.as_str(), e[0].endpoint_port), ("10.9.9.9", 8080));
    assert_eq!(e[1].address, "10.0.0.2");
    assert_eq!(
        e[0].labels,
        [("version", "v1"), ("zone", "east")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect::<BTreeMap<_, _>>(),
        "key|value tags only; a third part is dropped"
    );
    assert_eq!(e[0].locality.region, "dc1");
    assert_eq!(e[0].service_port_name, "http");
    assert_eq!(e[0].namespace, "default");
    assert_eq!(e[0].origin, "Consul/web/a/web-1");
    assert_eq!(e[0].tls_mode(), "disabled", "no tlsMode tag, no service account");
}

#[test]
fn protocol_from_meta_else_tcp() {
    let cases = [
        (vec![], "tcp", Protocol::Tcp),
        (vec![("protocol", "grpc")], "grpc", Protocol::Grpc),
        (vec![("protocol", "HTTP2")], "HTTP2", Protocol::Http2),
        (vec![("protocol", "")], "tcp", Protocol::Tcp),
        (vec![("protocol", "carrier-pigeon")], "carrier-pigeon", Protocol::Tcp),
    ];
    for (meta, name, protocol) in cases {
        let (got, _) = convert("db", &[instance("a", "db-1", "10.0.0.1", 5432, &[], &meta)], "td");
        let port = &got.expect("service").service.ports[0];
        assert_eq!((port.name.as_str(), port.protocol), (name, protocol), "{meta:?}");
    }
}

#[test]
fn ports_by_number_first_protocol_wins_and_names_are_unique() {
    let instances = [
        instance("a", "1", "10.0.0.1", 80, &[], &[("protocol", "http")]),
        instance("b", "2", "10.0.0.2", 80, &[], &[("protocol", "tcp")]),
        instance("c", "3", "10.0.0.3", 81, &[], &[("protocol", "http")]),
    ];
    let (got, _) = convert("web", &instances, "td");
    let got = got.expect("service");
    let ports: Vec<(&str, u16, Protocol)> = got
        .service
        .ports
        .iter()
        .map(|p| (p.name.as_str(), p.port, p.protocol))
        .collect();
    assert_eq!(ports, [("http", 80, Protocol::Http), ("http-81", 81, Protocol::Http)]);
    let names: Vec<&str> = got.endpoints.iter().map(|e| e.service_port_name.as_str()).collect();
    assert_eq!(names, ["http", "http", "http-81"], "each endpoint on its port's name");
}

#[test]
fn external_meta_makes_it_mesh_external() {
    let (got, _) = convert(
        "api",
        &[instance(
            "a",
            "1",
            "93.184.216.34",
            443,
            &[],
            &[("external", "api.example.com")],
        )],
        "td",
    );
    let s = got.expect("service").service;
    assert!(s.mesh_external);
    assert_eq!(s.resolution, Resolution::Passthrough);
}

#[test]
fn instances_that_cannot_be_served_are_left_out_and_named() {
    let instances = [
        instance("a", "ok", "10.0.0.1", 80, &[], &[]),
        instance("b", "no-port", "10.0.0.2", 0, &[], &[]),
        instance("c", "big-port", "10.0.0.3", 70000, &[], &[]),
        instance("d", "dns", "web.internal", 80, &[], &[]),
    ];
    let (got, problems) = convert("web", &instances, "td");
    assert_eq!(got.expect("service").endpoints.len(), 1);
    let what: Vec<&str> = problems.iter().map(|p| p.what.as_str()).collect();
    assert_eq!(
        what,
        [
            "instance web/b/no-port",
            "instance web/c/big-port",
            "instance web/d/dns"
        ]
    );
    assert!(problems[2].reason.contains("\"web.internal\""), "{problems:?}");
    // none left: no service
    let (none, problems) = convert("web", &instances[1..], "td");
    assert!(none.is_none());
    assert_eq!(problems.len(), 3);
}

#[test]
fn a_name_that_makes_no_host_name_is_refused() {
    for bad in ["", "*", "web/admin", "a..b", "we b"] {
        let (got, problems) = convert(bad, &[instance("a", "1", "10.0.0.1", 80, &[], &[])], "td");
        assert!(got.is_none(), "{bad:?}");
        assert_eq!(problems.len(), 1, "{bad:?}");
    }
    for good in ["web", "web-api_v2", "a.b"] {
        assert!(
            convert(good, &[instance("a", "1", "10.0.0.1", 80, &[], &[])], "td")
                .0
                .is_some()
        );
    }
}
