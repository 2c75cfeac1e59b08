#!/usr/bin/env bash
# Stops the node tools/node/up.sh started and undoes what it did to the host: every daemon,
# every container (and process left in the node's cgroups), every mount under the state
# directory, the veths and the bridge, the iptables chains that were not there before, and the
# sysctls it changed. Safe to run twice, or after a half-finished up.sh.
#
# Usage: tools/node/down.sh [--dir DIR] [--keep-logs]
#   --dir DIR      the node's state directory (default .tmp/node, or $NODE_DIR)
#   --keep-logs    keep DIR/logs (up.sh uses it when a start fails); the rest of DIR is removed
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
dir=${NODE_DIR:-$repo/.tmp/node}
keep_logs=0
while [ $# -gt 0 ]; do
  case $1 in
    --dir) dir=$2; shift 2 ;;
    --keep-logs) keep_logs=1; shift ;;
    *) echo "usage: $0 [--dir DIR] [--keep-logs]" >&2; exit 2 ;;
  esac
done
dir=$(realpath -m "$dir")
# shellcheck source=tools/node/net.env
. "$here/net.env"
say() { echo "[node-down] $*" >&2; }
[ "$(id -u)" = 0 ] || { say "needs root"; exit 1; }
if [ ! -d "$dir" ] && ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  say "no node in $dir"
  exit 0
fi
bin=$(cat "$dir/bin-dir" 2>/dev/null || true)

stop() { # [-g SECONDS] NAME...: SIGTERM to all, then SIGKILL to those left after the grace period
  local grace=10
  if [ "$1" = -g ]; then grace=$2; shift 2; fi
  local name pid pids=() names=()
  for name in "$@"; do
    [ -f "$dir/pids/$name.pid" ] || continue
    pid=$(cat "$dir/pids/$name.pid")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null
      pids+=("$pid") names+=("$name")
    fi
  done
  local end=$(( $(date +%s) + grace )) i
  for i in "${!pids[@]}"; do
    while kill -0 "${pids[$i]}" 2>/dev/null && [ "$(date +%s)" -lt "$end" ]; do sleep 0.1; done
    if kill -0 "${pids[$i]}" 2>/dev/null; then
      say "${names[$i]} did not stop within ${grace}s: SIGKILL"
      kill -KILL "${pids[$i]}" 2>/dev/null
    fi
  done
  for name in "$@"; do rm -f "$dir/pids/$name.pid"; done
}

say "stopping the control loops and the kubelet"
stop kube-scheduler kube-controller-manager kube-proxy kubelet

sock=$dir/containerd/containerd.sock
if [ -n "$bin" ] && [ -S "$sock" ] && [ -f "$dir/pids/containerd.pid" ] && kill -0 "$(cat "$dir/pids/containerd.pid")" 2>/dev/null; then
  say "removing the containers"
  ctr() { timeout 20 "$bin/ctr" --address "$sock" --namespace k8s.io "$@"; }
  for t in $(ctr tasks ls -q 2>/dev/null); do ctr tasks kill -s SIGKILL "$t" >/dev/null 2>&1; done
  sleep 0.5
  for t in $(ctr tasks ls -q 2>/dev/null); do ctr tasks delete -f "$t" >/dev/null 2>&1; done
  for c in $(ctr containers ls -q 2>/dev/null); do ctr containers delete "$c" >/dev/null 2>&1; done
fi
stop -g 15 containerd
# Shims outlive containerd by design; ours name our socket on their command line.
for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $sock" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
stop forward registry
# The shims' socket directory is fixed (/run/containerd/s); leave it only if someone else uses it.
rmdir /run/containerd/s /run/containerd 2>/dev/null || true

# Whatever still runs in the pods' cgroups (kubelet's /kubepods in every v1 hierarchy).
for pass in 1 2 3; do
  left=0
  for procs in $(find /sys/fs/cgroup/*/kubepods -name cgroup.procs 2>/dev/null); do
    while read -r p; do
      [ -n "$p" ] && kill -KILL "$p" 2>/dev/null && left=1
    done < "$procs"
  done
  [ $left = 0 ] && break
  sleep 0.5
done
for h in /sys/fs/cgroup/*/; do
  [ -d "$h/kubepods" ] || continue
  find "$h/kubepods" -depth -type d -exec rmdir {} \; 2>/dev/null
done

# Mounts under the state dir, deepest first: netns bind mounts, container rootfs overlays,
# shm, the kubelet's volume tmpfs.
mounts=$(awk -v d="$dir/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
for m in $mounts; do
  umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || say "could not unmount $m"
done

if ip link show "$BRIDGE" >/dev/null 2>&1; then
  say "removing the bridge $BRIDGE and its veths"
  for v in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{ print $2 }' | cut -d@ -f1); do
    ip link delete "$v" 2>/dev/null
  done
  ip link delete "$BRIDGE"
fi
ip route del "$SERVICE_CIDR" 2>/dev/null || true

say "removing the iptables rules the node added"
if [ -n "$bin" ] && [ -x "$bin/kube-proxy" ]; then
  "$bin/kube-proxy" --cleanup >/dev/null 2>&1 || true
fi
for cmd in iptables ip6tables; do
  command -v "$cmd" >/dev/null || continue
  before=$dir/$cmd.before
  for table in filter nat mangle; do
    chains=$("$cmd-save" -t "$table" 2>/dev/null | awk '/^:/ { print substr($1, 2) }' | grep -E '^(KUBE-|CNI-|AM-NODE-)' || true)
    for c in $chains; do
      # Only chains that up.sh's snapshot did not have.
      if [ -f "$before" ] && grep -q "^:$c " "$before"; then continue; fi
      # Drop every rule that jumps to it, then the chain.
      "$cmd-save" -t "$table" | grep -E -- "^-A [^ ]+ .*-j $c( |\$)" | sed 's/^-A /-D /' | while read -r rule; do
        eval "\"\$cmd\" -w -t \"\$table\" $rule" 2>/dev/null
      done
      "$cmd" -w -t "$table" -F "$c" 2>/dev/null
    done
    for c in $chains; do
      if [ -f "$before" ] && grep -q "^:$c " "$before"; then continue; fi
      "$cmd" -w -t "$table" -X "$c" 2>/dev/null
    done
  done
done

if [ -f "$dir/sysctl.saved" ]; then
  say "restoring sysctls"
  while IFS='=' read -r k v; do
    [ -n "$k" ] && sysctl -qw "$k=$v" 2>/dev/null
  done < "$dir/sysctl.saved"
fi

if [ $keep_logs = 1 ]; then
  find "$dir" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf --one-file-system {} +
else
  rm -rf --one-file-system "$dir"
fi
say "stopped"
