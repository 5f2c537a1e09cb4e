//! The state-of-the-world ACK path: every EDS ACK of a sidecar repeats all its subscribed names
//! (2,000 for an unscoped sidecar of a 2,000-service mesh), and pilot-discovery reads and checks
//! each one. Reading an ACK as prost's `DiscoveryRequest` (what the server did before) against
//! reading and applying it as the server does now: names in the watch's (sorted) order, in an
//! order of their own (Envoy lists them from a hash set), and with one name changed.
//! Run: `cargo bench -p xds-server --bench ack`.

use bytes::Bytes;
use divan::Bencher;
use prost::Message;
use xds_api::envoy::service::discovery::v3::DiscoveryRequest;
use xds_server::ack_bench::AckPath;

const NAMES: &[usize] = &[200, 2000];

fn main() {
    divan::main();
}

/// `n` cluster names, sorted (the order the watch keeps them in).
fn names(n: usize) -> Vec<String> {
    let mut names: Vec<String> = (0..n)
        .map(|i| format!("outbound|8080||svc-{i}.ns-{}.svc.cluster.local", i % 10))
        .collect();
    names.sort();
    names
}

fn ack(names: Vec<String>) -> Bytes {
    DiscoveryRequest {
        version_info: "2026-11-24T16:00:00Z/42".into(),
        resource_names: names,
        type_url: xds_api::type_url::ENDPOINT.into(),
        response_nonce: "1".into(),
        ..Default::default()
    }
    .encode_to_vec()
    .into()
}

/// A fixed shuffle (no RNG dependency): every 7th name from each start.
fn shuffled(mut names: Vec<String>) -> Vec<String> {
    let n = names.len();
    let order: Vec<usize> = (0..7).flat_map(|s| (s..n).step_by(7)).collect();
    let mut out = Vec::with_capacity(n);
    for i in order {
        out.push(std::mem::take(&mut names[i]));
    }
    out
}

#[divan::bench(args = NAMES)]
fn prost_decode(b: Bencher, n: usize) {
    let bytes = ack(names(n));
    b.bench(|| DiscoveryRequest::decode(bytes.clone()).map(|r| r.resource_names.len()));
}

#[divan::bench(args = NAMES)]
fn ack_in_order(b: Bencher, n: usize) {
    let all = names(n);
    let mut path = AckPath::new(&all);
    let bytes = ack(all);
    b.bench_local(|| path.apply(bytes.clone()));
}

#[divan::bench(args = NAMES)]
fn ack_envoy_order(b: Bencher, n: usize) {
    let all = names(n);
    let mut path = AckPath::new(&all);
    let bytes = ack(shuffled(all));
    b.bench_local(|| path.apply(bytes.clone()));
}

/// The subscription alternates between two sets that differ in one name: a new set each time.
#[divan::bench(args = NAMES)]
fn ack_changed(b: Bencher, n: usize) {
    let all = names(n);
    let mut other = all.clone();
    other[n / 2] = "outbound|8080||other.ns.svc.cluster.local".into();
    let mut path = AckPath::new(&all);
    let (a, o) = (ack(all), ack(other));
    let mut flip = false;
    b.bench_local(|| {
        flip = !flip;
        path.apply(if flip { o.clone() } else { a.clone() })
    });
}
