#!/usr/bin/env bash
# Whether this machine can run the network-namespace tests (tests/sidecar.rs, the agent's
# iptables::tests::kernel, test-support's netns::tests): root, `ip netns`, iptables and ip6tables
# that can apply NAT rules in a fresh namespace, setpriv and curl. Probes a throwaway namespace.
#
# Exit 0: all of them can run. Exit 1: none can; the reason is on stdout. Exit 2: all but the
# TPROXY test can (the kernel has no TPROXY target); the reason is on stdout.
set -uo pipefail

if [[ "$(id -u)" != 0 ]]; then
  echo "not root (uid $(id -u))"
  exit 1
fi
for tool in ip iptables-restore iptables-save ip6tables-restore ip6tables-save setpriv curl; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "$tool is not installed"
    exit 1
  fi
done

ns="netns-check-$$"
if ! err="$(ip netns add "$ns" 2>&1)"; then
  echo "cannot create a network namespace (ip netns add: ${err:-failed})"
  exit 1
fi
trap 'ip netns del "$ns" >/dev/null 2>&1' EXIT
ip netns exec "$ns" ip link set lo up >/dev/null 2>&1

# Rules in the throwaway namespace only; it is deleted on exit.
apply() { # <iptables-restore|ip6tables-restore> <rules>
  local out
  if ! out="$(printf '%s' "$2" | ip netns exec "$ns" "$1" 2>&1)"; then
    echo "${out:-$1 failed}" | head -n 1
    return 1
  fi
}
nat=$'*nat\n:ISTIO_PROBE - [0:0]\n-A ISTIO_PROBE -p tcp -j REDIRECT --to-ports 15001\n-A OUTPUT -p tcp -j ISTIO_PROBE\nCOMMIT\n'
for restore in iptables-restore ip6tables-restore; do
  if ! why="$(apply "$restore" "$nat")"; then
    echo "$restore cannot apply NAT rules in a network namespace: $why"
    exit 1
  fi
done
tproxy=$'*mangle\n:ISTIO_PROBE - [0:0]\n-A ISTIO_PROBE -p tcp -j TPROXY --on-port 1 --tproxy-mark 1\nCOMMIT\n'
for restore in iptables-restore ip6tables-restore; do
  if ! why="$(apply "$restore" "$tproxy")"; then
    echo "the kernel has no TPROXY target ($restore: $why)"
    exit 2
  fi
done
exit 0
