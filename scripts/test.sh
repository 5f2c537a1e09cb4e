#!/usr/bin/env bash
# The one test command: installs Envoy (for the real-Envoy tests) and, as root with apt-get, RE2
# (scripts/install-build-deps.sh), what the network-namespace tests need and python-consul (the
# Consul client the fake Consul is checked against), then builds and runs
# every test in the workspace with cargo-nextest, or with `cargo test` where nextest is missing.
# Extra arguments go to the test runner, e.g. `scripts/test.sh -p generators` or
# `scripts/test.sh envoy`.
#
# The network-namespace tests (tests/sidecar.rs, tests/destination_rule.rs, tests/authorization.rs,
# tests/dns.rs, tests/egress_gateway.rs, tests/readme.rs, tests/install.rs, tests/injected_pod.rs,
# the agent's iptables::tests::kernel, test-support's netns::tests) fail on a machine that cannot
# run them; here they are detected up front (scripts/check-netns-deps.sh) and skipped with a line
# saying why, so that the runner reports them as skipped, not passed.
#
#   TEST_SH_DRY_RUN=1   print the test command instead of building and running it
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

ENVOY_BIN="$(scripts/install-envoy.sh)"
export ENVOY_BIN
echo "test.sh: using $("$ENVOY_BIN" --version 2>/dev/null | grep -o 'version: .*' || echo "$ENVOY_BIN")" >&2

scripts/install-build-deps.sh
scripts/install-netns-deps.sh
scripts/install-consul-client.sh

if [[ $# -eq 0 ]]; then
  set -- --workspace
fi

# The network-namespace tests, as a nextest filterset and as `cargo test --skip` patterns (test
# names: e2e's sidecar tests are in its module `netns`).
NETNS_FILTER='(package(e2e) & (binary(sidecar) | binary(destination_rule) | binary(authorization) | binary(dns) | binary(egress_gateway) | binary(readme) | binary(install) | binary(injected_pod)) & test(/^netns::/)) | (package(test-support) & test(/^netns::tests::/)) | (package(agent) & test(/^iptables::tests::kernel::/))'
NETNS_SKIP=(netns:: iptables::tests::kernel::)
TPROXY_FILTER='package(agent) & test(=iptables::tests::kernel::tproxy_applies_and_cleans_up_in_a_network_namespace)'
TPROXY_SKIP=(iptables::tests::kernel::tproxy_applies_and_cleans_up_in_a_network_namespace)

# The README's image example needs a Docker engine (the docker client alone is not enough).
DOCKER_FILTER='package(e2e) & binary(install) & test(/^docker::/)'
DOCKER_SKIP=(docker::)

exclude=""
skip=()
status=0
why="$(scripts/check-netns-deps.sh)" || status=$?
case "$status" in
  0) ;;
  2)
    echo "test.sh: skipping the TPROXY kernel test (agent iptables::tests::kernel::tproxy_*): $why" >&2
    exclude="$TPROXY_FILTER"
    skip=("${TPROXY_SKIP[@]}")
    ;;
  *)
    echo "test.sh: skipping the network-namespace tests (e2e sidecar, destination_rule, authorization, dns, egress_gateway, readme, install and injected_pod, agent iptables::tests::kernel, test-support netns::tests): ${why:-check-netns-deps.sh failed}" >&2
    exclude="$NETNS_FILTER"
    skip=("${NETNS_SKIP[@]}")
    ;;
esac

if ! docker info >/dev/null 2>&1; then
  echo "test.sh: skipping the README's image example (e2e install docker::): no Docker engine (docker info fails)" >&2
  exclude="${exclude:+($exclude) | }($DOCKER_FILTER)"
  skip+=("${DOCKER_SKIP[@]}")
fi

# End-to-end tests run the workspace's own binaries (pilot-discovery, ...) as processes: build them
# now so that no test runs a stale one.
locked=()
if [[ " $* " == *" --locked "* ]]; then
  locked=(--locked)
fi

run() {
  if [[ -n "${TEST_SH_DRY_RUN:-}" ]]; then
    printf '%q ' "$@" >&2
    echo >&2
    exit 0
  fi
  cargo build --workspace --bins "${locked[@]}"
  exec "$@"
}

if cargo nextest --version >/dev/null 2>&1; then
  profile=default
  if [[ -n "${CI:-}" ]]; then
    profile=ci
  fi
  if [[ -z "$exclude" ]]; then
    run cargo nextest run --profile "$profile" "$@"
  fi
  # nextest runs the union of several filtersets: join the caller's into one and intersect it with
  # the exclusion, so that the excluded tests are reported as skipped.
  args=()
  filtersets=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --)
        args+=("$@")
        break
        ;;
      -E | --filterset | --filter-expr)
        filtersets+=("${2:?$1 needs a filterset}")
        shift
        ;;
      --filterset=* | --filter-expr=*) filtersets+=("${1#*=}") ;;
      -E?*) filtersets+=("${1#-E}") ;;
      *) args+=("$1") ;;
    esac
    shift
  done
  filter="not ($exclude)"
  if [[ ${#filtersets[@]} -gt 0 ]]; then
    joined="$(printf ' | (%s)' "${filtersets[@]}")"
    filter="(${joined# | }) & $filter"
  fi
  # The filterset goes before the caller's arguments, which may end with `-- <test binary args>`.
  run cargo nextest run --profile "$profile" -E "$filter" "${args[@]}"
else
  echo "test.sh: cargo-nextest not found, using cargo test (cargo install cargo-nextest --locked for the faster runner)" >&2
  if [[ ${#skip[@]} -eq 0 ]]; then
    run cargo test "$@"
  fi
  skip_args=()
  for name in "${skip[@]}"; do
    skip_args+=(--skip "$name")
  done
  if [[ " $* " == *" -- "* ]]; then
    run cargo test "$@" "${skip_args[@]}"
  fi
  run cargo test "$@" -- "${skip_args[@]}"
fi
