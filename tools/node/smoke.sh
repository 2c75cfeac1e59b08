#!/usr/bin/env bash
# `make test-node`: a control plane and a node of their own, then what a chart's Pods need:
#   - an image built here (tools/node/cmd/hello, static) pushed to the node's registry;
#   - a Deployment (1 replica, readiness probe run by the kubelet, restricted security context
#     with seccomp RuntimeDefault) and a ClusterIP Service;
#   - from a second Pod (kubectl exec, through the kubelet): the Service by ClusterIP and by DNS
#     name, and the `kubernetes` Service with the Pod's ServiceAccount token;
#   - kubectl port-forward and kubectl logs (apiserver -> kubelet -> containerd);
# prints one summary line and tears everything down (also on failure).
#
# Usage: tools/node/smoke.sh      (root; SMOKE_KEEP=1 leaves it all running for a look)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
te_dir=${SMOKE_TESTENV_DIR:-$repo/.tmp/testenv-node-smoke}
node_dir=${SMOKE_NODE_DIR:-$repo/.tmp/node-smoke}
. "$here/net.env"
say() { echo "[test-node] $*" >&2; }
fail() { echo "[test-node] FAIL: $*" >&2; exit 1; }
testenv() { (cd "$repo" && cargo run -q -p testenv --bin testenv -- "$@"); }

[ "$(id -u)" = 0 ] || fail "needs root"
! ip link show "$BRIDGE" >/dev/null 2>&1 || fail "a node is already running (bridge $BRIDGE exists): make node-down first"

k8s_bin=$("$repo/tools/control-plane/build.sh")
bin=$("$here/build.sh")

teardown() {
  local rc=$?
  if [ "${SMOKE_KEEP:-0}" = 1 ]; then
    say "SMOKE_KEEP=1: left running; stop with: tools/node/down.sh --dir $node_dir; cargo run -q -p testenv --bin testenv -- down --dir $te_dir"
    return
  fi
  [ -n "${pf_pid:-}" ] && kill "$pf_pid" 2>/dev/null
  if [ $rc -ne 0 ] && [ -d "$node_dir/logs" ]; then
    cp -r "$node_dir/logs" "$repo/.tmp/node-smoke-logs" 2>/dev/null && say "logs kept in .tmp/node-smoke-logs"
  fi
  "$here/down.sh" --dir "$node_dir" >&2 || true
  testenv down --dir "$te_dir" >&2 && rm -rf "$te_dir"
}
trap teardown EXIT

say "control plane in $te_dir"
rm -rf "$repo/.tmp/node-smoke-logs"
testenv up --detach --dir "$te_dir" --bin-dir "$k8s_bin" --apiserver-arg=--enable-admission-plugins=ServiceAccount >/dev/null
export KUBECONFIG=$te_dir/kubeconfig
kubectl() { "$k8s_bin/kubectl" "$@"; }

"$here/up.sh" --testenv "$te_dir" --dir "$node_dir" >/dev/null
ready_s=$(cat "$node_dir/ready_s")
registry=127.0.0.1:${NODE_REGISTRY_PORT:-5000}

image=$("$here/push-image.sh" "$registry/hello:1" --entrypoint /hello,serve --user 65532:65532 "$bin/hello=/hello")
say "pushed $image"

t0=$(date +%s.%N)
kubectl apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: hello, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: hello}}
  template:
    metadata: {labels: {app: hello}}
    spec:
      securityContext:
        runAsNonRoot: true
        seccompProfile: {type: RuntimeDefault}
      containers:
      - name: hello
        image: $image
        ports: [{name: http, containerPort: 8080}]
        readinessProbe:
          httpGet: {path: /healthz, port: http}
          periodSeconds: 1
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {drop: [ALL]}
---
apiVersion: v1
kind: Service
metadata: {name: hello, namespace: default}
spec:
  selector: {app: hello}
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default}
spec:
  securityContext:
    runAsNonRoot: true
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: client
    image: $image
    args: [--addr, ":9090"]
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL]}
EOF
kubectl wait --for=condition=Available deployment/hello --timeout=120s >/dev/null \
  || { kubectl describe pods -l app=hello >&2; fail "the hello Deployment did not become available"; }
pod_ready_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
kubectl wait --for=condition=Ready pod/client --timeout=60s >/dev/null || fail "the client Pod did not become ready"
pod=$(kubectl get pods -l app=hello -o jsonpath='{.items[0].metadata.name}')
pod_ip=$(kubectl get pod "$pod" -o jsonpath='{.status.podIP}')
cluster_ip=$(kubectl get service hello -o jsonpath='{.spec.clusterIP}')
say "pod $pod ($pod_ip) Ready after ${pod_ready_s}s; Service hello at $cluster_ip"

# exec runs in the client Pod; a few tries each, since kube-proxy may lag the EndpointSlice by
# a moment.
in_client() { # WHAT CMD...: retry for 20 s
  local what=$1
  shift
  local out end=$(( $(date +%s) + 20 ))
  while :; do
    if out=$(kubectl exec client -- /hello "$@" 2>&1); then
      say "$what: $(echo "$out" | tr '\n' ' ' | cut -c1-120)"
      return 0
    fi
    [ "$(date +%s)" -lt "$end" ] || { say "$what failed: $out"; return 1; }
    sleep 1
  done
}
service_ok=0 dns_ok=0 kubernetes_ok=0 portforward_ok=0 logs_ok=0
in_client "ClusterIP http://$cluster_ip/" get "http://$cluster_ip/" && service_ok=1
in_client "DNS http://hello.default.svc.$CLUSTER_DOMAIN/" get "http://hello.default.svc.$CLUSTER_DOMAIN/" && dns_ok=1
sa=/var/run/secrets/kubernetes.io/serviceaccount
in_client "kubernetes Service https://${SERVICE_CIDR%.*}.1/api (ServiceAccount token)" \
  get "https://${SERVICE_CIDR%.*}.1/api" --ca "$sa/ca.crt" --token "$sa/token" && kubernetes_ok=1

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
kubectl port-forward "pod/$pod" "$port:8080" > "$node_dir/logs/port-forward.log" 2>&1 &
pf_pid=$!
for _ in $(seq 1 50); do
  if out=$("$bin/hello" get "http://127.0.0.1:$port/portforward" 2>/dev/null); then
    portforward_ok=1
    say "port-forward 127.0.0.1:$port -> $pod:8080: $(echo "$out" | tr '\n' ' ')"
    break
  fi
  sleep 0.2
done
kill "$pf_pid" 2>/dev/null
pf_pid=
if kubectl logs "$pod" 2>/dev/null | grep -q 'serving on :8080'; then logs_ok=1; fi

line="node ready_s=$ready_s pod_ready_s=$pod_ready_s service_ok=$service_ok dns_ok=$dns_ok kubernetes_svc_ok=$kubernetes_ok portforward_ok=$portforward_ok logs_ok=$logs_ok"
echo "$line"
[ "$service_ok$dns_ok$kubernetes_ok$portforward_ok$logs_ok" = 11111 ] || fail "$line"
say "1 passed, 0 failed"
