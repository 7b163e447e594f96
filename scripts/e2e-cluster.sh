#!/usr/bin/env bash
# The whole loop on one machine, against a cluster from scripts/kube-up.sh with its
# node (as root: kubelet and containerd running the image of scripts/image-build.sh):
# the operator installed from the chart runs as a Pod, a
# MailCluster whose PostgreSQL and Redis are this machine's (Services without
# selector + EndpointSlices to the node's address), the migration Job, SMTP, IMAP
# and POP3 Pods Ready, `kubectl logs` and `kubectl exec`, what the runtime enforces
# on a mail container (scripts/e2e_runtime_checks.py), a message sent with swaks through the SMTP Service and read
# with curl through the IMAP Service, an on-demand stress run whose verdict lands in
# status.lastStress and SLOMet, `kubectl wait --for=condition=Ready` as
# docs/quickstart.md uses it, and a delete that cascades.
#
#   eval "$(scripts/kube-up.sh)" && scripts/e2e-cluster.sh
#
# Every step is logged with its time; the last line is the SLOMet condition. On a
# failure the script prints the namespace's Pods, events and the logs of every
# container (`kubectl logs`). Bounded:
# each wait has its own timeout (E2E_TIMEOUT, default 180 s).
# Needs: swaks and curl besides what scripts/e2e-lib.sh needs (scripts/test.sh
# installs them all).
set -euo pipefail
source "$(dirname "$0")/e2e-lib.sh"
PASSWORD=e2e-secret-$$

e2e_prepare

step "MailCluster $MC: SMTP, submission, IMAP, POP3; one replica each; a small stress plan"
apply_mailcluster <<EOF
  pop3: {enabled: true}
  autoscaling: {minReplicas: 1, maxReplicas: 2}
  stress:
    deadlineSeconds: 300
    users: {count: 5}
    scenarios:
      - {name: seed, kind: seed, messagesPerUser: 5}
      - {name: deliver, kind: deliver, rate: 20, duration: 10s}
      - {name: fetch, kind: fetch, concurrency: 4, duration: 10s}
      - {name: pop3, kind: pop3, concurrency: 2, duration: 5s}
    slo: {successRate: 99.0, smtpP95Ms: 2000, imapFetchP95Ms: 2000}
EOF

e2e_wait_ready smtp submission imap pop3

SMTP_POD=$(kubectl get pods -n "$NS" -l app.kubernetes.io/instance="$MC",app.kubernetes.io/component=smtp \
    --field-selector=status.phase=Running -o jsonpath='{.items[0].metadata.name}')
step "kubectl logs and kubectl exec on $SMTP_POD (the kubelet serves both)"
kubectl logs -n "$NS" "$SMTP_POD" | grep -q '"message":"listening"' || die "kubectl logs shows no listener of $SMTP_POD"
version=$(kubectl exec -n "$NS" "$SMTP_POD" -- mailcluster --version)
[ "$version" = "mailcluster $IMAGE_VERSION" ] || die "kubectl exec $SMTP_POD -- mailcluster --version: $version"
echo "kubectl exec $SMTP_POD -- mailcluster --version: $version"

step "what the runtime enforces on $SMTP_POD: user, capabilities, seccomp, read-only root, the memory limit"
limit=$(quantity_bytes "$(kubectl get pod -n "$NS" "$SMTP_POD" -o jsonpath='{.spec.containers[0].resources.limits.memory}')")
python3 "$ROOT/scripts/e2e_runtime_checks.py" "$(container_pid "$SMTP_POD")" "$limit" /var/lib/mailcluster
# The server's in-flight budget is a share of that same limit, so transfers are
# refused before the OOM killer would act on the server.
pod_ip=$(kubectl get pod -n "$NS" "$SMTP_POD" -o jsonpath='{.status.podIP}')
budget=$(curl -sf --max-time 10 "http://$pod_ip:9090/metrics" | awk '$1 == "mail_transfer_budget_limit_bytes" {print $2}')
[ -n "$budget" ] && [ "$budget" -gt 0 ] && [ "$budget" -le $((limit / 2)) ] \
    || die "the in-flight budget ($budget bytes) does not fit the Pod's memory limit ($limit bytes)"
echo "in-flight budget $budget bytes of the $limit-byte limit"

step "an account (mailcluster user add, on the same database)"
echo "$PASSWORD" | mailcluster_host user add alice@e2e.test

SMTP_IP=$(svc_ip "$MC-smtp")
IMAP_IP=$(svc_ip "$MC-imap")
step "swaks -> Service $MC-smtp ($SMTP_IP:25)"
swaks --server "$SMTP_IP:25" --from bob@example.net --to alice@e2e.test \
    --header "Subject: e2e $NS" --body "through the Service" --timeout 30 --silent 1
step "curl <- Service $MC-imap ($IMAP_IP:143)"
got=$(curl -sS --max-time 30 -k --ssl-reqd "imap://$IMAP_IP:143/INBOX;UID=1" -u "alice@e2e.test:$PASSWORD")
grep -q "Subject: e2e $NS" <<<"$got" || die "the message read through IMAP is not the one sent: $got"
echo "read back: $(grep '^Subject:' <<<"$got")"

step "stress run on demand (annotation mailcluster.dev/run-stress)"
kubectl annotate -n "$NS" "mailcluster/$MC" "mailcluster.dev/run-stress=e2e-$(date +%s)" --overwrite >/dev/null
slo_condition() {
    kubectl get mailcluster -n "$NS" "$MC" -o jsonpath='{.status.conditions[?(@.type=="SLOMet")].status}'
}
until_true "status.lastStress" sh -c "kubectl get mailcluster -n $NS $MC -o jsonpath='{.status.lastStress.verdict}' | grep -q ."
kubectl get mailcluster -n "$NS" "$MC" -o jsonpath='{.status.lastStress}'; echo
# The operator turns the verdict into SLOMet on its next reconcile.
until_true "SLOMet decided" sh -c "kubectl get mailcluster -n $NS $MC -o jsonpath='{.status.conditions[?(@.type==\"SLOMet\")].status}' | grep -qv Unknown"
[ "$(slo_condition)" = True ] || die "SLOMet is $(slo_condition)"

step "kubectl wait --for=condition=Ready mc/$MC (docs/quickstart.md)"
kubectl -n "$NS" wait --for=condition=Ready "mc/$MC" --timeout="${TIMEOUT}s"
kubectl -n "$NS" get mailclusters

step "delete the MailCluster: its children go with it"
kubectl delete -n "$NS" "mailcluster/$MC" --timeout="${TIMEOUT}s"
gone() {
    [ -z "$(kubectl get deployments,services,jobs,cronjobs,configmaps,pods -n "$NS" \
        -l app.kubernetes.io/instance="$MC" -o name 2>/dev/null)" ]
}
until_true "cascading delete" gone

step "SLOMet=True (stress verdict recorded before the delete)"
echo "SLOMet=True"
