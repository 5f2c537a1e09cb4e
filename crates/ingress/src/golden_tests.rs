//! Istio's Ingress conversion goldens (`TestGoldenConversion`,
//! `../shared/corpus/istio/pilot/pkg/config/kube/ingress/testdata`): each `<case>.yaml` of
//! Ingresses, converted as Istio's test does (domain `mydomain`, `ingressControllerMode:
//! DEFAULT`), gives exactly the Gateways and VirtualServices of `<case>.yaml.golden`, each read
//! back as a typed config (metadata, annotations and specs; routes in order).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use model::config::parse_config;
use model::{Config, ConfigKey};
use serde_json::Value;

use crate::{IngressOptions, IngressTranslator};

fn testdata() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/corpus/istio/pilot/pkg/config/kube/ingress/testdata");
    assert!(
        dir.is_dir(),
        "Istio's Ingress conversion test data is missing: {} (the tests need ../shared beside the project)",
        dir.display()
    );
    dir
}

fn configs(path: &Path) -> Vec<Config> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()));
    docs.into_iter()
        .filter(|d| !d.is_null())
        .map(|d| parse_config(d, "default").unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

#[test]
fn istio_golden_conversions() {
    let dir = testdata();
    let mesh = model::MeshConfig {
        ingress_controller_mode: "DEFAULT".into(),
        ..Default::default()
    };
    let opts = IngressOptions::new(&mesh, "mydomain", "istio-system");
    let services: BTreeMap<(String, String), Vec<(String, u32)>> = BTreeMap::new();
    for case in ["simple", "tls", "overlay", "tls-no-secret"] {
        let mut t = IngressTranslator::new();
        for ingress in configs(&dir.join(format!("{case}.yaml"))) {
            assert!(t.apply(&ingress, false), "{case}: {}", ingress.key());
        }
        t.translate(&services, &opts);
        let want: BTreeMap<ConfigKey, Arc<Config>> = configs(&dir.join(format!("{case}.yaml.golden")))
            .into_iter()
            .map(|c| (c.key(), Arc::new(c)))
            .collect();
        let got = &t.output().configs;
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "{case}: the configs made"
        );
        for (key, want) in &want {
            assert_eq!(got.get(key), Some(want), "{case}: {key}");
        }
    }
}
