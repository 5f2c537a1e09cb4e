#!/usr/bin/env bash
# Installs what the network-namespace tests need (iptables, ip6tables, `ip netns`, curl) with
# apt-get when some of it is missing and we are root on a machine with apt-get. Otherwise does
# nothing. Never fails: scripts/check-netns-deps.sh then says what is still missing, and
# scripts/test.sh skips those tests. Logs go to stderr.
set -uo pipefail

log() { echo "install-netns-deps: $*" >&2; }

missing=()
for tool in ip iptables-restore iptables-save ip6tables-restore ip6tables-save curl; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  log "missing ${missing[*]}; not installing (needs root and apt-get)"
  exit 0
fi
log "installing iptables iproute2 curl (missing: ${missing[*]})"
if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables iproute2 curl) >&2; then
  log "could not install them: the network-namespace tests will be skipped"
fi
exit 0
