#!/usr/bin/env bash
# Starts one real Kubernetes node on this machine, joined to a running testenv control plane
# (`make cluster-up`, or the one `make node-up` starts): an OCI registry on 127.0.0.1,
# containerd + runc, the CNI bridge `am0`, kubelet, kube-proxy (iptables), kube-scheduler and
# kube-controller-manager. Waits until the Node is Ready. docs/node.md says what and why.
#
# Usage: tools/node/up.sh [--testenv DIR] [--dir DIR]
#   --testenv DIR   the testenv state directory (default .tmp/testenv, or $TESTENV_DIR)
#   --dir DIR       this node's state directory (default .tmp/node, or $NODE_DIR)
# Environment: NODE_NAME (am-node), NODE_REGISTRY_PORT (5000), NODE_TIMEOUT (120 s).
# Progress goes to stderr; the export lines (KUBECONFIG, PATH, NODE_REGISTRY) go to stdout.
# tools/node/down.sh undoes all of it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
testenv_dir=${TESTENV_DIR:-$repo/.tmp/testenv}
dir=${NODE_DIR:-$repo/.tmp/node}
while [ $# -gt 0 ]; do
  case $1 in
    --testenv) testenv_dir=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    *) echo "usage: $0 [--testenv DIR] [--dir DIR]" >&2; exit 2 ;;
  esac
done
testenv_dir=$(realpath -m "$testenv_dir")
dir=$(realpath -m "$dir")
node=${NODE_NAME:-am-node}
reg_port=${NODE_REGISTRY_PORT:-5000}
registry=127.0.0.1:$reg_port
timeout=${NODE_TIMEOUT:-120}

# The ranges: nothing here routes anywhere but this machine.
# shellcheck source=tools/node/net.env
. "$here/net.env"

t0=$(date +%s.%N)
since() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1fs", b - a }'; }
say() { echo "[node-up $(since)] $*" >&2; }
die() { echo "[node-up] error: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "a node needs root (network namespaces, mounts, iptables, cgroups)"
[ -f "$testenv_dir/state.json" ] || die "no control plane in $testenv_dir: run \`make cluster-up\` (or \`make node-up\`, which starts one)"
read_state() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$testenv_dir/state.json" "$1"; }
te_pid=$(read_state pid)
kill -0 "$te_pid" 2>/dev/null || die "the control plane in $testenv_dir (pid $te_pid) is not running: run \`make cluster-up\`"
server=$(read_state serverUrl)
admin_kubeconfig=$(read_state kubeconfig)
k8s_bin=$(read_state binDir)
te_data=$(read_state dataDir)
pki=$te_data/pki
[ -f "$pki/ca.key" ] || die "$pki/ca.key is missing: this testenv predates node support; restart it (make cluster-down cluster-up)"
api_port=${server##*:}
if ! tr '\0' '\n' < "/proc/$(read_state apiserverPid)/cmdline" | grep -qx -- '--enable-admission-plugins=.*ServiceAccount.*'; then
  say "warning: this control plane runs without the ServiceAccount admission plugin, so Pods get no ServiceAccount token; \`make cluster-down node-up\` starts one with it"
fi
kubectl() { "$k8s_bin/kubectl" --kubeconfig "$admin_kubeconfig" "$@"; }

if [ -f "$dir/pids/kubelet.pid" ] && kill -0 "$(cat "$dir/pids/kubelet.pid")" 2>/dev/null; then
  die "a node is already running from $dir; stop it with \`make node-down\`"
fi
if ! command -v iptables >/dev/null; then
  if command -v apt-get >/dev/null; then
    say "installing iptables (kube-proxy's iptables mode runs the iptables commands)"
    apt-get install -y -qq iptables >&2 || { apt-get update -qq >&2 && apt-get install -y -qq iptables >&2; }
  else
    die "iptables is not installed"
  fi
fi
if ip link show "$BRIDGE" >/dev/null 2>&1; then
  die "the bridge $BRIDGE already exists: a node from another state directory, or a half-stopped one (tools/node/down.sh --dir ...)"
fi

bin=$("$here/build.sh")
say "binaries: $bin"
rm -rf "$dir"
mkdir -p "$dir"/{pids,logs,pki,cni/net.d,cni/ipam,containerd/certs.d/"$registry",kubelet,pod-logs,registry}
echo "$testenv_dir" > "$dir/testenv-dir"
echo "$bin" > "$dir/bin-dir"
echo "$k8s_bin" > "$dir/k8s-bin-dir"

# Anything that fails from here on stops what was started.
cleanup_on_error() {
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "[node-up] failed (exit $rc); logs are in $dir/logs; stopping what was started" >&2
    for f in "$dir"/logs/*.log; do
      [ -f "$f" ] || continue
      echo "--- last lines of $f" >&2
      tail -n 8 "$f" >&2
    done
    "$here/down.sh" --dir "$dir" --keep-logs >&2 || true
  fi
}
trap cleanup_on_error EXIT

start_daemon() { # NAME CMD... : background, own session, log file, pid file
  local name=$1
  shift
  setsid "$@" > "$dir/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$dir/pids/$name.pid"
}
wait_for() { # WHAT SECONDS CMD...
  local what=$1 secs=$2
  shift 2
  local end=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || die "$what did not come up within ${secs}s"
    sleep 0.2
  done
}

# ---------------------------------------------------------------- host network and sysctls
# Saved once so down.sh puts back exactly what was there.
sysctls=(net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
  vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.conf.all.route_localnet)
for cmd in iptables ip6tables; do
  "$cmd-save" > "$dir/$cmd.before" 2>/dev/null || true
done
for s in "${sysctls[@]}"; do
  echo "$s=$(sysctl -n "$s")"
done > "$dir/sysctl.saved"

say "network: bridge $BRIDGE $NODE_IP/${POD_CIDR#*/} (pods $POD_CIDR), services $SERVICE_CIDR routed to $BRIDGE"
ip link add "$BRIDGE" type bridge
ip addr add "$NODE_IP/${POD_CIDR#*/}" dev "$BRIDGE"
ip link set "$BRIDGE" up
# A ClusterIP that kube-proxy did not rewrite must not follow the default route off the machine.
ip route add "$SERVICE_CIDR" dev "$BRIDGE"
sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1
# Guards: nothing from the pod bridge is forwarded anywhere but back onto it, and no packet
# for the pod or service ranges leaves by any interface but the bridge or loopback.
iptables -w -N AM-NODE-FORWARD
iptables -w -A AM-NODE-FORWARD -i "$BRIDGE" -o "$BRIDGE" -j RETURN
iptables -w -A AM-NODE-FORWARD -j REJECT
iptables -w -I FORWARD 1 -i "$BRIDGE" -j AM-NODE-FORWARD
iptables -w -I FORWARD 1 -o "$BRIDGE" -j AM-NODE-FORWARD
iptables -w -N AM-NODE-OUTPUT
iptables -w -A AM-NODE-OUTPUT -o "$BRIDGE" -j RETURN
iptables -w -A AM-NODE-OUTPUT -o lo -j RETURN
iptables -w -A AM-NODE-OUTPUT -j REJECT
iptables -w -I OUTPUT 1 -d "$POD_CIDR" -j AM-NODE-OUTPUT
iptables -w -I OUTPUT 1 -d "$SERVICE_CIDR" -j AM-NODE-OUTPUT

# ---------------------------------------------------------------- certificates
# Signed by the testenv CA, with the identities the default RBAC policy knows.
sign() { # NAME CN [O] [SAN]
  local name=$1 cn=$2 org=${3:-} san=${4:-}
  local subj="/CN=$cn"
  [ -z "$org" ] || subj="/O=$org$subj"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "$subj" \
    -keyout "$dir/pki/$name.key" -out "$dir/pki/$name.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature"
    if [ -n "$san" ]; then
      echo "extendedKeyUsage=serverAuth"
      echo "subjectAltName=$san"
    else
      echo "extendedKeyUsage=clientAuth"
    fi
  } > "$dir/pki/$name.ext"
  openssl x509 -req -in "$dir/pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -CAcreateserial -CAserial "$dir/pki/ca.srl" -days 30 -sha256 -extfile "$dir/pki/$name.ext" \
    -out "$dir/pki/$name.crt" 2>/dev/null
  chmod 600 "$dir/pki/$name.key"
}
kubeconfig() { # NAME: a kubeconfig for the client cert NAME.crt
  local name=$1
  cat > "$dir/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster:
    server: $server
    certificate-authority: $pki/ca.crt
users:
- name: $name
  user:
    client-certificate: $dir/pki/$name.crt
    client-key: $dir/pki/$name.key
contexts:
- name: $name
  context: {cluster: testenv, user: $name}
current-context: $name
EOF
  chmod 600 "$dir/$name.kubeconfig"
}
say "certificates: kubelet (system:node:$node), kube-proxy, kube-scheduler, kube-controller-manager"
sign kubelet "system:node:$node" system:nodes
sign kubelet-serving "$node" "" "DNS:$node,IP:$NODE_IP"
sign kube-proxy system:kube-proxy
sign kube-scheduler system:kube-scheduler
sign kube-controller-manager system:kube-controller-manager
for n in kubelet kube-proxy kube-scheduler kube-controller-manager; do kubeconfig "$n"; done

# ---------------------------------------------------------------- objects the node needs
# RBAC alone authorizes this apiserver (no Node authorizer): bind the kubelet's user to the
# system:node role, as clusters did before the Node authorizer. The `kubernetes` Service gets
# its endpoint by hand (the apiserver's reconciler is off): the forwarder on the bridge.
kubectl apply -f - > "$dir/logs/objects.log" <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: automanager-node:$node
  labels: {app.kubernetes.io/managed-by: automanager-node}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:node"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:node:$node"}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes
  namespace: default
  labels:
    kubernetes.io/service-name: kubernetes
    endpointslice.kubernetes.io/managed-by: automanager-node
addressType: IPv4
endpoints:
- addresses: ["$NODE_IP"]
  conditions: {ready: true}
ports:
- {name: https, port: $APISERVER_FORWARD_PORT, protocol: TCP}
EOF

# ---------------------------------------------------------------- registry + pause image
say "registry on $registry (blobs in $dir/registry)"
start_daemon registry "$bin/crane" registry serve --address "$registry" --disk "$dir/registry"
wait_for "the registry on $registry" 20 "$bin/crane" catalog "$registry"
pause_ref=$registry/pause:$PAUSE_TAG
CRANE=$bin/crane "$here/push-image.sh" "$pause_ref" --entrypoint /pause "$bin/pause=/pause" > "$dir/pause.ref"
say "pushed the sandbox image $(cat "$dir/pause.ref")"

# ---------------------------------------------------------------- containerd
cat > "$dir/containerd/certs.d/$registry/hosts.toml" <<EOF
server = "http://$registry"

[host."http://$registry"]
  capabilities = ["pull", "resolve"]
EOF
cat > "$dir/containerd/config.toml" <<EOF
version = 3
root = "$dir/containerd/root"
state = "$dir/containerd/state"
temp = "$dir/containerd/tmp"
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "$dir/containerd/containerd.sock"

[ttrpc]
  address = "$dir/containerd/containerd.sock.ttrpc"

[debug]
  level = "info"

[plugins.'io.containerd.internal.v1.opt']
  path = "$dir/containerd/opt"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$pause_ref"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "$dir/containerd/certs.d"

[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  # This machine withholds CAP_SYS_RESOURCE, so no process may lower its oom_score_adj below
  # containerd's (0): the kubelet's -998 for sandboxes and -997 for Guaranteed Pods are raised
  # to 0 instead of failing every container start (docs/node.md).
  restrict_oom_score_adj = true
  cdi_spec_dirs = []
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$bin/runc"
        Root = "$dir/containerd/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$bin/cni"]
    conf_dir = "$dir/cni/net.d"
    max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
cat > "$dir/cni/net.d/10-am.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "am-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$dir/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
        "routes": [{"dst": "$SERVICE_CIDR"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
say "containerd (socket $dir/containerd/containerd.sock, overlayfs, runc, cgroupfs)"
start_daemon containerd env PATH="$bin:$PATH" "$bin/containerd" --config "$dir/containerd/config.toml"
ctr() { "$bin/ctr" --address "$dir/containerd/containerd.sock" "$@"; }
wait_for containerd 30 ctr version

# ---------------------------------------------------------------- forwarder for the `kubernetes` Service
start_daemon forward "$bin/forward" "$NODE_IP:$APISERVER_FORWARD_PORT" "127.0.0.1:$api_port"

# ---------------------------------------------------------------- kubelet
cat > "$dir/resolv.conf" <<EOF
# Pods' upstream resolver: none (nothing here may leave the machine). Cluster names are served
# by the cluster DNS (clusterDNS in kubelet.yaml) when it runs.
nameserver 127.0.0.1
options ndots:1
EOF
cat > "$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $dir/pki/kubelet-serving.crt
tlsPrivateKeyFile: $dir/pki/kubelet-serving.key
rotateCertificates: false
serverTLSBootstrap: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization:
  mode: Webhook
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: true
cgroupRoot: /
containerRuntimeEndpoint: unix://$dir/containerd/containerd.sock
imageServiceEndpoint: unix://$dir/containerd/containerd.sock
staticPodPath: ""
podLogsDir: $dir/pod-logs
resolvConf: $dir/resolv.conf
clusterDomain: $CLUSTER_DOMAIN
clusterDNS: [$CLUSTER_DNS]
failSwapOn: false
memorySwap: {swapBehavior: NoSwap}
maxPods: 110
podCIDR: $POD_CIDR
serializeImagePulls: false
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
EOF
# A Node left from an earlier run still says Ready: it goes, and this kubelet registers anew
# (Pods bound to the old one are collected and their controllers make new ones).
if kubectl get node "$node" >/dev/null 2>&1; then
  say "deleting node/$node left from an earlier run"
  kubectl delete node "$node" --wait=true >/dev/null
fi
say "kubelet $node (node IP $NODE_IP, root $dir/kubelet)"
start_daemon kubelet "$bin/kubelet" --config "$dir/kubelet.yaml" --kubeconfig "$dir/kubelet.kubeconfig" \
  --root-dir "$dir/kubelet" --cert-dir "$dir/kubelet/pki" --hostname-override "$node" --node-ip "$NODE_IP" --v=2

# ---------------------------------------------------------------- scheduler, controller-manager
say "kube-scheduler and kube-controller-manager"
start_daemon kube-scheduler "$bin/kube-scheduler" --kubeconfig "$dir/kube-scheduler.kubeconfig" \
  --authentication-kubeconfig "$dir/kube-scheduler.kubeconfig" --authorization-kubeconfig "$dir/kube-scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port 10259 --leader-elect=false --v=1
start_daemon kube-controller-manager "$bin/kube-controller-manager" \
  --kubeconfig "$dir/kube-controller-manager.kubeconfig" \
  --authentication-kubeconfig "$dir/kube-controller-manager.kubeconfig" \
  --authorization-kubeconfig "$dir/kube-controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port 10257 --leader-elect=false \
  --use-service-account-credentials=true --root-ca-file "$pki/ca.crt" \
  --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
  --service-account-private-key-file "$pki/sa.key" \
  --service-cluster-ip-range "$SERVICE_CIDR" --cluster-cidr "$POD_CIDR" --allocate-node-cidrs=false \
  --cluster-name automanager-node --v=1

# ---------------------------------------------------------------- kube-proxy
cat > "$dir/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $dir/kube-proxy.kubeconfig
hostnameOverride: $node
mode: iptables
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
clusterCIDR: $POD_CIDR
detectLocalMode: ClusterCIDR
nodePortAddresses: ["$NODE_IP/32"]
iptables:
  localhostNodePorts: false
  masqueradeAll: false
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
say "kube-proxy (iptables)"
start_daemon kube-proxy "$bin/kube-proxy" --config "$dir/kube-proxy.yaml" --v=1

# ---------------------------------------------------------------- wait
say "waiting for node/$node to be Ready (up to ${timeout}s)"
end=$(( $(date +%s) + timeout ))
until [ "$(kubectl get node "$node" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; do
  for d in registry containerd forward kubelet kube-scheduler kube-controller-manager kube-proxy; do
    kill -0 "$(cat "$dir/pids/$d.pid")" 2>/dev/null || die "$d exited: see $dir/logs/$d.log"
  done
  [ "$(date +%s)" -lt "$end" ] || die "node/$node was not Ready within ${timeout}s"
  sleep 0.5
done
ready_s=$(since)
echo "${ready_s%s}" > "$dir/ready_s"
say "node/$node Ready after $ready_s"

# ---------------------------------------------------------------- cluster DNS
# CoreDNS as a Pod, the way clusters run it: Service kube-dns on $CLUSTER_DNS (the kubelet's
# clusterDNS), RBAC to watch Services and EndpointSlices, the apiserver through the
# `kubernetes` Service. No forward plugin: only $CLUSTER_DOMAIN names are answered.
if [ "${NODE_DNS:-1}" = 1 ]; then
  dns_ref=$(CRANE=$bin/crane "$here/push-image.sh" "$registry/coredns:1.15.0" --entrypoint /coredns,-conf,/etc/coredns/Corefile \
    --user 65532:65532 "$bin/coredns=/coredns")
  say "cluster DNS: CoreDNS ($dns_ref) behind kube-dns $CLUSTER_DNS"
  sed -e "s|@IMAGE@|$dns_ref|" -e "s|@CLUSTER_DNS@|$CLUSTER_DNS|" -e "s|@DOMAIN@|$CLUSTER_DOMAIN|" \
    "$here/coredns.yaml" | kubectl apply -f - >> "$dir/logs/objects.log"
  kubectl -n kube-system rollout status deployment/coredns --timeout="${timeout}s" >&2 \
    || die "CoreDNS did not become ready: kubectl -n kube-system describe pod -l k8s-app=kube-dns"
  say "cluster DNS ready"
fi
trap - EXIT
say "node up in $(since)"
cat <<EOF
export KUBECONFIG=$admin_kubeconfig
export PATH=$k8s_bin:\$PATH
export NODE_REGISTRY=$registry
EOF
