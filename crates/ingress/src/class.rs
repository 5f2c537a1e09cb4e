//! Which Ingresses this mesh serves, as Istio's `shouldProcessIngressWithClass`
//! (`pilot/pkg/config/kube/ingress/virtualservices.go`): the `kubernetes.io/ingress.class`
//! annotation against meshConfig `ingressClass`, else the IngressClass named by
//! `spec.ingressClassName` (its controller must be `istio.io/ingress-controller`), else
//! meshConfig `ingressControllerMode` (`DEFAULT` takes Ingresses without a class, `STRICT` and
//! `OFF` do not).

use std::collections::BTreeMap;

use crate::{INGRESS_CLASS_ANNOTATION, IngressOptions};

/// Istio's `IstioIngressController`: the `spec.controller` of IngressClasses Istio serves.
pub const ISTIO_INGRESS_CONTROLLER: &str = "istio.io/ingress-controller";

/// Whether an Ingress with these annotations, whose `spec.ingressClassName` names an IngressClass
/// with controller `class_controller` (`None`: no class named, or no such IngressClass), is
/// served. An unknown `ingressControllerMode` serves none (Istio warns).
pub fn should_process_ingress_with_class(
    opts: &IngressOptions,
    annotations: &BTreeMap<String, String>,
    class_controller: Option<&str>,
) -> bool {
    if let Some(class) = annotations.get(INGRESS_CLASS_ANNOTATION) {
        return match opts.controller_mode.as_str() {
            "STRICT" | "DEFAULT" => *class == opts.ingress_class,
            _ => false,
        };
    }
    if let Some(controller) = class_controller {
        return controller == ISTIO_INGRESS_CONTROLLER;
    }
    opts.controller_mode == "DEFAULT"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Istio's `TestIngressClass`, case for case.
    #[test]
    fn istio_ingress_class_cases() {
        let istio = Some(ISTIO_INGRESS_CONTROLLER);
        let other = Some("foo");
        // (mode, annotation, IngressClass controller, served)
        let cases: &[(&str, &str, Option<&str>, bool)] = &[
            // Annotation
            ("DEFAULT", "nginx", None, false),
            ("STRICT", "nginx", None, false),
            ("OFF", "istio", None, false),
            ("DEFAULT", "istio", None, true),
            ("STRICT", "istio", None, true),
            ("DEFAULT", "", None, true),
            ("STRICT", "", None, false),
            // IngressClass
            ("DEFAULT", "", other, false),
            ("STRICT", "", other, false),
            ("DEFAULT", "", istio, true),
            ("STRICT", "", istio, true),
            // IngressClass and annotation: the annotation decides
            ("STRICT", "nginx", istio, false),
            ("STRICT", "istio", other, true),
            // an unknown mode
            ("SOMETIMES", "", None, false),
        ];
        for (i, &(mode, annotation, controller, want)) in cases.iter().enumerate() {
            let opts = IngressOptions {
                controller_mode: mode.into(),
                ..options()
            };
            let mut annotations = BTreeMap::new();
            if !annotation.is_empty() {
                annotations.insert(INGRESS_CLASS_ANNOTATION.to_owned(), annotation.to_owned());
            }
            assert_eq!(
                should_process_ingress_with_class(&opts, &annotations, controller),
                want,
                "case {i}: {mode} {annotation:?} {controller:?}"
            );
        }
    }

    #[test]
    fn the_annotation_is_compared_with_the_mesh_ingress_class() {
        let opts = IngressOptions {
            ingress_class: "internal".into(),
            ..options()
        };
        let with = |class: &str| BTreeMap::from([(INGRESS_CLASS_ANNOTATION.to_owned(), class.to_owned())]);
        assert!(should_process_ingress_with_class(&opts, &with("internal"), None));
        assert!(!should_process_ingress_with_class(&opts, &with("istio"), None));
    }

    fn options() -> IngressOptions {
        IngressOptions::new(&model::MeshConfig::default(), "cluster.local", "istio-system")
    }
}
