#!/usr/bin/env bash
# Installs what building the workspace needs beyond Rust: RE2's headers and library (Debian's
# libre2-dev; validation compiles regexes with RE2, as Envoy does) and pkg-config, with apt-get
# when they are missing and we are root on a machine with apt-get. Otherwise says what to install
# and fails. Logs go to stderr.
set -uo pipefail

log() { echo "install-build-deps: $*" >&2; }

if [[ -f /usr/include/re2/re2.h || -f /usr/local/include/re2/re2.h ]]; then
  exit 0
fi
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  log "RE2 is missing (re2/re2.h): install Debian's libre2-dev (sudo apt-get install libre2-dev)"
  exit 1
fi
log "installing libre2-dev"
if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libre2-dev) >&2; then
  log "could not install libre2-dev"
  exit 1
fi
