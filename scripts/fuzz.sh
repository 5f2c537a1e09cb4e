#!/usr/bin/env bash
# Runs the fuzz targets (fuzz/, cargo-fuzz with libFuzzer and AddressSanitizer, on the nightly
# toolchain) over their committed corpora (fuzz/corpus/<target>):
#
#   scripts/fuzz.sh SECONDS [TARGET...]   fuzz each target for SECONDS (all targets by default)
#
# New inputs that add coverage are written to fuzz/corpus/<target>; a crash, hang or leak stops
# the run with the input in fuzz/artifacts/<target>: copy it to fuzz/regressions/<target> so that
# the workspace's tests (crates/fuzzing/tests/replay.rs) replay it from then on.
#
# The build goes to $FUZZ_TARGET_DIR (default ~/.cache/pilot-rs/fuzz-target), outside the
# checkout, so that CI's clean clones reuse the compiled dependencies.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT/fuzz"

seconds="${1:?usage: scripts/fuzz.sh SECONDS [TARGET...]}"
shift
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(config xds_request agent_xds_proxy admission_review inject_review dns_message kube_object sds_request)
fi

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz.sh: FAILED: the nightly toolchain is missing (rustup toolchain install nightly): cargo-fuzz needs it" >&2
  exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked
fi
"$ROOT/scripts/install-build-deps.sh"

export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$HOME/.cache/pilot-rs/fuzz-target}"
echo "fuzz.sh: building the fuzz targets in $CARGO_TARGET_DIR" >&2
cargo +nightly fuzz build -O
for t in "${targets[@]}"; do
  echo "fuzz.sh: $t for ${seconds}s over $(find "corpus/$t" -type f | wc -l) corpus inputs" >&2
  cargo +nightly fuzz run -O "$t" -- -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=30 \
    -max_len=65536 -print_final_stats=1 2>&1 | grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb|==[0-9]+==ERROR|SUMMARY|Done )' >&2 || true
  if [[ -n "$(find "artifacts/$t" -type f 2>/dev/null)" ]]; then
    echo "fuzz.sh: $t FAILED: see fuzz/artifacts/$t" >&2
    exit 1
  fi
done
