# The node of the one-machine cluster, sourced by scripts/kube-up.sh (as root, after
# the control plane is up): containerd with its CRI plugin and the CNI plugins, the
# kubelet of the control plane's release, kube-proxy, and nodeservices/ (cluster
# DNS, the machine's PostgreSQL and Redis at the node's address). Uses kube-up.sh's
# DIR, PKI, LOGS, PIDS, BIN, NODE_*, IMAGE_ARCHIVE and its start/wait_for/log/die.
# scripts/kube-down.sh takes all of it down again, containers included.

CTD="$DIR/containerd"
CTD_SOCK="$CTD/containerd.sock"
KUBELET_DIR="$DIR/kubelet"
CNI_BIN=/usr/lib/cni

ctr_k8s() { ctr --address "$CTD_SOCK" --namespace k8s.io "$@"; }

# The sandbox ("pause") image: Kubernetes' own pause.c from the release's module,
# linked statically, in a `FROM scratch` image tagged as the release expects it.
# Built once per release next to its binaries.
pause_image() { # prints "<archive> <reference>"
    local version src tag archive work
    version=$("$BIN/kubelet" --version | awk '{print $2}')
    src="$(go env GOMODCACHE 2>/dev/null || echo "$HOME/go/pkg/mod")/k8s.io/kubernetes@$version/build/pause"
    [ -f "$src/linux/pause.c" ] || die "no pause.c in $src (scripts/kube-build.sh downloads k8s.io/kubernetes@$version)"
    tag=$(sed -n 's/^TAG ?= *//p' "$src/Makefile")
    archive="$BIN/../pause-$tag.oci.tar"
    if [ ! -f "$archive" ]; then
        log "building the sandbox image registry.k8s.io/pause:$tag from $src/linux/pause.c"
        work=$(mktemp -d)
        mkdir -p "$work/root"
        gcc -Os -Wall -Werror -static -DVERSION="v$tag-mailcluster" -o "$work/root/pause" "$src/linux/pause.c"
        strip "$work/root/pause"
        tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work/root" -cf "$work/root.tar" .
        local b=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs) c
        c=$("${b[@]}" from --quiet scratch)
        "${b[@]}" add --quiet "$c" "$work/root.tar" / >/dev/null
        "${b[@]}" config --user 65535:65535 --entrypoint '["/pause"]' --os linux --arch amd64 "$c"
        "${b[@]}" commit --quiet --timestamp 0 --format oci --disable-compression=false --rm "$c" \
            "oci-archive:$archive.tmp:registry.k8s.io/pause:$tag" >/dev/null
        mv "$archive.tmp" "$archive"
        rm -rf "$work"
    fi
    echo "$archive registry.k8s.io/pause:$tag"
}

start_node() {
    local pause pause_archive pause_ref
    pause=$(pause_image)
    pause_archive=${pause% *}
    pause_ref=${pause#* }
    mkdir -p "$CTD" "$DIR/cni/net.d" "$KUBELET_DIR"

    log "starting containerd ($CTD_SOCK)"
    # CAP_SYS_RESOURCE is bit 24 of the effective set.
    local restrict_oom=false
    (( (16#$(awk '/^CapEff/ {print $2}' /proc/self/status) >> 24) & 1 )) || restrict_oom=true
    # runc through the CRI plugin, cgroupfs (the kubelet's driver here; containerd
    # 1.x cannot tell the kubelet its driver), the node's bridge for Pods.
    # containerd 1.x gives every container RLIMIT_NOFILE 1024 (its default OCI
    # spec); a mail Pod holds one descriptor per connection. The base spec raises it
    # as kind does: the same default spec, its file limit 1048576 — or what this
    # machine lets root give (raising a hard limit takes CAP_SYS_RESOURCE).
    local nofile
    nofile=$(ulimit -Hn)
    if [ "$nofile" = unlimited ] || [ "$nofile" -gt 1048576 ]; then nofile=1048576; fi
    ctr oci spec | python3 -c '
import json, sys
spec = json.load(sys.stdin)
n = int(sys.argv[1])
spec["process"]["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": n, "soft": n}]
json.dump(spec, sys.stdout, indent=1)' "$nofile" >"$CTD/base-spec.json"
    cat >"$CTD/config.toml" <<EOF
version = 2
root = "$CTD/root"
state = "$CTD/state"
[grpc]
  address = "$CTD_SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_ref"
  # The kubelet asks for negative OOM scores (the sandbox's -998); lowering a score
  # takes CAP_SYS_RESOURCE, which a machine that is itself a container may not
  # give root. Restricted, a score is never set below containerd's own.
  restrict_oom_score_adj = $restrict_oom
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      base_runtime_spec = "$CTD/base-spec.json"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$DIR/cni/net.d"
EOF
    # Pods on the node's bridge, the node's address their gateway (Services and the
    # node's own ports are reached through it).
    local subnet
    subnet=$(python3 -c 'import ipaddress, sys; print(ipaddress.ip_interface(sys.argv[1]).network)' "$NODE_CIDR")
    cat >"$DIR/cni/net.d/10-mailcluster.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "mailcluster",
  "plugins": [
    {"type": "bridge", "bridge": "$NODE_BRIDGE", "isGateway": true, "isDefaultGateway": true,
     "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$DIR/cni/ipam",
              "ranges": [[{"subnet": "$subnet",
                           "gateway": "$NODE_IP"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
    start containerd --config "$CTD/config.toml"
    wait_for containerd ctr --address "$CTD_SOCK" version

    log "importing $(basename "$IMAGE_ARCHIVE") and $pause_ref into containerd (namespace k8s.io)"
    ctr_k8s images import "$pause_archive" >/dev/null
    ctr_k8s images import "$IMAGE_ARCHIVE" >&2

    # The API server asks the kubelet for logs, exec and port-forward with its
    # client certificate; the kubelet asks the API server whether that user may.
    kubectl apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "mailcluster-kube:apiserver-kubelet-client"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:kubelet-api-admin"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: kube-apiserver-kubelet-client}]
EOF

    log "starting kubelet (node $NODE_NAME at $NODE_IP)"
    printf 'nameserver %s\n' "$NODE_IP" >"$KUBELET_DIR/resolv.conf"
    local taints=""
    if [ -n "$NODE_TAINT" ]; then
        local kv=${NODE_TAINT%:*}
        taints="registerWithTaints: [{key: \"${kv%%=*}\", value: \"${kv#*=}\", effect: \"${NODE_TAINT##*:}\"}]"
    fi
    # Eviction and image garbage collection are off in effect: this node shares the
    # machine's disk with the builds, and an imported image has no registry to come
    # back from. cgroup v1 is what such machines have; the kubelet warns about it.
    # net.core.somaxconn is the one unsafe sysctl MailCluster spec.tuning sets.
    cat >"$KUBELET_DIR/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$CTD_SOCK
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
resolvConf: $KUBELET_DIR/resolv.conf
allowedUnsafeSysctls: [net.core.somaxconn]
evictionHard: {memory.available: 100Mi, nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 110
$taints
EOF
    start kubelet --config "$KUBELET_DIR/config.yaml" --kubeconfig "$DIR/node.kubeconfig" \
        --root-dir "$KUBELET_DIR/root" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" \
        --node-labels "mailcluster.dev/test-node=true,topology.kubernetes.io/zone=local-a,topology.kubernetes.io/region=local" \
        --v=1
    node_ready() { [ "$(kubectl get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; }
    wait_for kubelet node_ready

    log "starting kube-proxy and the node's services (DNS, PostgreSQL and Redis at $NODE_IP)"
    start kube-proxy \
        --kubeconfig "$DIR/kube-proxy.kubeconfig" --hostname-override "$NODE_NAME" \
        --proxy-mode iptables --cluster-cidr "$NODE_CIDR" \
        --healthz-bind-address 127.0.0.1:10256 --metrics-bind-address 127.0.0.1:10249 \
        --conntrack-max-per-core 0
    # The DNS reads EndpointSlices (headless Services) with kube-proxy's
    # credentials, as CoreDNS reads them with an account of its own.
    start mailcluster-node-services --kubeconfig "$DIR/kube-proxy.kubeconfig" --address "$NODE_IP" \
        --host-port 5432 --host-port 6379
    wait_for kube-proxy curl -sf --max-time 2 http://127.0.0.1:10256/healthz
    # A Node is Ready before the Service rules exist; the node's DNS answers once
    # it has listed the Services.
    wait_for mailcluster-node-services bash -c "exec 3<>/dev/tcp/$NODE_IP/5432"
}
