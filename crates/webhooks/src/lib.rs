//! istiod's admission webhooks, without the HTTPS server (pilot-discovery's `webhook` module):
//! reading an AdmissionReview and answering it (`admission`, Istio's `pkg/kube/adapter.go` and the
//! webhooks' `serve`), and the validating webhook's verdict (`validation`, Istio's
//! `pkg/webhooks/validation/server`), and the sidecar injector's verdict (`injection`, Istio's
//! `pkg/kube/inject/webhook.go`). Pure, so the fuzz targets drive it directly.
#![warn(unreachable_pub)]

pub mod admission;
pub mod injection;
pub mod validation;
