#!/usr/bin/env bash
# `make demo`: the whole product on this machine. Starts a local control plane (or uses the
# cluster KUBECONFIG points at), installs the CRDs, starts the Manager simulator and the operator,
# applies examples/, waits until the bundles are Ready, prints them, then the fleet's map and one
# placement trace through the kubectl plugin, keeps running until Ctrl-C and stops everything it
# started.
#
# DEMO_EXIT=1 stops right after printing (what the test suite's demo smoke test does).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dir=${DEMO_DIR:-$root/.tmp/demo}
target=${CARGO_TARGET_DIR:-$root/target}
mkdir -p "$dir"
say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

pids=()
started_cluster=0
cleanup() {
  trap - EXIT INT TERM
  say "stopping what the demo started"
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$started_cluster" = 1 ]; then "$target/debug/testenv" down --dir "$dir/cluster" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT INT TERM

say "building the operator, manager-sim and testenv (first build takes a few minutes)"
# DEMO_BUILD_ARGS: `make test` builds as its `cargo test --workspace` did, so nothing compiles again.
# shellcheck disable=SC2086
cargo build ${DEMO_BUILD_ARGS:---bins -p automanager-operator -p manager-sim -p testenv -p automanager-cli}
bin_dir=$(tools/control-plane/build.sh)
# kubectl runs the plugin (kubectl-automanager) from PATH.
export PATH="$bin_dir:$target/debug:$PATH"

if [ -n "${KUBECONFIG:-}" ]; then
  say "using the cluster in KUBECONFIG=$KUBECONFIG"
else
  say "starting a local control plane (etcd + kube-apiserver on 127.0.0.1)"
  "$target/debug/testenv" down --dir "$dir/cluster" >/dev/null 2>&1 || true
  eval "$("$target/debug/testenv" up --detach --dir "$dir/cluster")"
  started_cluster=1
fi

say "installing the CRDs"
kubectl apply -f crds/ >/dev/null
kubectl wait --for condition=established --timeout=60s -f crds/ >/dev/null

say "starting manager-sim (deploy/demo/manager-sim.yaml)"
"$target/debug/manager-sim" serve --config deploy/demo/manager-sim.yaml >"$dir/manager-sim.out" 2>"$dir/manager-sim.log" &
pids+=($!)
for _ in $(seq 1 100); do
  addr=$(sed -n 's/^manager-sim listening on //p' "$dir/manager-sim.out" | head -1)
  [ -n "$addr" ] && break
  sleep 0.1
done
[ -n "${addr:-}" ] || { cat "$dir/manager-sim.log" >&2; echo "manager-sim did not start" >&2; exit 1; }

# Both ports in one go, each socket held until both are picked: two separate picks can return the
# same port, and the operator refuses a debugging port equal to its HTTP port.
read -r free_http free_debug < <(python3 -c "import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(('127.0.0.1', 0))
print(*(x.getsockname()[1] for x in s))")
http_port=${DEMO_HTTP_PORT:-$free_http}
debug_port=${DEMO_DEBUG_PORT:-$free_debug}
cat >"$dir/operator.yaml" <<YAML
manager:
  url: http://$addr
http:
  bindAddress: 127.0.0.1:$http_port
  debugBindAddress: 127.0.0.1:$debug_port
leaderElection:
  enabled: true
  leaseNamespace: default
YAML
say "starting automanager-operator (manager at http://$addr, http on 127.0.0.1:$http_port, debugging API on 127.0.0.1:$debug_port)"
RUST_LOG=${RUST_LOG:-info} "$target/debug/automanager-operator" --config "$dir/operator.yaml" >"$dir/operator.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 300); do
  curl -fs "http://127.0.0.1:$http_port/readyz" >/dev/null 2>&1 && break
  kill -0 "${pids[-1]}" 2>/dev/null || { cat "$dir/operator.log" >&2; exit 1; }
  sleep 0.2
done

say "applying examples/"
kubectl apply -f examples/
say "waiting for the bundles to be Ready"
kubectl wait --for=jsonpath='{.status.phase}'=Ready bundle --all -n default --timeout=180s

echo
kubectl get automanager -A
echo
say "the fleet: kubectl automanager map --bundle my-channel-1"
kubectl automanager map --bundle my-channel-1
echo
# The operator runs here as a process, not in a Pod, so the plugin is given its address; in a
# cluster it port-forwards to the leader Pod by itself (docs/cli.md).
say "why it is there: kubectl automanager trace my-channel-1 --replica 0 --operator-url http://127.0.0.1:$debug_port"
kubectl automanager trace my-channel-1 --replica 0 --operator-url "http://127.0.0.1:$debug_port"

if [ "${DEMO_EXIT:-0}" = 1 ]; then
  exit 0
fi
echo
say "running; logs in $dir. Try: kubectl automanager map; $target/debug/manager-sim chaos --addr http://$addr kill-node <node>; kubectl automanager map again. Ctrl-C to stop."
[ "$started_cluster" = 1 ] && echo "  (this shell: export KUBECONFIG=$dir/cluster/kubeconfig PATH=$bin_dir:$target/debug:\$PATH)"
while true; do sleep 3600; done
