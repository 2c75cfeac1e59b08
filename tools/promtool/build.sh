#!/usr/bin/env bash
# Builds promtool (Prometheus's own rule checker and rule unit tester) from the Go module
# github.com/prometheus/prometheus pinned in this directory's go.mod/go.sum, into a cache outside
# the checkout keyed by version. A warm cache is reused as-is (a stamp file records the go.sum it
# was built from).
#
# Usage: tools/promtool/build.sh        # prints the path of the promtool binary on stdout
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=v0.316.0
cache=${AUTOMANAGER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/automanager}
bin=$cache/promtool-$version/bin
stamp=$bin/.built-from
want=$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -d' ' -f1)

if [ -x "$bin/promtool" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "$bin/promtool"
  exit 0
fi

mkdir -p "$bin"
say() { echo "[promtool] $*" >&2; }
# One build at a time: `make test` starts one in the background and the alerts test asks
# again; the second waits for the first and finds the stamp.
exec 9>"$bin/.lock"
if ! flock -n 9; then
  say "another build of promtool is running; waiting for it"
  flock 9
fi
if [ -x "$bin/promtool" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "$bin/promtool"
  exit 0
fi
say "building promtool from github.com/prometheus/prometheus $version into $bin"
say "a cold build takes several minutes on 2 cores (see README: make test-alerts); later runs are instant"

v=github.com/prometheus/common/version
ldflags="-s -w -X $v.Version=${version#v} -X $v.Revision=go-module -X $v.Branch=$version"
ldflags+=" -X $v.BuildUser=automanager -X $v.BuildDate=19700101-00:00:00"

cd "$here"
export GOFLAGS=-mod=readonly
start=$(date +%s)
say "downloading modules"
go mod download >&2
tmp=$(mktemp -d "$bin/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
say "go build github.com/prometheus/prometheus/cmd/promtool ($(( $(date +%s) - start ))s elapsed)"
go build -trimpath -ldflags "$ldflags" -o "$tmp/promtool" github.com/prometheus/prometheus/cmd/promtool >&2
mv "$tmp/promtool" "$bin/promtool"
echo "$want" > "$stamp"
say "done in $(( $(date +%s) - start ))s"
echo "$bin/promtool"
