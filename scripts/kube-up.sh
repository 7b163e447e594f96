#!/usr/bin/env bash
# Starts a real Kubernetes control plane on 127.0.0.1 for tests and demos: etcd,
# kube-apiserver (RBAC, service-account tokens, aggregation), kube-controller-manager
# (Deployment, ReplicaSet, Job, CronJob, garbage collector, HPA, service-account
# token, ... — its default controller set) and kube-scheduler. The binaries come
# from scripts/kube-build.sh (built once per version, cached outside the repo).
#
#   scripts/kube-up.sh             start (or find running) and print how to use it
#   eval "$(scripts/kube-up.sh)"   the same, with KUBECONFIG exported in this shell
#   scripts/kube-down.sh           stop it and remove its state
#
# Everything lives in $MAILCLUSTER_KUBE_DIR (default /tmp/mailcluster-kube): PKI,
# etcd data, logs/, pids/, admin.kubeconfig. Ports (all 127.0.0.1):
# MAILCLUSTER_KUBE_API_PORT (16443), MAILCLUSTER_ETCD_PORT (23790; peer port +10).
# Starting is bounded (MAILCLUSTER_KUBE_START_SECS, default 120): a component that
# does not come up stops the script with the tail of its log.
# The last line printed on stdout is `export KUBECONFIG=<path>`.
#
# As root on Linux (MAILCLUSTER_KUBE_NODE=1, the default there) the cluster also
# gets a node that runs Pods as a real cluster does: containerd (its CRI plugin,
# runc, the cgroupfs driver, the CNI bridge + host-local + portmap + loopback
# plugins from Debian's packages) and the kubelet of the same release, registered as
# Node $NODE_NAME; kube-proxy (iptables mode) for Services; the cluster DNS and this
# machine's PostgreSQL and Redis at the node's address (ports 53, 5432, 6379;
# nodeservices/). Pods sit on the bridge $NODE_BRIDGE ($NODE_CIDR, the node's own
# address first), where the API server also listens; Pods reach it through the
# `kubernetes` Service. Images are never pulled: the mail image
# ghcr.io/mailcluster/mailcluster:<version> from scripts/image-build.sh (or the OCI
# archive MAILCLUSTER_KUBE_IMAGE names) and the sandbox image, built here from
# Kubernetes' own pause.c, are imported into containerd's k8s.io namespace. Logs:
# `kubectl logs`; the node's own in $MAILCLUSTER_KUBE_DIR/logs/.
# The node is tainted mailcluster.dev/test-node=true:NoSchedule
# (MAILCLUSTER_KUBE_NODE_TAINT, empty for none): Pods run there only from
# namespaces that opt in, so tests that expect Pending Pods keep them Pending. A
# namespace opts in with the PodTolerationRestriction annotation
#   scheduler.alpha.kubernetes.io/defaultTolerations: '[{"key":"mailcluster.dev/test-node","operator":"Exists"}]'
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

DIR="${MAILCLUSTER_KUBE_DIR:-/tmp/mailcluster-kube}"
API_PORT="${MAILCLUSTER_KUBE_API_PORT:-16443}"
ETCD_PORT="${MAILCLUSTER_ETCD_PORT:-23790}"
ETCD_PEER_PORT=$((ETCD_PORT + 10))
START_SECS="${MAILCLUSTER_KUBE_START_SECS:-120}"
# Addresses the apiserver hands out to Services. They exist only as data in API
# objects here: nothing routes to them from this machine.
SERVICE_CIDR="${MAILCLUSTER_KUBE_SERVICE_CIDR:-10.96.0.0/16}"
SERVICE_IP="${SERVICE_CIDR%.*/*}.1"
NODE_NAME="${MAILCLUSTER_KUBE_NODE_NAME:-mc-node-1}"
NODE_BRIDGE="${MAILCLUSTER_KUBE_NODE_BRIDGE:-mcbr0}"
NODE_CIDR="${MAILCLUSTER_KUBE_NODE_CIDR:-10.244.0.1/24}"
NODE_IP="${NODE_CIDR%/*}"
NODE_TAINT="${MAILCLUSTER_KUBE_NODE_TAINT-mailcluster.dev/test-node=true:NoSchedule}"
if [ -z "${MAILCLUSTER_KUBE_NODE:-}" ]; then
    if [ "$(id -u)" = 0 ] && [ "$(uname -s)" = Linux ]; then MAILCLUSTER_KUBE_NODE=1; else MAILCLUSTER_KUBE_NODE=0; fi
fi
API_HOST=127.0.0.1
[ "$MAILCLUSTER_KUBE_NODE" = 1 ] && API_HOST="$NODE_IP"

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

KUBECONFIG_PATH="$DIR/admin.kubeconfig"
PKI="$DIR/pki"
LOGS="$DIR/logs"
PIDS="$DIR/pids"

alive() { [ -f "$PIDS/$1" ] && kill -0 "$(cat "$PIDS/$1")" 2>/dev/null; }

api_ready() {
    curl -sf --max-time 2 --cacert "$PKI/ca.crt" "https://$API_HOST:$API_PORT/readyz" >/dev/null 2>&1
}

node_alive() { [ "$MAILCLUSTER_KUBE_NODE" != 1 ] || { alive containerd && alive kubelet && alive kube-proxy && alive mailcluster-node-services; }; }
if alive kube-apiserver && alive etcd && alive kube-controller-manager && alive kube-scheduler && node_alive && api_ready; then
    log "control plane already running ($DIR)"
    echo "export KUBECONFIG=$KUBECONFIG_PATH"
    exit 0
fi
# A half-running leftover (a crashed component, a previous run's etcd) is stopped
# first so ports and data are ours.
"$ROOT/scripts/kube-down.sh" >/dev/null 2>&1 || true

command -v openssl >/dev/null 2>&1 || die "openssl is needed for the cluster's certificates"
command -v curl >/dev/null 2>&1 || die "curl is needed to probe the control plane"

BIN=$("$ROOT/scripts/kube-build.sh" | tail -n 1)
mkdir -p "$PKI" "$LOGS" "$PIDS" "$DIR/etcd"
# kube-down.sh runs `kube-proxy --cleanup` from here.
echo "$BIN" >"$DIR/bin-dir"

if [ "$MAILCLUSTER_KUBE_NODE" = 1 ]; then
    command -v ip >/dev/null 2>&1 || die "iproute2 (ip) is needed for the test node"
    command -v iptables-restore >/dev/null 2>&1 || die "iptables is needed for kube-proxy (apt-get install iptables)"
    # The bridge first: the API server listens on its address.
    [ -d "/sys/class/net/$NODE_BRIDGE" ] || ip link add "$NODE_BRIDGE" type bridge
    ip -4 addr show dev "$NODE_BRIDGE" | grep -q "inet $NODE_CIDR " || ip addr add "$NODE_CIDR" dev "$NODE_BRIDGE"
    ip link set "$NODE_BRIDGE" up
    # Service addresses route to the bridge, where kube-proxy's rules translate them
    # (also on a machine without a default route).
    ip route replace "$SERVICE_CIDR" dev "$NODE_BRIDGE" src "$NODE_IP"
    # Pods on the bridge reach Services through the host's iptables: forwarding on,
    # bridged packets through netfilter (replies between two Pods are un-DNATed).
    echo 1 >/proc/sys/net/ipv4/ip_forward
    [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || modprobe br_netfilter 2>/dev/null || true
    [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] && echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
    for tool in containerd runc buildah; do
        command -v "$tool" >/dev/null 2>&1 || die "$tool is needed for the node (apt-get install containerd runc buildah containernetworking-plugins)"
    done
    [ -x /usr/lib/cni/bridge ] || die "the CNI plugins are needed for the node (apt-get install containernetworking-plugins)"
    log "building mailcluster-node-services"
    (cd "$ROOT" && cargo build --locked -p mailcluster-node-services >&2)
    # The mail image, unless one is given: built before anything starts, so a
    # build failure leaves no half-started cluster.
    IMAGE_ARCHIVE="${MAILCLUSTER_KUBE_IMAGE:-}"
    if [ -z "$IMAGE_ARCHIVE" ]; then IMAGE_ARCHIVE=$("$ROOT/scripts/image-build.sh" | tail -n 1); fi
    [ -f "$IMAGE_ARCHIVE" ] || die "no image archive at $IMAGE_ARCHIVE"
fi

# ---- PKI: one CA for serving and clients, one for the front proxy (aggregated
# APIs such as custom.metrics.k8s.io), and the service-account signing key ----
ssl() { openssl "$@" >/dev/null 2>&1; }
ca() { # name subject
    ssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=$2" \
        -keyout "$PKI/$1.key" -out "$PKI/$1.crt"
}
cert() { # name subject ca [extension]
    local name=$1 subject=$2 ca=$3 ext=${4:-extendedKeyUsage=clientAuth}
    ssl req -newkey rsa:2048 -nodes -subj "$subject" -keyout "$PKI/$name.key" -out "$PKI/$name.csr"
    printf '%s\n' "$ext" >"$PKI/$name.ext"
    ssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" -CAcreateserial \
        -days 3650 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt"
}
if [ ! -f "$PKI/sa.key" ]; then
    log "generating certificates in $PKI"
    ca ca mailcluster-kube-ca
    ca front-proxy-ca mailcluster-front-proxy-ca
    cert apiserver "/CN=kube-apiserver" ca "$(printf '%s\n' \
        "subjectAltName=IP:127.0.0.1,IP:$NODE_IP,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" \
        "extendedKeyUsage=serverAuth")"
    cert admin "/O=system:masters/CN=kubernetes-admin" ca
    cert controller-manager "/CN=system:kube-controller-manager" ca
    cert scheduler "/CN=system:kube-scheduler" ca
    cert apiserver-kubelet-client "/O=kubeadm:cluster-admins/CN=kube-apiserver-kubelet-client" ca
    cert front-proxy-client "/CN=front-proxy-client" front-proxy-ca
    # The node as the Node authorizer knows nodes; kube-proxy as the bootstrap
    # policy's system:node-proxier binding names it.
    cert node "/O=system:nodes/CN=system:node:$NODE_NAME" ca
    cert kube-proxy "/CN=system:kube-proxy" ca
    # The kubelet's serving certificate: the API server reaches it for logs and exec.
    cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" ca "$(printf '%s\n' \
        "subjectAltName=IP:$NODE_IP,DNS:$NODE_NAME" "extendedKeyUsage=serverAuth")"
    ssl genrsa -out "$PKI/sa.key" 2048
    ssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
fi

kubeconfig() { # file user
    cat >"$DIR/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: mailcluster-kube
  cluster:
    server: https://$API_HOST:$API_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: $1
  user:
    client-certificate: $PKI/$2.crt
    client-key: $PKI/$2.key
contexts:
- name: mailcluster-kube
  context: {cluster: mailcluster-kube, user: $1}
current-context: mailcluster-kube
EOF
}
kubeconfig admin admin
kubeconfig controller-manager controller-manager
kubeconfig scheduler scheduler
kubeconfig node node
kubeconfig kube-proxy kube-proxy

start() { # name args...
    local name=$1 exe="$BIN/$1"; shift
    [ -x "$exe" ] || exe=$(command -v "$name" 2>/dev/null || true)
    [ -x "$exe" ] || exe="$ROOT/target/debug/$name"
    setsid "$exe" "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
    echo $! >"$PIDS/$name"
}

wait_for() { # name check-command...
    local name=$1; shift
    local deadline=$((SECONDS + START_SECS))
    until "$@" >/dev/null 2>&1; do
        if ! alive "$name"; then
            tail -n 40 "$LOGS/$name.log" >&2 || true
            die "$name exited during start (log: $LOGS/$name.log)"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail -n 40 "$LOGS/$name.log" >&2 || true
            die "$name did not become ready within ${START_SECS}s (log: $LOGS/$name.log)"
        fi
        sleep 0.5
    done
}

log "starting etcd on 127.0.0.1:$ETCD_PORT"
# No fsync: a throwaway test cluster, where durability buys nothing and fsyncs cost
# the mail server's database its disk.
start etcd --name default --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync \
    --listen-metrics-urls "" --log-level warn
wait_for etcd curl -sf --max-time 2 "http://127.0.0.1:$ETCD_PORT/health"

log "starting kube-apiserver on https://$API_HOST:$API_PORT"
start kube-apiserver \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "$API_HOST" --advertise-address "$API_HOST" --secure-port "$API_PORT" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP,Hostname \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --authorization-mode Node,RBAC --allow-privileged=true \
    --enable-admission-plugins NodeRestriction,PodTolerationRestriction \
    --requestheader-client-ca-file "$PKI/front-proxy-ca.crt" \
    --requestheader-allowed-names front-proxy-client \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --requestheader-group-headers X-Remote-Group --requestheader-username-headers X-Remote-User \
    --proxy-client-cert-file "$PKI/front-proxy-client.crt" --proxy-client-key-file "$PKI/front-proxy-client.key" \
    --enable-aggregator-routing=true \
    --profiling=false
wait_for kube-apiserver api_ready

log "starting kube-controller-manager and kube-scheduler"
# --use-service-account-credentials: every controller acts as its own service
# account, so RBAC is enforced on them as in a production cluster.
start kube-controller-manager \
    --kubeconfig "$DIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$DIR/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 \
    --leader-elect=false --use-service-account-credentials \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --horizontal-pod-autoscaler-sync-period 5s \
    --profiling=false
start kube-scheduler \
    --kubeconfig "$DIR/scheduler.kubeconfig" \
    --authentication-kubeconfig "$DIR/scheduler.kubeconfig" \
    --authorization-kubeconfig "$DIR/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false --profiling=false

export KUBECONFIG="$KUBECONFIG_PATH"
# Ready when the controllers act: the service-account controller creates `default`
# in every namespace, the root-CA publisher its ConfigMap.
sa_ready() { kubectl get serviceaccount default -n default >/dev/null 2>&1; }
wait_for kube-controller-manager sa_ready
wait_for kube-scheduler kubectl get --raw /readyz >/dev/null 2>&1
sleep 1
alive kube-scheduler || { tail -n 40 "$LOGS/kube-scheduler.log" >&2; die "kube-scheduler exited (log: $LOGS/kube-scheduler.log)"; }

if [ "$MAILCLUSTER_KUBE_NODE" = 1 ]; then
    # shellcheck source=scripts/kube-node.sh
    source "$ROOT/scripts/kube-node.sh"
    start_node
fi

log "control plane $("$BIN/kube-apiserver" --version 2>/dev/null | awk '{print $2}') ready in $DIR"
echo "export KUBECONFIG=$KUBECONFIG_PATH"
