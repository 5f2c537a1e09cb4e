//! The two answers of Consul's catalog API that the registry reads, typed as Consul's Go client
//! (`github.com/hashicorp/consul/api`) types them and Istio 1.7's Consul registry read them:
//! `/v1/catalog/services` (service names to their tags) and `/v1/catalog/service/<name>` (one
//! `CatalogService` per instance). Decoding is pure; a field the registry does not read is
//! ignored, a field it reads with the wrong type makes the whole answer malformed.

use std::collections::BTreeMap;

use serde::Deserialize;

/// `/v1/catalog/services`: every service name with the union of its instances' tags.
pub type Services = BTreeMap<String, Vec<String>>;

/// One service instance on one node, as `/v1/catalog/service/<name>` lists it (Consul's
/// `api.CatalogService`; only the fields Istio 1.7 read).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct CatalogService {
    /// The node's name.
    #[serde(rename = "Node", default)]
    pub node: String,
    /// The node's address: the instance's when it has no `ServiceAddress`.
    #[serde(rename = "Address", default)]
    pub address: String,
    /// The node's datacenter: the endpoint's locality.
    #[serde(rename = "Datacenter", default)]
    pub datacenter: String,
    /// Unique per node.
    #[serde(rename = "ServiceID", default)]
    pub service_id: String,
    #[serde(rename = "ServiceName", default)]
    pub service_name: String,
    /// `key|value` tags are the instance's labels; other tags are ignored.
    #[serde(rename = "ServiceTags", default, deserialize_with = "null_as_default")]
    pub service_tags: Vec<String>,
    #[serde(rename = "ServiceAddress", default)]
    pub service_address: String,
    /// `protocol` is the port's protocol; `external` makes the service mesh-external.
    #[serde(rename = "ServiceMeta", default, deserialize_with = "null_as_default")]
    pub service_meta: BTreeMap<String, String>,
    /// Kept wide so that a port out of range is reported, not a decoding error of the whole answer.
    #[serde(rename = "ServicePort", default)]
    pub service_port: i64,
}

impl CatalogService {
    /// Where the instance is reached: `ServiceAddress`, else the node's `Address` (Istio 1.7's
    /// `convertInstance`).
    pub fn endpoint_address(&self) -> &str {
        if self.service_address.is_empty() {
            &self.address
        } else {
            &self.service_address
        }
    }
}

/// Why an answer is not what the API documents.
#[derive(Debug, thiserror::Error)]
#[error("answer is not valid JSON of the expected shape: {0}")]
pub struct DecodeError(#[from] serde_json::Error);

/// Decodes `/v1/catalog/services` (a `null` tag list is an empty one).
pub fn decode_services(body: &[u8]) -> Result<Services, DecodeError> {
    let raw: BTreeMap<String, Option<Vec<String>>> = serde_json::from_slice(body)?;
    Ok(raw.into_iter().map(|(k, v)| (k, v.unwrap_or_default())).collect())
}

/// Decodes `/v1/catalog/service/<name>` (`null` is no instance).
pub fn decode_service(body: &[u8]) -> Result<Vec<CatalogService>, DecodeError> {
    let raw: Option<Vec<CatalogService>> = serde_json::from_slice(body)?;
    Ok(raw.unwrap_or_default())
}

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer of Consul 1.x for one instance, with the fields the registry does not read.
    const ONE: &str = r#"[{
        "ID": "40e4a748-2192-161a-0510-9bf59fe950b5", "Node": "node-a", "Address": "10.1.0.1",
        "Datacenter": "dc1", "TaggedAddresses": {"lan": "10.1.0.1", "wan": "10.1.0.1"},
        "NodeMeta": {"somekey": "somevalue"}, "CreateIndex": 51, "ModifyIndex": 51,
        "ServiceAddress": "172.17.0.3", "ServiceEnableTagOverride": false, "ServiceID": "web-1",
        "ServiceName": "web", "ServicePort": 8080, "ServiceMeta": {"protocol": "http"},
        "ServiceTaggedAddresses": {}, "ServiceTags": ["version|v1", "primary"],
        "ServiceProxy": {"DestinationServiceName": "", "Upstreams": null}, "Namespace": "default"
    }]"#;

    #[test]
    fn decodes_a_catalog_service_answer() {
        let got = decode_service(ONE.as_bytes()).unwrap();
        assert_eq!(
            got,
            vec![CatalogService {
                node: "node-a".into(),
                address: "10.1.0.1".into(),
                datacenter: "dc1".into(),
                service_id: "web-1".into(),
                service_name: "web".into(),
                service_tags: vec!["version|v1".into(), "primary".into()],
                service_address: "172.17.0.3".into(),
                service_meta: [("protocol".to_owned(), "http".to_owned())].into(),
                service_port: 8080,
            }]
        );
        assert_eq!(got[0].endpoint_address(), "172.17.0.3");
    }

    #[test]
    fn nulls_are_empty() {
        let got = decode_service(br#"[{"Node":"n","Address":"10.0.0.1","ServiceName":"db","ServiceTags":null,"ServiceMeta":null,"ServicePort":5432}]"#).unwrap();
        assert!(got[0].service_tags.is_empty() && got[0].service_meta.is_empty());
        assert_eq!(got[0].endpoint_address(), "10.0.0.1", "no ServiceAddress: the node's");
        assert!(decode_service(b"null").unwrap().is_empty());
        let services = decode_services(br#"{"consul": [], "web": ["version|v1"], "db": null}"#).unwrap();
        assert_eq!(services["db"], Vec::<String>::new());
        assert_eq!(services["web"], vec!["version|v1".to_owned()]);
    }

    #[test]
    fn a_wrong_shape_is_an_error() {
        for bad in [
            &b"[{\"Node\": "[..],
            b"[1, 2]",
            b"{}",
            br#"[{"ServicePort": "80"}]"#,
            br#"[{"ServiceTags": "a"}]"#,
        ] {
            assert!(decode_service(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        for bad in [&b"{\"web\": "[..], b"[]", br#"{"web": "x"}"#, br#"{"web": [1]}"#] {
            assert!(decode_services(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
