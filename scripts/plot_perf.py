#!/usr/bin/env python3
"""Plots docs/perf/loadgen.jsonl (one loadgen --json line per run) into docs/perf/loadgen.png:
convergence p99 and the raw limit against proxies (the latest config-change run of each mesh and
size), and pilot-discovery's peak RSS against proxies (those runs and ramp steps).

    python3 -m venv /tmp/plotenv && /tmp/plotenv/bin/pip install matplotlib
    /tmp/plotenv/bin/python scripts/plot_perf.py
"""
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

root = pathlib.Path(__file__).resolve().parent.parent
runs = [json.loads(line) for line in (root / "docs/perf/loadgen.jsonl").read_text().splitlines() if line.strip()]



def mesh(r):
    """The mesh a run used: the unscoped one (first round) or istio.io's reference mesh (issue 15)."""
    if r.get("sidecar_scope") == "namespace":
        return f"reference mesh ({r['services']} services, {r['namespaces']} namespaces)"
    return f"{r['services']} services, unscoped"


# The latest config-change run of each mesh and size: the file keeps every run, the plot the
# current figures.
latest = {}
for r in runs:
    if r["scenario"] == "config-change" and not r["delta"]:
        latest[(mesh(r), r["proxies"])] = r
change = sorted(latest.values(), key=lambda r: r["proxies"])


ramps = [r for r in runs if r["scenario"] == "ramp"]

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
for name in sorted({mesh(r) for r in change}):
    rs = [r for r in change if mesh(r) == name]
    xs = [r["proxies"] for r in rs]
    ax1.plot(xs, [r["convergence_p99_ms"] / 1000 for r in rs], "o-", label=f"convergence p99, {name}")
    raw = [r for r in rs if r.get("raw_p99_ms")]
    ax1.plot([r["proxies"] for r in raw], [r["raw_p99_ms"] / 1000 for r in raw], "s--", label=f"raw limit p99, {name}")
    ax2.plot(xs, [r["discovery_rss_mb"] for r in rs], "o-", label=f"config-change, {name}")
for r in ramps:
    steps = r["steps"]
    name = mesh(r) if r.get("sidecar_scope") == "namespace" else f"{r['services']} service(s)"
    ax2.plot([s["proxies"] for s in steps], [s["rss_mb"] for s in steps], ".-", label=f"ramp, {name}")
ax1.axhline(1.0, color="grey", lw=0.8, ls=":", label="target 1 s")
ax1.set_xscale("log")
ax1.set_yscale("log")
ax1.set_xlabel("proxies")
ax1.set_ylabel("seconds")
ax1.set_title("One VirtualService change: time to every ACK")
ax1.legend(fontsize=8)
ax2.axhline(100, color="grey", lw=0.8, ls=":", label="target 100 MB (reference, 2,000)")
ax2.axhline(1024, color="grey", lw=0.8, ls="-.", label="target 1 GB (reference, 25,000)")
ax2.set_xscale("log")
ax2.set_yscale("log")
ax2.set_xlabel("proxies")
ax2.set_ylabel("MB")
ax2.set_title("pilot-discovery peak RSS")
ax2.legend(fontsize=8)
fig.tight_layout()
out = root / "docs/perf/loadgen.png"
fig.savefig(out, dpi=110)
print(out)
