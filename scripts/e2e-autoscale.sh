#!/usr/bin/env bash
# The HorizontalPodAutoscaler on pool health, for real, against a cluster from
# scripts/kube-up.sh with its test node (as root):
#   - Prometheus (Debian's package) scrapes the mail Pods' /metrics, labelled
#     namespace/pod as the operator's ServiceMonitor labels them. Debian builds
#     Prometheus without Kubernetes discovery, so the script does what kubernetes_sd
#     (role pod) would: every 2 s it lists the Pods through the API server and
#     writes their admin ports as file_sd targets;
#   - prometheus-adapter (scripts/monitoring-build.sh builds it from its Go module)
#     with the rules of manifests/autoscaling/prometheus-adapter-rules.yaml serves
#     custom.metrics.k8s.io through the API server's aggregation layer;
#   - a MailCluster whose SMTP Deployment is scaled by the operator's HPA on
#     mail_pool_saturation (no CPU target: this cluster has no metrics-server),
#     with a connection budget that caps maxReplicas 4 -> 3;
#   - an open-loop deliver that keeps the database pool busy: the HPA scales up
#     within its window, and back down to minReplicas after the load; replicas x
#     poolSize stays within the budget throughout (the operator's plan and
#     PostgreSQL's own count of the database's connections).
#
#   eval "$(scripts/kube-up.sh)" && scripts/e2e-autoscale.sh
#
# With E2E_RECORD=DIR the timeline (replicas, saturation, P95, connections) is
# written to DIR/hpa-timeline.csv and plotted in DIR/hpa-timeline.svg.
# Bounded: load E2E_LOAD_SECS (default 150 s) at E2E_RATE msg/s (default 600)
# against a target of E2E_POOL_SATURATION percent (default 10). Group commit makes
# a pool of 4 a light load: a debug-build pod over PostgreSQL averages about 0.2
# of it busy at 600 msg/s and 0.37 at 1,500 (its most), and 0 at rest, so the
# target sits between rest and load, not near a capacity this machine cannot
# offer next to the control plane;
# scaling up must happen within E2E_UP_SECS (default 120 s) of the load's start,
# scaling down within E2E_DOWN_SECS (default 600 s: the HPA's 300 s stabilisation
# window, then one Pod per 120 s) of its end.
set -euo pipefail
source "$(dirname "$0")/e2e-lib.sh"
RATE="${E2E_RATE:-600}"
LOAD_SECS="${E2E_LOAD_SECS:-150}"
SATURATION="${E2E_POOL_SATURATION:-10}"
UP_SECS="${E2E_UP_SECS:-120}"
DOWN_SECS="${E2E_DOWN_SECS:-600}"
POOL=4
MAX_CONNECTIONS=28
RESERVED=10
WORK=$(mktemp -d)
ADAPTER_PORT=16446
PROM_PORT=19090

stop_background() {
    local pid
    for pid in ${LOAD_PID:-} ${SAMPLER_PID:-} ${ADAPTER_PID:-} ${PROM_PID:-} ${DISCOVER_PID:-}; do
        kill "$pid" 2>/dev/null || true
    done
    kubectl delete apiservice v1beta1.custom.metrics.k8s.io v1beta2.custom.metrics.k8s.io \
        --ignore-not-found >/dev/null 2>&1 || true
    if [ "${E2E_KEEP:-0}" != 1 ]; then rm -rf "$WORK"; else echo "work files kept in $WORK" >&2; fi
}
E2E_CLEANUP_HOOKS+=(stop_background)
print_monitoring_logs() { # exit-status
    [ "$1" -ne 0 ] && [ -f "$WORK/adapter.log" ] || return 0
    echo "---- prometheus-adapter ----" >&2; tail -n 20 "$WORK/adapter.log" >&2
    echo "---- prometheus ----" >&2; tail -n 10 "$WORK/prometheus.log" >&2
}
E2E_CLEANUP_HOOKS=(print_monitoring_logs "${E2E_CLEANUP_HOOKS[@]}")

step "prometheus and prometheus-adapter binaries"
command -v prometheus >/dev/null || die "prometheus is not installed (apt-get install prometheus; scripts/test.sh does)"
ADAPTER=$("$ROOT/scripts/monitoring-build.sh" | tail -n 1)
[ -x "$ADAPTER" ] || die "no prometheus-adapter at $ADAPTER"
prometheus --version 2>&1 | head -n 1

e2e_prepare

step "Prometheus on 127.0.0.1:$PROM_PORT: the mail Pods of $NS, every 5 s"
# What kubernetes_sd_configs (role pod) with the usual relabelling gives: each
# running mail Pod's admin port, labelled namespace, pod and component.
discover() {
    while :; do
        kubectl get pods -n "$NS" -l app.kubernetes.io/name=mailcluster -o json 2>/dev/null | python3 -c '
import json, sys
targets = []
for p in json.load(sys.stdin)["items"]:
    ip = p["status"].get("podIP")
    if p["status"].get("phase") != "Running" or not ip or p["metadata"].get("deletionTimestamp"):
        continue
    for c in p["spec"]["containers"]:
        for port in c.get("ports", []):
            if port.get("name") == "admin":
                address = ip + ":" + str(port["containerPort"])
                targets.append({"targets": [address], "labels": {
                    "namespace": p["metadata"]["namespace"], "pod": p["metadata"]["name"],
                    "component": p["metadata"]["labels"].get("app.kubernetes.io/component", "")}})
json.dump(targets, open(sys.argv[1] + ".tmp", "w"))
' "$WORK/targets.json" && mv "$WORK/targets.json.tmp" "$WORK/targets.json"
        sleep 2
    done
}
echo '[]' >"$WORK/targets.json"
discover &
DISCOVER_PID=$!
cat >"$WORK/prometheus.yml" <<YAML
global: {scrape_interval: 5s, scrape_timeout: 4s, evaluation_interval: 5s}
scrape_configs:
  - job_name: mailcluster
    file_sd_configs: [{files: ["$WORK/targets.json"], refresh_interval: 5s}]
YAML
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
    --web.listen-address="127.0.0.1:$PROM_PORT" >"$WORK/prometheus.log" 2>&1 &
PROM_PID=$!
until_true "Prometheus ready" curl -fsS "http://127.0.0.1:$PROM_PORT/-/ready"

step "prometheus-adapter on $NODE_IP:$ADAPTER_PORT with manifests/autoscaling/prometheus-adapter-rules.yaml"
python3 - "$ROOT/manifests/autoscaling/prometheus-adapter-rules.yaml" >"$WORK/adapter.yaml" <<'PY'
import sys, yaml
print(yaml.safe_load(open(sys.argv[1]))["data"]["config.yaml"])
PY
"$ADAPTER" --secure-port="$ADAPTER_PORT" --bind-address="$NODE_IP" --cert-dir="$WORK/adapter-certs" \
    --lister-kubeconfig="$KUBECONFIG" --authentication-kubeconfig="$KUBECONFIG" \
    --authorization-kubeconfig="$KUBECONFIG" --prometheus-url="http://127.0.0.1:$PROM_PORT" \
    --config="$WORK/adapter.yaml" --metrics-relist-interval=10s >"$WORK/adapter.log" 2>&1 &
ADAPTER_PID=$!
# The aggregation layer reaches the adapter through a Service without selector.
kubectl apply -n "$NS" -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata: {name: custom-metrics}
spec:
  ports: [{name: https, port: 443, targetPort: $ADAPTER_PORT}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: custom-metrics-host
  labels: {kubernetes.io/service-name: custom-metrics}
addressType: IPv4
ports: [{name: https, port: $ADAPTER_PORT, protocol: TCP}]
endpoints: [{addresses: ["$NODE_IP"], conditions: {ready: true}}]
YAML
for v in v1beta1:100 v1beta2:200; do
    kubectl apply -f - >/dev/null <<YAML
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: ${v%:*}.custom.metrics.k8s.io}
spec:
  group: custom.metrics.k8s.io
  version: ${v%:*}
  service: {name: custom-metrics, namespace: $NS, port: 443}
  insecureSkipTLSVerify: true
  groupPriorityMinimum: 100
  versionPriority: ${v#*:}
YAML
done
until_true "custom.metrics.k8s.io available" sh -c \
    "kubectl get apiservice v1beta2.custom.metrics.k8s.io -o jsonpath='{.status.conditions[?(@.type==\"Available\")].status}' | grep -q True"

step "MailCluster $MC: SMTP autoscaled 1..4 on pool saturation $SATURATION %, poolSize $POOL, maxConnections $MAX_CONNECTIONS"
POSTGRES="poolSize: $POOL, maxConnections: $MAX_CONNECTIONS, reservedConnections: $RESERVED" apply_mailcluster <<YAML
  smtp:
    autoscaling: {minReplicas: 1, maxReplicas: 4, cpuUtilization: 0, poolSaturation: $SATURATION}
  submission: {enabled: false}
  imap: {enabled: false}
  pop3: {enabled: false}
YAML
e2e_wait_ready smtp
kubectl get mailcluster -n "$NS" "$MC" -o jsonpath='{.status.conditions[?(@.type=="Degraded")].message}'; echo
MAX_REPLICAS=$(kubectl get hpa -n "$NS" "$MC-smtp" -o jsonpath='{.spec.maxReplicas}')
[ "$MAX_REPLICAS" = 3 ] || die "the connection budget should cap maxReplicas 4 -> 3, the HPA has $MAX_REPLICAS"
until_true "the HPA reads mail_pool_saturation" sh -c \
    "kubectl get hpa -n $NS $MC-smtp -o jsonpath='{.status.currentMetrics[0].pods.current.averageValue}' | grep -q ."
kubectl get hpa -n "$NS" "$MC-smtp"

# Every 2 s: Pods of the Deployment (not being deleted), Ready ones, the HPA's
# desired count and the saturation it reads, and the database's connections.
sample() {
    local t hpa pods conns
    while :; do
        t=$(date +%s.%N)
        hpa=$(kubectl get hpa -n "$NS" "$MC-smtp" -o jsonpath='{.status.desiredReplicas} {.status.currentMetrics[0].pods.current.averageValue}' 2>/dev/null || true)
        pods=$(kubectl get pods -n "$NS" -l "app.kubernetes.io/instance=$MC,app.kubernetes.io/component=smtp" -o json 2>/dev/null |
            python3 -c '
import json, sys
pods = [p for p in json.load(sys.stdin)["items"] if p["status"].get("phase") in ("Pending", "Running")]
ready = sum(1 for p in pods if not p["metadata"].get("deletionTimestamp") and
            any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])))
print(len(pods), ready)' 2>/dev/null || true)
        conns=$(psql_admin -c "SELECT count(*) FROM pg_stat_activity WHERE datname = '$DB'" 2>/dev/null || true)
        echo "$t ${pods:-? ?} ${hpa:-? ?} ${conns:-?}"
        sleep 2
    done
}
sample >"$WORK/samples" &
SAMPLER_PID=$!

step "open-loop deliver at $RATE msg/s for ${LOAD_SECS}s through Service $MC-smtp"
SMTP_IP=$(svc_ip "$MC-smtp")
LOAD_START=$(date +%s)
mailcluster_host stress -s deliver --smtp "$SMTP_IP:25" --rate "$RATE" --duration "${LOAD_SECS}s" \
    --concurrency 128 --users-template 'load{:03}@e2e.test' --users-count 50 --provision-accounts \
    --message-size 4k --timeout 30s --success-rate 0 --no-progress \
    --json "$WORK/report.json" --csv "$WORK/series.csv" >"$WORK/stress.out" 2>&1 &
LOAD_PID=$!
replicas() { kubectl get deployment -n "$NS" "$MC-smtp" -o jsonpath='{.spec.replicas}'; }
deadline=$((LOAD_START + UP_SECS))
until [ "$(replicas)" -gt 1 ]; do
    [ "$(date +%s)" -lt "$deadline" ] || die "the HPA did not scale up within ${UP_SECS}s: $(kubectl get hpa -n "$NS" "$MC-smtp" --no-headers)"
    sleep 2
done
UP_AT=$(date +%s)
echo "scaled up after $((UP_AT - LOAD_START)) s: $(kubectl get hpa -n "$NS" "$MC-smtp" --no-headers)"
wait "$LOAD_PID" || true
LOAD_PID=
LOAD_END=$(date +%s)
grep -E '^deliver|^operation' "$WORK/stress.out" || cat "$WORK/stress.out"
PEAK=$(awk '$2 ~ /^[0-9]+$/ && $2 > m {m = $2} END {print m + 0}' "$WORK/samples")
echo "peak: $PEAK Pods"

step "after the load: back to minReplicas (1) within ${DOWN_SECS}s"
deadline=$((LOAD_END + DOWN_SECS))
until [ "$(replicas)" = 1 ]; do
    [ "$(date +%s)" -lt "$deadline" ] || die "the HPA did not scale down within ${DOWN_SECS}s: $(kubectl get hpa -n "$NS" "$MC-smtp" --no-headers)"
    sleep 5
done
DOWN_AT=$(date +%s)
sleep 4
kill "$SAMPLER_PID" 2>/dev/null || true
SAMPLER_PID=
echo "scaled down to 1 after $((DOWN_AT - LOAD_END)) s"
kubectl get hpa -n "$NS" "$MC-smtp"

step "timeline: replicas x poolSize within the budget; PostgreSQL's count too"
python3 - "$WORK" "$POOL" "$MAX_CONNECTIONS" "$RESERVED" "$LOAD_START" "$LOAD_END" "${E2E_RECORD:-}" "$SATURATION" <<'PY'
import csv, datetime, json, os, sys
work, pool, maxc, reserved, load_start, load_end, record, target = sys.argv[1:]
pool, maxc, reserved, load_start, load_end = int(pool), int(maxc), int(reserved), int(load_start), int(load_end)
budget = maxc - reserved
samples = []
for line in open(f"{work}/samples"):
    f = line.split()
    if len(f) < 6 or not f[1].isdigit():
        continue
    sat = f[4]
    sat = float(sat[:-1]) / 1000 if sat.endswith("m") else (float(sat) if sat not in ("?", "") else None)
    samples.append({"t": float(f[0]), "pods": int(f[1]), "ready": int(f[2]),
                    "desired": int(f[3]) if f[3].isdigit() else None, "saturation": sat,
                    "connections": int(f[5]) if f[5].isdigit() else None})
report = json.load(open(f"{work}/report.json"))
started = datetime.datetime.fromisoformat(report["scenarios"][0]["started_at"].replace("Z", "+00:00")).timestamp()
p95 = {started + int(r["second"]): float(r["p95_ms"]) for r in csv.DictReader(open(f"{work}/series.csv"))
       if r["op"] == "deliver"}
t0 = samples[0]["t"]
rows = []
for s in samples:
    near = [v for t, v in p95.items() if abs(t - s["t"]) <= 1.0]
    rows.append({"second": round(s["t"] - load_start, 1), "pods": s["pods"], "ready": s["ready"],
                 "hpa_desired": s["desired"], "pool_saturation": s["saturation"],
                 "deliver_p95_ms": max(near) if near else None, "pg_connections": s["connections"],
                 "pool_connections_possible": s["pods"] * pool})
over = [r for r in rows if r["pods"] * pool > budget]
pg_over = [r for r in rows if r["pg_connections"] is not None and r["pg_connections"] > budget]
print(f"{len(rows)} samples; Pods max {max(r['pods'] for r in rows)}; "
      f"PostgreSQL connections max {max((r['pg_connections'] or 0) for r in rows)} of a budget of {budget} "
      f"(maxConnections {maxc} - reserved {reserved})")
assert not over, f"replicas x poolSize above the budget: {over[:3]}"
assert not pg_over, f"PostgreSQL saw more connections than the budget: {pg_over[:3]}"
if record:
    os.makedirs(record, exist_ok=True)
    with open(f"{record}/hpa-timeline.csv", "w", newline="") as out:
        w = csv.DictWriter(out, fieldnames=list(rows[0].keys()))
        w.writeheader(); w.writerows(rows)
    # A plain SVG: three stacked panels over the same time axis.
    W, H, L, P = 900, 540, 60, 150
    xs = [r["second"] for r in rows]; x0, x1 = min(xs), max(xs)
    X = lambda s: L + (s - x0) / max(x1 - x0, 1) * (W - L - 20)
    panels = [("Pods (HPA desired dashed)", "pods", 4, "#1f77b4"),
              (f"mail_pool_saturation (HPA average; target {int(target) / 100:g})", "pool_saturation", 1.0, "#d62728"),
              ("deliver P95 ms (log scale)", "deliver_p95_ms", None, "#2ca02c")]
    import math
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H + 40}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H + 40}" fill="white"/>']
    for i, (title, key, top, colour) in enumerate(panels):
        y0 = 20 + i * (P + 30)
        vals = [r[key] for r in rows]
        if top is None:
            top = max([v for v in vals if v] + [1])
            Y = lambda v: y0 + P - math.log10(max(v, 1)) / math.log10(max(top, 10)) * P
        else:
            Y = lambda v, top=top: y0 + P - v / top * P
        svg.append(f'<text x="{L}" y="{y0 - 5}">{title}</text>')
        svg.append(f'<rect x="{L}" y="{y0}" width="{W - L - 20}" height="{P}" fill="none" stroke="#999"/>')
        for sx in (load_start, load_end):
            svg.append(f'<line x1="{X(sx - load_start):.1f}" y1="{y0}" x2="{X(sx - load_start):.1f}" y2="{y0 + P}" stroke="#bbb" stroke-dasharray="4"/>')
        pts = " ".join(f"{X(r['second']):.1f},{Y(v):.1f}" for r, v in zip(rows, vals) if v is not None)
        svg.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"/>')
        if key == "pods":
            d = " ".join(f"{X(r['second']):.1f},{Y(r['hpa_desired']):.1f}" for r in rows if r["hpa_desired"] is not None)
            svg.append(f'<polyline points="{d}" fill="none" stroke="#ff7f0e" stroke-dasharray="6,3"/>')
            for v in range(0, 5):
                svg.append(f'<text x="{L - 20}" y="{Y(v) + 4:.1f}">{v}</text>')
        elif key == "pool_saturation":
            svg.append(f'<line x1="{L}" y1="{Y(0.5):.1f}" x2="{W - 20}" y2="{Y(0.5):.1f}" stroke="#999" stroke-dasharray="2"/>')
            for v in (0, 0.5, 1):
                svg.append(f'<text x="{L - 30}" y="{Y(v) + 4:.1f}">{v}</text>')
        else:
            svg.append(f'<text x="{L - 55}" y="{y0 + 10}">{top:.0f}</text>')
    for s in range(int(x0 // 60) * 60, int(x1) + 1, 60):
        if s >= x0:
            svg.append(f'<text x="{X(s) - 10:.1f}" y="{H + 25}">{s}s</text>')
    svg.append(f'<text x="{L}" y="{H + 38}">seconds since the load started (dashed lines: load start and end)</text>')
    svg.append("</svg>")
    open(f"{record}/hpa-timeline.svg", "w").write("\n".join(svg))
    print(f"timeline written to {record}/hpa-timeline.csv and .svg")
PY
echo "HPA: 1 -> $PEAK Pods after $((UP_AT - LOAD_START)) s of load, back to 1 $((DOWN_AT - LOAD_END)) s after it"
