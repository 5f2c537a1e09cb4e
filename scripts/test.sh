#!/usr/bin/env bash
# The one test command: installs Envoy (for the real-Envoy tests) if needed, then builds and runs
# every test in the workspace with cargo-nextest, or with `cargo test` where nextest is missing.
# Extra arguments go to the test runner, e.g. `scripts/test.sh -p generators` or `scripts/test.sh envoy`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

ENVOY_BIN="$(scripts/install-envoy.sh)"
export ENVOY_BIN
echo "test.sh: using $("$ENVOY_BIN" --version 2>/dev/null | grep -o 'version: .*' || echo "$ENVOY_BIN")" >&2

if [[ $# -eq 0 ]]; then
  set -- --workspace
fi

# End-to-end tests run the workspace's own binaries (pilot-discovery, ...) as processes: build them
# now so that no test runs a stale one.
locked=()
if [[ " $* " == *" --locked "* ]]; then
  locked=(--locked)
fi
cargo build --workspace --bins "${locked[@]}"

if cargo nextest --version >/dev/null 2>&1; then
  profile=default
  if [[ -n "${CI:-}" ]]; then
    profile=ci
  fi
  exec cargo nextest run --profile "$profile" "$@"
else
  echo "test.sh: cargo-nextest not found, using cargo test (cargo install cargo-nextest --locked for the faster runner)" >&2
  exec cargo test "$@"
fi
