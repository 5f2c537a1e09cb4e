#!/usr/bin/env python3
"""The performance regression guard: runs the benchmark set of docs/perf.md and prints each figure
with its ratio to the last recorded one (docs/perf/baseline.json). Run it before and after a
change, on the same machine, and compare; ratios on these noisy 2-core machines move by ~10-20%
run to run, so a figure is flagged only past --tolerance (default 1.3x the wrong way).

    cargo build --release --bin pilot-discovery --bin loadgen --bin kube_load --bin gateway-figures
    python3 scripts/perf/guard.py            # full set, ~4 minutes
    python3 scripts/perf/guard.py --quick    # fewer proxies and changes, ~1 minute
    python3 scripts/perf/guard.py --record   # also write the figures as the new baseline

Not a test: it times things, so it prints and never fails CI. Exits 1 when a figure is past the
tolerance, so a developer's script can stop on it.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASELINE = ROOT / "docs/perf/baseline.json"
RELEASE = ROOT / "target/release"

# (benchmark, figure, lower is better?)
FIGURES = [
    ("reference_mesh", "convergence_p99_ms", True),
    ("reference_mesh", "raw_ratio", True),
    ("reference_mesh", "discovery_rss_mb", True),
    ("reference_mesh", "change_bytes_per_proxy", True),
    ("reference_mesh", "change_cpu_s_per_proxy", True),
    ("reference_mesh", "converged", False),
    ("reference_delta", "convergence_p99_ms", True),
    ("reference_delta", "change_bytes_per_proxy", True),
    ("unscoped", "convergence_p99_ms", True),
    ("unscoped", "discovery_rss_mb", True),
    ("unscoped", "converged", False),
    ("gateway", "p50_ms", True),
    ("gateway", "p99_ms", True),
    ("gateway", "storm_rds_updates_per_s", True),
    ("kube_churn", "churn_lag_p99_ms", True),
    ("kube_churn", "ready_seconds", True),
    ("kube_churn", "peak_rss_mb", True),
]


def last_json(cmd):
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    lines = out.stdout.splitlines()
    # loadgen and gateway-figures end with one JSON line; kube_load prints one indented object.
    for text in [lines[-1] if lines else "", out.stdout[out.stdout.find("\n{") + 1:]]:
        try:
            return json.loads(text)
        except ValueError:
            pass
    sys.exit(f"{' '.join(map(str, cmd))} failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def run(quick):
    proxies = "500" if quick else "2000"
    loadgen = [str(RELEASE / "loadgen"), "--scenario", "config-change", "--services", "1000",
               "--proxies", proxies, "--client", "light", "--json"]
    ref = last_json(loadgen + ["--namespaces", "50", "--sidecar-scope", "namespace"])
    ref_delta = last_json(loadgen + ["--namespaces", "50", "--sidecar-scope", "namespace", "--delta", "--no-raw"])
    unscoped = last_json(loadgen + ["--no-raw"])
    gw = last_json([str(RELEASE / "gateway-figures"), "--changes", "10" if quick else "40",
                    "--storm-seconds", "3", "--json"])
    kube = last_json([str(RELEASE / "kube_load"), "--services", "2000", "--churn-rate", "40",
                      "--churn-seconds", "10" if quick else "20"])
    return {
        "quick": quick,
        "reference_mesh": ref,
        "reference_delta": ref_delta,
        "unscoped": unscoped,
        "gateway": {
            "p50_ms": gw["change_to_first_request_ms"]["p50"],
            "p99_ms": gw["change_to_first_request_ms"]["p99"],
            "storm_rds_updates_per_s": gw["storm"]["rds_updates_per_s"],
        },
        "kube_churn": kube,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--record", action="store_true", help="write these figures to docs/perf/baseline.json")
    ap.add_argument("--tolerance", type=float, default=1.3)
    args = ap.parse_args()
    for exe in ["loadgen", "kube_load", "pilot-discovery", "gateway-figures"]:
        if not (RELEASE / exe).exists():
            sys.exit(f"target/release/{exe} missing: cargo build --release --bin pilot-discovery "
                     "--bin loadgen --bin kube_load --bin gateway-figures")
    if "ENVOY_BIN" not in os.environ:
        envoy = subprocess.run([str(ROOT / "scripts/install-envoy.sh")], capture_output=True, text=True)
        os.environ["ENVOY_BIN"] = envoy.stdout.strip()
    now = run(args.quick)
    base = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
    comparable = base.get("quick") == args.quick
    if base and not comparable:
        print(f"note: the baseline was recorded {'with' if base.get('quick') else 'without'} --quick: no ratios")
    worse = []
    print(f"{'benchmark':<16}{'figure':<26}{'now':>12}{'baseline':>12}{'ratio':>8}")
    for bench, fig, lower in FIGURES:
        v = now[bench].get(fig)
        b = base.get(bench, {}).get(fig) if comparable else None
        ratio = v / b if isinstance(v, (int, float)) and isinstance(b, (int, float)) and b else None
        bad = ratio is not None and (ratio > args.tolerance if lower else ratio < 1 / args.tolerance)
        if bad:
            worse.append(f"{bench}.{fig}")
        fmt = lambda x: "-" if x is None else f"{x:.4g}"  # noqa: E731
        print(f"{bench:<16}{fig:<26}{fmt(v):>12}{fmt(b):>12}{fmt(ratio):>8}{'  <- worse' if bad else ''}")
    if args.record:
        BASELINE.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"recorded {BASELINE.relative_to(ROOT)}")
    if worse:
        print(f"worse than {args.tolerance}x the baseline: {', '.join(worse)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
