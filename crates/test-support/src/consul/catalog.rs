//! The fake Consul's catalog: nodes and the service instances registered on them, with Raft-like
//! indexes as Consul's state store keeps them (one index per write, the services table's index,
//! and an index per service name that a write to that service moves, kept after the service is
//! gone).

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// A service instance as a test registers it (Consul's `AgentService` in a catalog register).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// The node it runs on; registering it registers the node.
    pub node: String,
    /// The node's address (an instance without `address` is reached there).
    pub node_address: String,
    pub datacenter: String,
    /// `ServiceID`, unique per node (Consul: the service name when empty).
    pub id: String,
    /// `ServiceName`.
    pub service: String,
    pub tags: Vec<String>,
    /// `ServiceAddress`, may be empty.
    pub address: String,
    pub port: u16,
    pub meta: BTreeMap<String, String>,
}

impl Instance {
    /// An instance of `service` with ID `id` on node `node` at `address:port`, in `dc1`, the
    /// node's address being the same.
    pub fn new(service: &str, id: &str, node: &str, address: &str, port: u16) -> Instance {
        Instance {
            node: node.into(),
            node_address: address.into(),
            datacenter: "dc1".into(),
            id: id.into(),
            service: service.into(),
            tags: Vec::new(),
            address: address.into(),
            port,
            meta: BTreeMap::new(),
        }
    }

    pub fn tag(mut self, tag: &str) -> Instance {
        self.tags.push(tag.into());
        self
    }

    pub fn meta(mut self, key: &str, value: &str) -> Instance {
        self.meta.insert(key.into(), value.into());
        self
    }

    /// As `/v1/catalog/service/<name>` lists it (Consul's `api.CatalogService`).
    fn catalog_json(&self, create: u64, modify: u64) -> Value {
        json!({
            "ID": "",
            "Node": self.node,
            "Address": self.node_address,
            "Datacenter": self.datacenter,
            "TaggedAddresses": {"lan": self.node_address, "wan": self.node_address},
            "NodeMeta": {},
            "ServiceKind": "",
            "ServiceID": self.id,
            "ServiceName": self.service,
            "ServiceTags": self.tags,
            "ServiceAddress": self.address,
            "ServiceWeights": {"Passing": 1, "Warning": 1},
            "ServiceMeta": self.meta,
            "ServicePort": self.port,
            "ServiceEnableTagOverride": false,
            "ServiceProxy": {"MeshGateway": {}, "Expose": {}},
            "ServiceConnect": {},
            "CreateIndex": create,
            "ModifyIndex": modify,
        })
    }
}

#[derive(Debug, Clone)]
struct Stored {
    instance: Instance,
    create: u64,
    modify: u64,
}

/// What the fake holds.
#[derive(Debug)]
pub(crate) struct Catalog {
    /// The last write's index (Consul's Raft index).
    pub(crate) index: u64,
    /// The services table's index: the last write to any service instance.
    services_index: u64,
    /// Per service name: the last write to one of its instances.
    service_index: BTreeMap<String, u64>,
    /// By (node, service ID).
    instances: BTreeMap<(String, String), Stored>,
    /// Restores of an older snapshot so far: each wakes every blocked query (Consul's
    /// `AbandonCh`).
    pub(crate) rewinds: u64,
}

impl Default for Catalog {
    fn default() -> Self {
        // a fresh Consul has written a few entries (its own node, autopilot) before any service
        Catalog {
            index: 5,
            services_index: 5,
            service_index: BTreeMap::new(),
            instances: BTreeMap::new(),
            rewinds: 0,
        }
    }
}

impl Catalog {
    pub(crate) fn register(&mut self, mut instance: Instance) {
        if instance.id.is_empty() {
            instance.id = instance.service.clone();
        }
        self.index += 1;
        let key = (instance.node.clone(), instance.id.clone());
        let create = self.instances.get(&key).map_or(self.index, |s| s.create);
        // the node's address and datacenter are the node's: every instance on it has them
        for s in self.instances.values_mut().filter(|s| s.instance.node == instance.node) {
            s.instance.node_address = instance.node_address.clone();
            s.instance.datacenter = instance.datacenter.clone();
        }
        let previous = self.instances.insert(
            key,
            Stored {
                instance: instance.clone(),
                create,
                modify: self.index,
            },
        );
        if let Some(p) = previous.filter(|p| p.instance.service != instance.service) {
            self.service_index.insert(p.instance.service, self.index);
        }
        self.touch(&instance.service);
    }

    /// Removes one instance, or the node with all its instances when `id` is `None`; true when
    /// something was removed.
    pub(crate) fn deregister(&mut self, node: &str, id: Option<&str>) -> bool {
        let gone: Vec<(String, String)> = self
            .instances
            .keys()
            .filter(|(n, i)| n == node && id.is_none_or(|id| id == i))
            .cloned()
            .collect();
        if gone.is_empty() {
            return false;
        }
        self.index += 1;
        for key in gone {
            if let Some(s) = self.instances.remove(&key) {
                self.touch(&s.instance.service);
            }
        }
        true
    }

    /// Sets every index to at most `index`, as a restored Raft snapshot would.
    pub(crate) fn rewind(&mut self, index: u64) {
        self.rewinds += 1;
        self.index = index;
        self.services_index = self.services_index.min(index);
        for i in self.service_index.values_mut() {
            *i = (*i).min(index);
        }
    }

    fn touch(&mut self, service: &str) {
        self.services_index = self.index;
        self.service_index.insert(service.to_owned(), self.index);
    }

    /// `/v1/catalog/services` and its index.
    pub(crate) fn services(&self) -> (u64, Value) {
        let mut out: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for s in self.instances.values() {
            let tags = out.entry(&s.instance.service).or_default();
            tags.extend(s.instance.tags.iter().map(String::as_str));
        }
        for tags in out.values_mut() {
            tags.sort_unstable();
            tags.dedup();
        }
        (self.services_index, json!(out))
    }

    /// `/v1/catalog/service/<name>` and its index (the services table's for a name never
    /// written, as Consul's `maxIndexForService`).
    pub(crate) fn service(&self, name: &str) -> (u64, Value) {
        let index = self.service_index.get(name).copied().unwrap_or(self.services_index);
        let list: Vec<Value> = self
            .instances
            .values()
            .filter(|s| s.instance.service == name)
            .map(|s| s.instance.catalog_json(s.create, s.modify))
            .collect();
        (index, Value::Array(list))
    }

    pub(crate) fn instances(&self, service: &str) -> Vec<Instance> {
        self.instances
            .values()
            .filter(|s| s.instance.service == service)
            .map(|s| s.instance.clone())
            .collect()
    }
}

/// A field of a JSON object by name, case-insensitively (Consul decodes with Go's
/// `encoding/json`, which matches field names so; python-consul sends `node`, `address`, ...).
pub(crate) fn field<'a>(obj: &'a Value, name: &str) -> Option<&'a Value> {
    obj.as_object()?
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)
}

/// A catalog register body (`{"Node", "Address", "Datacenter", "Service": {...}}`) as an
/// instance; `Err` names what is missing or wrong.
pub(crate) fn instance_from_register(body: &Value) -> Result<Option<Instance>, String> {
    let s = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_owned();
    let node = s(field(body, "Node"));
    if node.is_empty() {
        return Err("Must provide node".into());
    }
    let node_address = s(field(body, "Address"));
    if node_address.is_empty() {
        return Err("Must provide address".into());
    }
    let Some(svc) = field(body, "Service").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let service = s(field(svc, "Service"));
    if service.is_empty() {
        return Err("Must provide service name with Service".into());
    }
    let port = match field(svc, "Port") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| format!("Invalid service port {v}"))?,
    };
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|t| t.as_str().map(str::to_owned))
            .collect()
    };
    let meta = field(svc, "Meta")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    let datacenter = s(field(body, "Datacenter"));
    Ok(Some(Instance {
        node,
        node_address,
        datacenter: if datacenter.is_empty() {
            "dc1".into()
        } else {
            datacenter
        },
        id: s(field(svc, "ID")),
        service,
        tags: strings(field(svc, "Tags")),
        address: s(field(svc, "Address")),
        port,
        meta,
    }))
}

/// A Go duration as Consul's `wait` takes it (`10s`, `1500ms`, `1m30s`, `0.5s`).
pub(crate) fn parse_go_duration(s: &str) -> Option<std::time::Duration> {
    let mut total = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let n: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += n * scale;
        rest = &rest[unit_end..];
    }
    Some(std::time::Duration::from_secs_f64(total))
}
