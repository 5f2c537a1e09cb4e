//! Deterministic bytes for messages with protobuf map fields. envoy-types generates map fields
//! as `HashMap`, and prost writes a map's entries in the map's iteration order, which differs
//! from one `HashMap` to the next even for equal contents. Equal resources must encode to equal
//! bytes: delta xDS sends a resource again when its bytes (its version) change, and shared
//! responses are compared by bytes.
//!
//! prost writes a map's entries one after the other, so sorting each run of entries in the
//! encoded message, in place, fixes the order without changing any length: the parents' length
//! prefixes stay valid. Which fields are maps comes from [`MapFields`] per type (the wire format
//! does not say), for the messages the generators fill with more than one entry.

use crate::type_url;

/// The map fields of a message, and the message fields below it that hold maps.
#[derive(Debug)]
pub(crate) struct MapFields {
    /// Field numbers of this message's map fields.
    pub maps: &'static [u32],
    /// (field number, its message's map fields) for message fields to descend into.
    pub nested: &'static [(u32, &'static MapFields)],
    /// (map field number, its entries' map fields) for maps whose values hold maps themselves
    /// (`Struct`s): an entry is a message (key 1, value 2), made canonical before the entries
    /// are sorted.
    pub entries: &'static [(u32, &'static MapFields)],
}

impl MapFields {
    const fn new(maps: &'static [u32], nested: &'static [(u32, &'static MapFields)]) -> MapFields {
        MapFields {
            maps,
            nested,
            entries: &[],
        }
    }
}

/// `google.protobuf.Struct`: `fields` (1), whose values are `Value`s.
static STRUCT: MapFields = MapFields {
    maps: &[1],
    nested: &[],
    entries: &[(1, &STRUCT_ENTRY)],
};
/// An entry of `Struct.fields`: its value (2) is a `Value`.
static STRUCT_ENTRY: MapFields = MapFields::new(&[], &[(2, &VALUE)]);
/// `google.protobuf.Value`: `struct_value` (5), `list_value` (6).
static VALUE: MapFields = MapFields::new(&[], &[(5, &STRUCT), (6, &LIST_VALUE)]);
/// `google.protobuf.ListValue`: `values` (1).
static LIST_VALUE: MapFields = MapFields::new(&[], &[(1, &VALUE)]);
/// `envoy.config.rbac.v3.RBAC`: `policies` (2).
static RBAC_RULES: MapFields = MapFields::new(&[2], &[]);
/// The RBAC filters (HTTP and network): `rules` (1) and `shadow_rules` (2).
static RBAC_FILTER: MapFields = MapFields::new(&[], &[(1, &RBAC_RULES), (2, &RBAC_RULES)]);
/// `JwtAuthentication`: `providers` (1) and `requirement_map` (5).
static JWT_AUTHN: MapFields = MapFields::new(&[1, 5], &[]);
/// `Metadata`: `filter_metadata` (1, `Struct`s: Istio's `services` and `workload` have several
/// fields), `typed_filter_metadata` (2).
static METADATA: MapFields = MapFields {
    maps: &[1, 2],
    nested: &[],
    entries: &[(1, &FILTER_METADATA_ENTRY)],
};
/// An entry of `Metadata.filter_metadata`: its value (2) is a `Struct`.
static FILTER_METADATA_ENTRY: MapFields = MapFields::new(&[], &[(2, &STRUCT)]);
/// `Route`: `metadata` (4), `typed_per_filter_config` (13).
static ROUTE: MapFields = MapFields::new(&[13], &[(4, &METADATA)]);
/// `VirtualHost`: `routes` (3), `typed_per_filter_config` (15).
static VIRTUAL_HOST: MapFields = MapFields::new(&[15], &[(3, &ROUTE)]);
/// `RouteConfiguration`: `virtual_hosts` (2), `typed_per_filter_config` (16).
static ROUTE_CONFIGURATION: MapFields = MapFields::new(&[16], &[(2, &VIRTUAL_HOST)]);
/// `Cluster`: `metadata` (25), `typed_extension_protocol_options` (36).
static CLUSTER: MapFields = MapFields::new(&[36], &[(25, &METADATA)]);
/// `LbEndpoint`: `metadata` (3).
static LB_ENDPOINT: MapFields = MapFields::new(&[], &[(3, &METADATA)]);
/// `LocalityLbEndpoints`: `lb_endpoints` (2), `metadata` (9).
static LOCALITY_LB_ENDPOINTS: MapFields = MapFields::new(&[], &[(2, &LB_ENDPOINT), (9, &METADATA)]);
/// `ClusterLoadAssignment`: `endpoints` (2), `named_endpoints` (5).
static CLUSTER_LOAD_ASSIGNMENT: MapFields = MapFields::new(&[5], &[(2, &LOCALITY_LB_ENDPOINTS)]);

/// The map fields of the messages of `type_url` that need sorting, if any.
pub(crate) fn map_fields(type_url: &str) -> Option<&'static MapFields> {
    match type_url {
        type_url::ROUTE => Some(&ROUTE_CONFIGURATION),
        type_url::VIRTUAL_HOST => Some(&VIRTUAL_HOST),
        type_url::CLUSTER => Some(&CLUSTER),
        type_url::ENDPOINT => Some(&CLUSTER_LOAD_ASSIGNMENT),
        "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
        | "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC" => Some(&RBAC_FILTER),
        "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication" => Some(&JWT_AUTHN),
        _ => None,
    }
}

/// Bytes that are not the protobuf wire format prost writes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed protobuf at byte {0}")]
pub(crate) struct WireError(pub usize);

/// Sorts, in place, every run of consecutive entries of the map fields `fields` names, in `buf`
/// and in the nested messages it names. Entries are ordered by their encoded bytes (key first).
pub(crate) fn sort_map_entries(buf: &mut [u8], fields: &MapFields) -> Result<(), WireError> {
    // (field number, start, end) of each length-delimited field of interest, in order
    let mut runs: Vec<(u32, usize, usize)> = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        let start = at;
        let key = varint(buf, &mut at)?;
        let field = u32::try_from(key >> 3).map_err(|_| WireError(start))?;
        match key & 7 {
            0 => {
                varint(buf, &mut at)?;
            }
            1 => at = skip(buf, at, 8)?,
            5 => at = skip(buf, at, 4)?,
            2 => {
                let len = usize::try_from(varint(buf, &mut at)?).map_err(|_| WireError(at))?;
                let body = at;
                at = skip(buf, at, len)?;
                if let Some((_, inner)) = fields.nested.iter().find(|(n, _)| *n == field) {
                    sort_map_entries(&mut buf[body..at], inner)?;
                } else if fields.maps.contains(&field) {
                    if let Some((_, entry)) = fields.entries.iter().find(|(n, _)| *n == field) {
                        sort_map_entries(&mut buf[body..at], entry)?;
                    }
                    runs.push((field, start, at));
                }
            }
            _ => return Err(WireError(start)),
        }
    }
    let mut i = 0;
    while i < runs.len() {
        let mut j = i + 1;
        while j < runs.len() && runs[j].0 == runs[i].0 && runs[j].1 == runs[j - 1].2 {
            j += 1;
        }
        if j - i > 1 {
            let (from, to) = (runs[i].1, runs[j - 1].2);
            let mut entries: Vec<&[u8]> = runs[i..j].iter().map(|&(_, s, e)| &buf[s..e]).collect();
            entries.sort_unstable();
            let sorted = entries.concat();
            buf[from..to].copy_from_slice(&sorted);
        }
        i = j;
    }
    Ok(())
}

fn varint(buf: &[u8], at: &mut usize) -> Result<u64, WireError> {
    let start = *at;
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*at).ok_or(WireError(start))?;
        *at += 1;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(WireError(start))
}

fn skip(buf: &[u8], at: usize, n: usize) -> Result<usize, WireError> {
    match at.checked_add(n) {
        Some(end) if end <= buf.len() => Ok(end),
        _ => Err(WireError(at)),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use prost::Message;

    use super::*;
    use crate::envoy::config::rbac::v3::{Policy, Rbac};
    use crate::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost};
    use crate::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;

    fn rbac(names: &[&str]) -> HttpRbac {
        let mut policies = HashMap::new();
        for n in names {
            policies.insert((*n).to_owned(), Policy::default());
        }
        HttpRbac {
            rules: Some(Rbac {
                action: 1,
                policies: policies.clone(),
                ..Default::default()
            }),
            shadow_rules: Some(Rbac {
                policies,
                ..Default::default()
            }),
            shadow_rules_stat_prefix: "istio_dry_run_allow_".into(),
            ..Default::default()
        }
    }

    fn route_config(filters: &[&str]) -> RouteConfiguration {
        let per_filter: HashMap<_, _> = filters
            .iter()
            .map(|f| {
                let any = crate::pbwkt::Any {
                    type_url: format!("type/{f}"),
                    value: f.as_bytes().to_vec(),
                };
                ((*f).to_owned(), any)
            })
            .collect();
        RouteConfiguration {
            name: "8080".into(),
            virtual_hosts: vec![VirtualHost {
                name: "a".into(),
                routes: vec![Route {
                    name: "r".into(),
                    typed_per_filter_config: per_filter.clone(),
                    ..Default::default()
                }],
                typed_per_filter_config: per_filter.clone(),
                ..Default::default()
            }],
            typed_per_filter_config: per_filter,
            ..Default::default()
        }
    }

    fn canonical<M: Message>(m: &M, fields: &MapFields) -> Vec<u8> {
        let mut b = m.encode_to_vec();
        sort_map_entries(&mut b, fields).unwrap();
        b
    }

    #[test]
    fn equal_messages_encode_to_equal_bytes_and_decode_unchanged() {
        let names: Vec<String> = (0..40).map(|i| format!("ns[default]-policy[p{i}]-rule[0]")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut reversed = names.clone();
        reversed.reverse();
        let (a, b) = (rbac(&names), rbac(&reversed));
        assert_eq!(a, b);
        // plain encodings of equal maps differ (40 entries: the odds of equal order are nil)
        let plain: std::collections::HashSet<Vec<u8>> = (0..4).map(|_| rbac(&names).encode_to_vec()).collect();
        assert!(plain.len() > 1, "HashMap order did not vary; the test proves nothing");
        let fields = map_fields("type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC").unwrap();
        let (ca, cb) = (canonical(&a, fields), canonical(&b, fields));
        assert_eq!(ca, cb);
        assert_eq!(ca.len(), a.encoded_len());
        assert_eq!(HttpRbac::decode(ca.as_slice()).unwrap(), a);
        assert_eq!(crate::pack(&a), crate::pack(&b), "pack sorts");

        let filters = [
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "x",
            "y",
            "z",
            "w",
        ];
        let mut other = filters;
        other.reverse();
        let fields = map_fields(type_url::ROUTE).unwrap();
        let (ra, rb) = (route_config(&filters), route_config(&other));
        let (ca, cb) = (canonical(&ra, fields), canonical(&rb, fields));
        assert_eq!(ca, cb);
        assert_eq!(RouteConfiguration::decode(ca.as_slice()).unwrap(), ra);
    }

    #[test]
    fn malformed_bytes_are_an_error_not_a_panic() {
        let fields = map_fields(type_url::ROUTE).unwrap();
        for bad in [
            &[0x12u8, 0x05, 0x01][..],
            &[0xff; 11][..],
            &[0x0b][..],
            &[0x12, 0x80][..],
        ] {
            let mut b = bad.to_vec();
            assert!(sort_map_entries(&mut b, fields).is_err(), "{bad:?}");
        }
        let mut empty = Vec::new();
        assert!(sort_map_entries(&mut empty, fields).is_ok());
    }

    /// Istio's cluster metadata: `filter_metadata.istio.services` is a list of `Struct`s of
    /// several fields, each `Struct` a `HashMap` of its own.
    fn cluster_with_services(services: usize) -> crate::envoy::config::cluster::v3::Cluster {
        use crate::pbwkt::{ListValue, Struct, Value, value::Kind};
        let text = |s: String| Value {
            kind: Some(Kind::StringValue(s)),
        };
        let service = |i: usize| Value {
            kind: Some(Kind::StructValue(Struct {
                fields: [
                    ("host", format!("s{i}.default.svc.cluster.local")),
                    ("name", format!("s{i}")),
                    ("namespace", "default".to_owned()),
                    ("extra", "x".to_owned()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), text(v)))
                .collect(),
            })),
        };
        let istio = Struct {
            fields: [
                (
                    "services".to_owned(),
                    Value {
                        kind: Some(Kind::ListValue(ListValue {
                            values: (0..services).map(service).collect(),
                        })),
                    },
                ),
                ("default_original_port".to_owned(), text("9080".into())),
            ]
            .into_iter()
            .collect(),
        };
        crate::envoy::config::cluster::v3::Cluster {
            name: "outbound|9080||s0.default.svc.cluster.local".into(),
            metadata: Some(crate::envoy::config::core::v3::Metadata {
                filter_metadata: [("istio".to_owned(), istio)].into_iter().collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn structs_in_metadata_encode_to_equal_bytes() {
        let plain: std::collections::HashSet<Vec<u8>> =
            (0..8).map(|_| cluster_with_services(3).encode_to_vec()).collect();
        assert!(plain.len() > 1, "HashMap order did not vary; the test proves nothing");
        let packed: std::collections::HashSet<Vec<u8>> =
            (0..8).map(|_| crate::pack(&cluster_with_services(3)).value).collect();
        assert_eq!(packed.len(), 1, "pack sorts the Structs' fields");
        let one = packed.into_iter().next().unwrap();
        assert_eq!(
            crate::envoy::config::cluster::v3::Cluster::decode(one.as_slice()).unwrap(),
            cluster_with_services(3)
        );
    }
}
