#!/usr/bin/env bash
# Builds everything one local Kubernetes node runs, from the Go modules pinned in this
# directory (one module per upstream project, each with its own go.mod/go.sum) and from C
# source, into a cache outside the checkout keyed by a hash of those files and this script:
#
#   kubelet kube-proxy kube-scheduler kube-controller-manager   k8s.io/kubernetes v1.35.4 (k8s/)
#   containerd containerd-shim-runc-v2 ctr                      containerd v2.4.2 (containerd/)
#   runc                                                        runc v1.5.3, cgo, static-pie, with
#                                                               seccomp (libseccomp.a, Debian's
#                                                               libseccomp-dev) (runc/)
#   cni/{bridge,host-local,loopback,portmap}                    CNI plugins v1.10.0 (cni/)
#   crane                                                       go-containerregistry v0.22.1
#                                                               (tools/registry): the OCI registry
#                                                               (`crane registry serve`) and pushes
#   pause                                                       tools/pause/pause.c, gcc -static
#   coredns                                                     CoreDNS v1.15.0 with the plugins a
#                                                               cluster DNS needs (coredns/)
#   forward hello                                               tools/node/cmd: the apiserver
#                                                               forwarder and the smoke workload
#
# Every build step writes to a temporary name and renames, so an interrupted build resumes
# where it stopped. A warm cache prints its path at once. Builds run one after another (the
# machine has 2 cores; the Go compiler already uses both).
#
# Usage: tools/node/build.sh        # prints the bin directory on stdout, progress on stderr
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tools=$(dirname "$here")
release=v1.35.4
cache=${AUTOMANAGER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/automanager}
key=$(cd "$tools" && find node registry pause -type f \
  \( -name 'go.mod' -o -name 'go.sum' -o -name '*.go' -o -name '*.c' -o -name build.sh \) \
  ! -path '*/testdata/*' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)
bin=$cache/node-$key/bin
stamp=$bin/.complete

if [ -f "$stamp" ]; then
  echo "$bin"
  exit 0
fi

say() { echo "[node] $*" >&2; }
start=$(date +%s)
elapsed() { echo "$(( $(date +%s) - start ))s"; }
mkdir -p "$bin/cni"
say "building the node's binaries into $bin"
say "a cold build takes ~15 minutes on 2 cores (see docs/node.md); later runs are instant"

# runc links libseccomp statically; Debian's libseccomp-dev has libseccomp.a.
libseccomp_a=$(gcc -print-file-name=libseccomp.a)
if [ "$libseccomp_a" = libseccomp.a ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing libseccomp-dev (runc's seccomp support links libseccomp.a)"
    apt-get install -y -qq libseccomp-dev >&2 || { apt-get update -qq >&2 && apt-get install -y -qq libseccomp-dev >&2; }
  else
    say "libseccomp.a is missing: install libseccomp-dev (runc needs it for seccomp profiles)"
    exit 1
  fi
fi

export GOFLAGS=-mod=readonly
# go_build DIR OUT PKG [go build flags...]: one binary, written atomically.
go_build() {
  local dir=$1 out=$2 pkg=$3
  shift 3
  if [ -x "$out" ]; then
    return
  fi
  say "go build $pkg ($(elapsed) elapsed)"
  local tmp
  tmp=$(mktemp "$out.XXXXXX")
  (cd "$dir" && go build -trimpath -o "$tmp" "$@" "$pkg") >&2 || { rm -f "$tmp"; return 1; }
  mv "$tmp" "$out"
}

for d in "$here"/k8s "$here"/containerd "$here"/runc "$here"/cni "$here"/coredns "$tools"/registry; do
  say "go mod download in ${d#"$tools"/}"
  (cd "$d" && go mod download) >&2
done

# --- Kubernetes: the same release and version stamps as tools/control-plane/build.sh.
k8s_ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $p.gitVersion=$release -X $p.gitMajor=1 -X $p.gitMinor=35"
  k8s_ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
for c in kubelet kube-proxy kube-scheduler kube-controller-manager; do
  CGO_ENABLED=0 go_build "$here/k8s" "$bin/$c" "k8s.io/kubernetes/cmd/$c" -ldflags "$k8s_ldflags"
done

# --- containerd: as its Makefile's STATIC=1 build (pure Go; btrfs needs cgo, so it is left out).
ctrd=github.com/containerd/containerd/v2
ctrd_ldflags="-s -w -X $ctrd/version.Version=v2.4.2 -X $ctrd/version.Package=$ctrd"
CGO_ENABLED=0 go_build "$here/containerd" "$bin/containerd" "$ctrd/cmd/containerd" \
  -tags "urfave_cli_no_docs osusergo netgo static_build" -ldflags "$ctrd_ldflags"
CGO_ENABLED=0 go_build "$here/containerd" "$bin/containerd-shim-runc-v2" "$ctrd/cmd/containerd-shim-runc-v2" \
  -tags "urfave_cli_no_docs osusergo netgo static_build no_grpc" -ldflags "$ctrd_ldflags"
CGO_ENABLED=0 go_build "$here/containerd" "$bin/ctr" "$ctrd/cmd/ctr" \
  -tags "urfave_cli_no_docs osusergo netgo static_build" -ldflags "$ctrd_ldflags"

# --- runc: as its Makefile's `static` target, with tags seccomp (libseccomp.a linked in) and
# without libpathrs (a Rust library; runc falls back to its Go path-resolution code).
CGO_ENABLED=1 go_build "$here/runc" "$bin/runc" github.com/opencontainers/runc \
  -buildmode=pie -tags "seccomp urfave_cli_no_docs netgo osusergo" \
  -ldflags "-s -w -X main.gitCommit=v1.5.3 -linkmode external -extldflags -static-pie"

# --- CNI plugins.
for p in ipam/host-local main/bridge main/loopback meta/portmap; do
  CGO_ENABLED=0 go_build "$here/cni" "$bin/cni/${p#*/}" "github.com/containernetworking/plugins/plugins/$p" \
    -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=v1.10.0"
done

# --- CoreDNS, for the cluster DNS Service (tools/node/dns.sh runs it as a Pod).
CGO_ENABLED=0 go_build "$here/coredns" "$bin/coredns" . -ldflags "-s -w"

# --- crane (registry + pushes), the forwarder and the smoke workload.
CGO_ENABLED=0 go_build "$tools/registry" "$bin/crane" github.com/google/go-containerregistry/cmd/crane \
  -ldflags "-s -w"
CGO_ENABLED=0 go_build "$here/cmd" "$bin/forward" ./forward -ldflags "-s -w"
CGO_ENABLED=0 go_build "$here/cmd" "$bin/hello" ./hello -ldflags "-s -w"

# --- pause, static C.
if [ ! -x "$bin/pause" ]; then
  say "gcc -static pause.c"
  tmp=$(mktemp "$bin/pause.XXXXXX")
  gcc -Os -static -Wall -Wextra -Werror -o "$tmp" "$tools/pause/pause.c" && strip "$tmp" && mv "$tmp" "$bin/pause"
fi

for f in runc pause hello coredns; do
  if ! file -b "$bin/$f" | grep -q 'static'; then
    say "$f is not statically linked: $(file -b "$bin/$f")"
    exit 1
  fi
done
touch "$stamp"
# Older builds are dead weight once a new one is complete.
find "$cache" -mindepth 1 -maxdepth 1 -type d -name 'node-*' ! -name "node-$key" -exec rm -rf {} + 2>/dev/null || true
say "done in $(elapsed)"
echo "$bin"
