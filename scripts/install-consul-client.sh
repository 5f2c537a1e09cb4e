#!/usr/bin/env bash
# Installs python-consul (Debian's python3-consul), the Consul client not written here that
# test-support's fake Consul is checked against (crates/test-support/src/consul/tests.rs), with
# apt-get when no Python 3 imports it and we are root on a machine with apt-get. Otherwise does
# nothing. Never fails: the test then fails saying how to install it. Logs go to stderr.
set -uo pipefail

log() { echo "install-consul-client: $*" >&2; }

for python in /usr/bin/python3 python3; do
  if "$python" -c 'import consul' >/dev/null 2>&1; then
    exit 0
  fi
done
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  log "python-consul is missing; not installing (needs root and apt-get): apt-get install python3-consul, or pip install python-consul"
  exit 0
fi
log "installing python3-consul"
if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-consul) >&2; then
  log "could not install python3-consul: the fake Consul's python-consul test will fail"
fi
exit 0
