//! istiod's webhook configuration patchers: the caBundle (and, for validation, the failure
//! policy) that the API server needs to call istiod's webhooks on 15017, kept in the
//! configurations of istiod's revision. Two of Istio's controllers share this driver:
//! - `validating`: the validation controller (pkg/webhooks/validation/controller) for the
//!   ValidatingWebhookConfigurations labelled `istio.io/rev=<revision>`;
//! - `mutating`: the webhook cert patcher (pkg/webhooks/webhookpatch.go) for the
//!   MutatingWebhookConfigurations of the revision (the injector's, `istio-sidecar-injector`).
//!
//! Each watches its kind and hands the name of every configuration it sees to a per-key retry
//! queue (`queue`, Istio's `controllers.Queue`); a new CA bundle (`crate::serving_cert`) queues
//! every known configuration again. A configuration someone overwrites is seen by the watch and
//! patched again; one that fails is retried after its own delay while the others go on.

mod mutating;
mod patcher;
pub mod queue;
mod validating;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::watcher;
use kube::{Api, Resource};

pub use mutating::{MutatingMetrics, MutatingPatcher};
pub use patcher::{Outcome, Patcher};
pub use validating::{PatchMetrics, ValidatingPatcher};

use crate::serving_cert::Bundles;

/// Runs `patcher` until the process ends.
pub async fn run<P: Patcher>(patcher: P, client: kube::Client, mut bundles: Bundles) {
    let patcher = Arc::new(patcher);
    let api: Api<P::Config> = Api::all(client);
    let (queue, mut keys) = queue::queue(patcher.limiter());
    let known: Arc<Mutex<BTreeSet<String>>> = Arc::default();

    let watch = {
        let (api, queue, known) = (api.clone(), queue.clone(), known.clone());
        let mut config = watcher::Config::default();
        if let Some(selector) = patcher.selector() {
            config = config.labels(&selector);
        }
        async move {
            let mut events = watcher(api, config).boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) => {
                        let name = c.meta().name.clone().unwrap_or_default();
                        if let Ok(mut k) = known.lock() {
                            k.insert(name.clone());
                        }
                        queue.add(&name);
                    }
                    Ok(watcher::Event::Delete(c)) => {
                        if let Ok(mut k) = known.lock() {
                            k.remove(c.meta().name.as_deref().unwrap_or_default());
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!("{}: watching: {e}", P::NAME);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        }
    };
    let ca_source = bundles.clone();
    let new_bundles = {
        let (queue, known) = (queue.clone(), known.clone());
        let mut last = bundles.borrow_and_update().ca_bundle_pem.clone();
        async move {
            while bundles.changed().await.is_ok() {
                let ca = bundles.borrow_and_update().ca_bundle_pem.clone();
                if ca == last {
                    continue;
                }
                last = ca;
                let names: Vec<String> = known.lock().map(|k| k.iter().cloned().collect()).unwrap_or_default();
                tracing::info!(configurations = ?names, "{}: the CA bundle changed", P::NAME);
                for name in names {
                    queue.add(&name);
                }
            }
            std::future::pending::<()>().await;
        }
    };
    let worker = {
        let patcher = patcher.clone();
        async move {
            while let Some(name) = keys.next().await {
                let ca = ca_source.borrow().ca_bundle_pem.clone();
                match patcher.reconcile(&api, &name, &ca).await {
                    Outcome::Done => queue.done(&name),
                    Outcome::Retry => {
                        let delay = queue.retry(&name);
                        tracing::debug!(configuration = %name, ?delay, "{}: retrying", P::NAME);
                    }
                }
            }
        }
    };
    tokio::join!(watch, new_bundles, worker);
}
