#!/usr/bin/env bash
# Disruption under load, against a cluster from scripts/kube-up.sh with its node
# (as root: kubelet and containerd). While an open-loop deliver runs through the SMTP Service at
# E2E_RATE msg/s (default 200):
#   1. the MailCluster's image tag changes, then a configuration value: each time
#      the SMTP Pods roll one at a time (ready Pods never below what the
#      PodDisruptionBudget allows, never more than one surge Pod);
#   2. one SMTP Pod's container process is killed with SIGKILL: the kubelet
#      restarts the container;
#   3. one SMTP Pod is deleted at once (grace 0): the ReplicaSet replaces it;
#   4. the node is drained of the SMTP Pods (`kubectl drain`): one is evicted, the
#      PodDisruptionBudget refuses the other while its replacement cannot be
#      scheduled, and uncordoning brings the Deployment back.
# Group commit across pods is on (spec.groupCommit.acrossPods, off by default):
# the Pod lost in 2 and 3 is the group-commit leader (the lowest address of the
# headless Service $MC-smtp-commit), which commits the other Pod's deliveries:
# before the rollouts the other Pod must have handed it some.
# The rollouts and the Pod loss (2-4) each get a load run of their own. Then every
# message acknowledged with 250 must be in the store exactly once, no delivery may
# have had a 5xx reply, and during the rollouts no delivery may have failed other
# than with a 4xx reply (a draining Pod finishes the message in transfer and tells
# idle sessions 421; the client reconnects).
#
#   eval "$(scripts/kube-up.sh)" && scripts/e2e-disruption.sh
#
# Every step is logged with its time; the last line is the exactly-once verdict.
# Bounded: two load runs of E2E_ROLL_SECS (75 s) and E2E_LOSS_SECS (100 s), each
# wait E2E_TIMEOUT.
set -euo pipefail
source "$(dirname "$0")/e2e-lib.sh"
RATE="${E2E_RATE:-200}"
# Each load run outlasts what it covers (the old Pods' drain included).
ROLL_SECS="${E2E_ROLL_SECS:-75}"
LOSS_SECS="${E2E_LOSS_SECS:-100}"
USERS=20
WORK=$(mktemp -d)
SMTP_SELECTOR="app.kubernetes.io/instance=$MC,app.kubernetes.io/component=smtp"

stop_background() {
    [ -z "${LOAD_PID:-}" ] || kill "$LOAD_PID" 2>/dev/null || true
    [ -z "${WATCH_PID:-}" ] || kill "$WATCH_PID" 2>/dev/null || true
    [ "${E2E_KEEP:-0}" = 1 ] || rm -rf "$WORK"
}
E2E_CLEANUP_HOOKS+=(stop_background)

e2e_prepare

step "MailCluster $MC: SMTP only, two replicas"
apply_mailcluster <<YAML
  smtp: {replicas: 2, autoscaling: {enabled: false}}
  groupCommit: {acrossPods: true}
  submission: {enabled: false}
  imap: {enabled: false}
  pop3: {enabled: false}
YAML
e2e_wait_ready smtp
SMTP_IP=$(svc_ip "$MC-smtp")
REPLICAS=$(kubectl get deployment -n "$NS" "$MC-smtp" -o jsonpath='{.spec.replicas}')
MAX_UNAVAILABLE=$(kubectl get pdb -n "$NS" "$MC-smtp" -o jsonpath='{.spec.maxUnavailable}')
[ "$REPLICAS" = 2 ] && [ "$MAX_UNAVAILABLE" = 1 ] || die "expected 2 replicas under a PDB of maxUnavailable 1, got $REPLICAS / $MAX_UNAVAILABLE"

# The phase of the run (its name and start time), for the per-phase summary.
phase() { # name
    echo "$(date +%s.%N) $1" >>"$WORK/phases"
}
# Once a second: Pods that are not being deleted, how many of those are Ready, and
# the ReplicaSets (template revisions) they belong to.
watch_pods() {
    while :; do
        kubectl get pods -n "$NS" -l "$SMTP_SELECTOR" -o json 2>/dev/null | python3 -c '
import json, sys, time
pods = [p for p in json.load(sys.stdin)["items"] if not p["metadata"].get("deletionTimestamp")]
ready = sum(1 for p in pods for c in p["status"].get("conditions", [])
            if c["type"] == "Ready" and c["status"] == "True")
hashes = sorted({p["metadata"]["labels"].get("pod-template-hash", "?") for p in pods})
print(f"{time.time():.3f} {len(pods)} {ready} {len(hashes)}", flush=True)
' || true
        sleep 1
    done
}
watch_pods > "$WORK/pods.log" &
WATCH_PID=$!

# One open-loop deliver run in the background: run NAME SECONDS.
start_load() { # name seconds
    step "open-loop deliver ($1): $RATE msg/s for ${2}s to $USERS users through Service $MC-smtp ($SMTP_IP:25)"
    mailcluster_host stress -s deliver --smtp "$SMTP_IP:25" --rate "$RATE" --duration "${2}s" \
        --concurrency 64 --users-template 'load{:03}@e2e.test' --users-count "$USERS" --provision-accounts \
        --message-size 4k --timeout 30s --success-rate 0 --no-progress --run-id "$1" \
        --ack-log "$WORK/acked-$1" --json "$WORK/report-$1.json" >"$WORK/stress-$1.out" 2>&1 &
    LOAD_PID=$!
    phase steady
    sleep 10
    kill -0 "$LOAD_PID" 2>/dev/null || { cat "$WORK/stress-$1.out"; die "the load stopped early"; }
}
finish_load() { # name
    phase steady
    step "the load ($1) runs to its end"
    wait "$LOAD_PID" || true
    LOAD_PID=
    grep -E '^(deliver|operation|  \(smtp|generator) |error ' "$WORK/stress-$1.out" || cat "$WORK/stress-$1.out"
}

rolled_to() { # expected-generation
    [ "$(kubectl get deployment -n "$NS" "$MC-smtp" -o jsonpath='{.status.observedGeneration}')" -ge "$1" ] &&
        kubectl -n "$NS" rollout status "deployment/$MC-smtp" --timeout=5s
}
roll() { # what patch
    local gen
    gen=$(kubectl get deployment -n "$NS" "$MC-smtp" -o jsonpath='{.metadata.generation}')
    step "rolling update under load: $1"
    phase "rollout: $1"
    kubectl patch -n "$NS" "mailcluster/$MC" --type merge -p "$2" >/dev/null
    until_true "the operator changes the Deployment" sh -c \
        "[ \$(kubectl get deployment -n $NS $MC-smtp -o jsonpath='{.metadata.generation}') -gt $gen ]"
    until_true "the rollout ($1)" rolled_to "$((gen + 1))"
}
# Ready SMTP Pods not being deleted, as "name address", the lowest address first:
# the group-commit leader first.
ready_smtp_pods() {
    kubectl get pods -n "$NS" -l "$SMTP_SELECTOR" -o json | python3 -c '
import ipaddress, json, sys
pods = []
for p in json.load(sys.stdin)["items"]:
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    if ready and not p["metadata"].get("deletionTimestamp") and p["status"].get("podIP"):
        pods.append((ipaddress.ip_address(p["status"]["podIP"]), p["metadata"]["name"]))
for ip, name in sorted(pods):
    print(name, ip)
'
}
# Deliveries the Pods handed to the leader so far (their metrics, summed).
forwarded_to_leader() {
    local total=0 name ip n
    while read -r name ip; do
        n=$(curl -sf --max-time 5 "http://$ip:9090/metrics" |
            awk '/^mail_group_commit_forwarded_total\{committed="leader"\}/ {print $2}')
        echo "  $name ($ip): ${n:-0} deliveries handed to the leader" >&2
        total=$((total + ${n:-0}))
    done < <(ready_smtp_pods)
    echo "$total"
}

start_load rollouts "$ROLL_SECS"
step "group commit across pods: the SMTP Pods hand their deliveries to the leader"
forwarded=$(forwarded_to_leader)
[ "$forwarded" -gt 0 ] || die "no SMTP Pod handed a delivery to the group-commit leader"
roll "image tag e2e -> e2e-2" '{"spec":{"image":{"tag":"e2e-2"}}}'
roll "smtp.maxConnections 5000 -> 4000 (a configuration value)" '{"spec":{"smtp":{"maxConnections":4000}}}'
finish_load rollouts

start_load pod-loss "$LOSS_SECS"

step "pod loss under load: SIGKILL of the group-commit leader's process"
phase "SIGKILL of a Pod's process"
# The leader, of the current revision (Pods of the old one may still be draining).
pod=$(ready_smtp_pods | awk 'NR == 1 {print $1}')
[ -n "$pod" ] || die "no Ready SMTP Pod"
restarts=$(kubectl get pod -n "$NS" "$pod" -o jsonpath='{.status.containerStatuses[0].restartCount}')
# The container's own process, as the kernel's OOM killer or a crash would end it:
# containerd sees its task exit and the kubelet restarts the container.
pid=$(container_pid "$pod")
[ -n "$pid" ] || die "no container process of $pod on the node"
kill -KILL "$pid"
until_true "$pod restarted" sh -c "[ \$(kubectl get pod -n $NS $pod -o jsonpath='{.status.containerStatuses[0].restartCount}') -gt $restarts ]"
until_true "$pod Ready again" kubectl wait -n "$NS" --for=condition=Ready "pod/$pod" --timeout=5s
echo "$pod: restartCount $restarts -> $(kubectl get pod -n "$NS" "$pod" -o jsonpath='{.status.containerStatuses[0].restartCount}')"

step "pod loss under load: $pod deleted at once (grace 0)"
phase "Pod deleted (grace 0)"
kubectl delete pod -n "$NS" "$pod" --grace-period=0 --force >/dev/null 2>&1
replaced() {
    local names
    names=$(kubectl get pods -n "$NS" -l "$SMTP_SELECTOR" -o jsonpath='{.items[*].metadata.name}')
    ! grep -qw "$pod" <<<"$names" && kubectl -n "$NS" rollout status "deployment/$MC-smtp" --timeout=5s
}
until_true "the ReplicaSet replaces $pod" replaced
kubectl get pods -n "$NS" -l "$SMTP_SELECTOR"

step "node drain under load: kubectl drain evicts the SMTP Pods only as the PodDisruptionBudget allows"
phase "drain: the node's SMTP Pods"
NODE=$(kubectl get nodes -l mailcluster.dev/test-node=true -o jsonpath='{.items[0].metadata.name}')
# One node: the evicted Pod's replacement stays Pending while the node is cordoned,
# so the budget (maxUnavailable 1) must refuse the second eviction until the drain
# gives up; the Pod that stays keeps taking mail.
drain_out=$(kubectl drain "$NODE" --pod-selector "$SMTP_SELECTOR" --delete-emptydir-data --ignore-daemonsets \
    --timeout=30s 2>&1) && die "the drain evicted every SMTP Pod past the PodDisruptionBudget: $drain_out"
grep -E 'evicted|disruption budget' <<<"$drain_out" | sort | uniq -c | head -n 5
grep -q "evicted" <<<"$drain_out" || die "the drain evicted nothing: $drain_out"
grep -q "disruption budget" <<<"$drain_out" || die "the drain did not stop at the PodDisruptionBudget: $drain_out"
kubectl uncordon "$NODE" >/dev/null
until_true "the SMTP Deployment back to $REPLICAS Ready after uncordon" \
    kubectl -n "$NS" rollout status "deployment/$MC-smtp" --timeout=5s
kubectl get pods -n "$NS" -l "$SMTP_SELECTOR"

finish_load pod-loss
kill "$WATCH_PID" 2>/dev/null || true
WATCH_PID=

step "Pods per phase (PDB: at least $((REPLICAS - MAX_UNAVAILABLE)) of $REPLICAS Ready in a rollout, at most one surge Pod)"
python3 - "$WORK" "$REPLICAS" "$MAX_UNAVAILABLE" <<'PY'
import sys
work, replicas, max_unavailable = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
phases = [(float(l.split(" ", 1)[0]), l.split(" ", 1)[1].strip()) for l in open(f"{work}/phases")]
def phase_at(t):
    name = phases[0][1]
    for start, n in phases:
        if t >= start:
            name = n
    return name
summary = {}
for l in open(f"{work}/pods.log"):
    if l.strip():
        t, live, ready, _ = (float(v) for v in l.split())
        s = summary.setdefault(phase_at(t), {"ready": [], "live": []})
        s["ready"].append(int(ready)); s["live"].append(int(live))
print(f"{'phase':<60} {'ready min':>9} {'live max':>8}")
failed = []
for n in dict.fromkeys(n for _, n in phases):
    if n not in summary:
        continue
    rmin, lmax = min(summary[n]["ready"]), max(summary[n]["live"])
    print(f"{n:<60} {rmin:>9} {lmax:>8}")
    if (n.startswith("rollout") or n.startswith("drain")) and rmin < replicas - max_unavailable:
        failed.append(f"{n}: ready fell to {rmin}")
    if lmax > replicas + 1:
        failed.append(f"{n}: {lmax} Pods at once, more than one surge Pod")
assert not failed, failed
PY

step "replies: no 5xx; during the rollouts no failure but a 4xx reply"
python3 - "$WORK" <<'PY'
import json, sys
failed = []
for run in ("rollouts", "pod-loss"):
    d = json.load(open(f"{sys.argv[1]}/report-{run}.json"))["totals"]["deliver"]
    kinds = d.get("errors_by_kind", {})
    print(f"{run}: {d['ok']} acknowledged, {d['errors']} failed {kinds}")
    if d["ok"] == 0:
        failed.append(f"{run}: nothing was acknowledged")
    failed += [f"{run}: {n} x {k}" for k, n in kinds.items() if k.startswith("smtp-5")]
    # A rollout drains its old Pods: a message in transfer is finished, an idle
    # session is told 421 and the client reconnects to a Pod that stays; a broken
    # or refused connection would be a failure of the drain.
    if run == "rollouts":
        failed += [f"{run}: {n} x {k}" for k, n in kinds.items() if not k.startswith("smtp-4")]
assert not failed, failed
PY
cat "$WORK"/acked-* >"$WORK/acked"

step "every acknowledged message is stored exactly once"
psql_db >"$WORK/verdict" <<SQL
CREATE TEMP TABLE acked (id TEXT PRIMARY KEY);
\\copy acked FROM '$WORK/acked'
CREATE TEMP TABLE stored AS
    SELECT trim(both '<>' from m.message_id) AS id, count(*) AS copies
    FROM mailbox_messages mm JOIN messages m ON m.id = mm.message_id
    WHERE m.message_id LIKE '%@stress.mailcluster.test%' GROUP BY 1;
SELECT (SELECT count(*) FROM acked) || ' acknowledged; '
    || (SELECT count(*) FROM acked a LEFT JOIN stored s USING (id) WHERE s.id IS NULL) || ' missing; '
    || (SELECT count(*) FROM stored WHERE copies > 1) || ' stored more than once; '
    || (SELECT count(*) FROM stored s LEFT JOIN acked a USING (id) WHERE a.id IS NULL)
    || ' stored without an acknowledgement (the connection broke before the reply)';
SQL
cat "$WORK/verdict"
grep -q '; 0 missing; 0 stored more than once;' "$WORK/verdict" || die "not exactly once"
acked=$(wc -l <"$WORK/acked")
echo "exactly once: $acked acknowledged messages, each stored once"
