#!/usr/bin/env bash
# The whole loop on one machine, against a cluster from scripts/kube-up.sh with its
# node (as root: kubelet and containerd running the image of scripts/image-build.sh):
# the operator installed from the chart runs as a Pod, a
# MailCluster whose PostgreSQL and Redis are this machine's (Services without
# selector + EndpointSlices to the node's address), the migration Job, SMTP, IMAP
# and POP3 Pods Ready, `kubectl logs` and `kubectl exec`, an account as a MailDomain
# and a MailAccount with its password Secret (no CLI), what the runtime enforces
# on a mail container (scripts/e2e_runtime_checks.py), a message sent with swaks through the SMTP Service and read
# with curl through the IMAP Service, the MailAccount deleted (login refused, mail
# kept), an on-demand stress run whose verdict lands in
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

step "the node: the kubelet of the control plane's release on containerd"
kubectl get nodes -o wide
runtime=$(kubectl get nodes -l mailcluster.dev/test-node=true -o jsonpath='{.items[0].status.nodeInfo.containerRuntimeVersion}')
kubelet=$(kubectl get nodes -l mailcluster.dev/test-node=true -o jsonpath='{.items[0].status.nodeInfo.kubeletVersion}')
server=$(kubectl version -o json | python3 -c 'import json, sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')
[[ "$runtime" == containerd://* ]] || die "the node's runtime is $runtime, not containerd"
[ "$kubelet" = "$server" ] || die "the kubelet is $kubelet, the API server $server"
echo "node runtime $runtime, kubelet $kubelet"

e2e_prepare

step "MailCluster $MC: SMTP, submission, IMAP, POP3; one replica each; a small stress plan"
apply_mailcluster <<EOF
  pop3: {enabled: true}
  autoscaling: {minReplicas: 1, maxReplicas: 2}
  tuning:
    ipLocalPortRange: "16384 65000"
    tcpKeepaliveTime: 300
    tcpKeepaliveIntvl: 30
    tcpKeepaliveProbes: 5
    tcpFinTimeout: 15
    tcpRmem: "4096 87380 6291456"
    tcpWmem: "4096 65536 4194304"
    somaxconn: 8192
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

step "what the runtime enforces on $SMTP_POD: user, capabilities, seccomp, read-only root, the memory limit, spec.tuning's sysctls"
limit=$(quantity_bytes "$(kubectl get pod -n "$NS" "$SMTP_POD" -o jsonpath='{.spec.containers[0].resources.limits.memory}')")
# spec.tuning above, as /proc/sys shows it in the Pod (somaxconn is the unsafe one
# the node's kubelet allows).
python3 "$ROOT/scripts/e2e_runtime_checks.py" "$(container_pid "$SMTP_POD")" "$limit" /var/lib/mailcluster \
    net.ipv4.ip_local_port_range="16384 65000" net.ipv4.tcp_keepalive_time=300 \
    net.ipv4.tcp_keepalive_intvl=30 net.ipv4.tcp_keepalive_probes=5 net.ipv4.tcp_fin_timeout=15 \
    net.ipv4.tcp_rmem="4096 87380 6291456" net.ipv4.tcp_wmem="4096 65536 4194304" net.core.somaxconn=8192
# The listeners' backlog follows the Pod's somaxconn: a listening socket's send
# queue is its backlog (ss in the Pod's network namespace).
backlog=$(nsenter --target "$(container_pid "$SMTP_POD")" --net ss -ltnH 'sport = :10025' | awk '{print $3}')
[ "$backlog" = 8192 ] || die "the SMTP listener's backlog is ${backlog:-?}, not the Pod's somaxconn 8192"
echo "SMTP listener backlog $backlog (the Pod's net.core.somaxconn)"
# The server's in-flight budget is a share of that same limit, so transfers are
# refused before the OOM killer would act on the server.
pod_ip=$(kubectl get pod -n "$NS" "$SMTP_POD" -o jsonpath='{.status.podIP}')
budget=$(curl -sf --max-time 10 "http://$pod_ip:9090/metrics" | awk '$1 == "mail_transfer_budget_limit_bytes" {print $2}')
[ -n "$budget" ] && [ "$budget" -gt 0 ] && [ "$budget" -le $((limit / 2)) ] \
    || die "the in-flight budget ($budget bytes) does not fit the Pod's memory limit ($limit bytes)"
echo "in-flight budget $budget bytes of the $limit-byte limit"
# The node gives containers a file limit the connection caps fit in (containerd 1.x
# alone would give 1024).
metrics=$(curl -sf --max-time 10 "http://$pod_ip:9090/metrics")
nofile=$(awk '$1 == "mail_open_files_limit" {print $2}' <<<"$metrics")
needed=$(awk '$1 == "mail_open_files_needed" {print $2}' <<<"$metrics")
[ -n "$nofile" ] && [ -n "$needed" ] && [ "$nofile" -ge "$needed" ] \
    || die "open files: limit ${nofile:-?} below the ${needed:-?} the connection caps need"
echo "open files: limit $nofile, the connection caps need $needed"

step "a MailDomain and a MailAccount with its password Secret: the operator writes them into the store"
kubectl create secret generic alice-password -n "$NS" --from-literal=password="$PASSWORD" >/dev/null
kubectl apply -n "$NS" -f - >/dev/null <<YAML
apiVersion: mailcluster.dev/v1alpha1
kind: MailDomain
metadata: {name: e2e-test}
spec: {clusterRef: $MC, domain: e2e.test}
---
apiVersion: mailcluster.dev/v1alpha1
kind: MailAccount
metadata: {name: alice}
spec:
  clusterRef: $MC
  address: alice@e2e.test
  passwordSecretRef: {name: alice-password, key: password}
YAML
kubectl wait -n "$NS" --for=condition=Ready maildomain/e2e-test mailaccount/alice --timeout="${TIMEOUT}s"
kubectl get -n "$NS" maildomains,mailaccounts

SMTP_IP=$(svc_ip "$MC-smtp")
IMAP_IP=$(svc_ip "$MC-imap")
step "swaks -> Service $MC-smtp ($SMTP_IP:25)"
swaks --server "$SMTP_IP:25" --from bob@example.net --to alice@e2e.test \
    --header "Subject: e2e $NS" --body "through the Service" --timeout 30 --silent 1
step "curl <- Service $MC-imap ($IMAP_IP:143)"
got=$(curl -sS --max-time 30 -k --ssl-reqd "imap://$IMAP_IP:143/INBOX;UID=1" -u "alice@e2e.test:$PASSWORD")
grep -q "Subject: e2e $NS" <<<"$got" || die "the message read through IMAP is not the one sent: $got"
echo "read back: $(grep '^Subject:' <<<"$got")"

step "delete the MailAccount (deletionPolicy Retain): its login is refused, its mail kept"
kubectl delete -n "$NS" mailaccount/alice --timeout="${TIMEOUT}s" >/dev/null
if curl -sS --max-time 30 -k --ssl-reqd "imap://$IMAP_IP:143/INBOX;UID=1" -u "alice@e2e.test:$PASSWORD" >/dev/null 2>&1; then
    die "alice@e2e.test still logs in after her MailAccount was deleted"
fi
kept=$(psql_db -c "SELECT count(*) FROM mailbox_messages mm JOIN mailboxes mb ON mb.id = mm.mailbox_id JOIN accounts a ON a.id = mb.account_id WHERE a.email = 'alice@e2e.test'")
[ "${kept:-0}" -ge 1 ] || die "alice's mail is gone (deletionPolicy Retain keeps it): $kept messages"
echo "login refused; $kept message(s) kept"

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
