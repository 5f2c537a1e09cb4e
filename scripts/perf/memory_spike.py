#!/usr/bin/env python3
"""Memory after a spike (issue 9): pilot-discovery on an empty --configDir; N ServiceEntries are
added (in files of 100), loaded, then removed, then one more is added (see below); prints RSS at
start, at the peak, and 5 s and 20 s after that. Usage: memory_spike.py PILOT_DISCOVERY_BINARY [N=100000]"""
import os, shutil, subprocess, sys, tempfile, time, urllib.request, json

binary = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 100000
port = 18000 + os.getpid() % 1000


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def services():
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
        for line in r.read().decode().splitlines():
            if line.startswith("pilot_services "):
                return float(line.split()[1])
    return -1


d = tempfile.mkdtemp(prefix="memspike-")
cfg = os.path.join(d, "config")
os.mkdir(cfg)
p = subprocess.Popen([binary, "discovery", "--configDir", cfg, "--secureGrpcAddr", "", "--grpcAddr", "127.0.0.1:0",
                      "--httpAddr", "127.0.0.1:0", "--monitoringAddr", f"127.0.0.1:{port}"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "RUST_LOG": "warn",
                          # the CA served on the plaintext port keeps its root here, not in the cwd
                          "ROOT_CA_DIR": os.path.join(d, "cacerts")})
try:
    for _ in range(100):
        try:
            services(); break
        except Exception:
            time.sleep(0.2)
    start = rss_mb(p.pid)
    peak = start
    for f in range(n // 100):
        docs = []
        for i in range(100):
            k = f * 100 + i
            docs.append(f"""apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: se-{k}, namespace: ns-{k % 50}}}
spec:
  hosts: [svc-{k}.example.com]
  ports: [{{number: 80, name: http, protocol: HTTP}}]
  resolution: STATIC
  endpoints: [{{address: 10.{k // 65536 % 256}.{k // 256 % 256}.{k % 256}}}]
""")
        with open(os.path.join(cfg, f".f{f}.yaml.tmp"), "w") as fh:
            fh.write("---\n".join(docs))
        os.rename(os.path.join(cfg, f".f{f}.yaml.tmp"), os.path.join(cfg, f"f{f}.yaml"))
    while services() < n:
        peak = max(peak, rss_mb(p.pid)); time.sleep(0.5)
    peak = max(peak, rss_mb(p.pid))
    loaded = rss_mb(p.pid)
    for f in os.listdir(cfg):
        os.remove(os.path.join(cfg, f))
    while services() > 0:
        peak = max(peak, rss_mb(p.pid)); time.sleep(0.5)
    # One more small change: a push keeps the previous push's context (to tell which proxies a
    # change concerns), so the spike's own context goes with the next push.
    with open(os.path.join(cfg, "one.yaml"), "w") as fh:
        fh.write("apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: one, namespace: default}\n"
                 "spec: {hosts: [one.example.com], ports: [{number: 80, name: http, protocol: HTTP}], resolution: DNS}\n")
    while services() != 1:
        time.sleep(0.5)
    time.sleep(5)
    after5 = rss_mb(p.pid)
    time.sleep(15)
    after20 = rss_mb(p.pid)
    print(json.dumps({"binary": binary, "services": n, "rss_start_mb": round(start), "rss_peak_mb": round(peak),
                      "rss_loaded_mb": round(loaded), "rss_5s_after_removal_mb": round(after5),
                      "rss_20s_after_removal_mb": round(after20)}))
finally:
    p.kill()
    shutil.rmtree(d, ignore_errors=True)
