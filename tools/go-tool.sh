#!/usr/bin/env bash
# Builds one Go tool of tools/<name> (a module of its own, pinned by its go.mod/go.sum) into a
# cache outside the checkout, keyed by a hash of the module's files, and prints the binary's path.
# A warm cache is reused as-is; a change to go.mod, go.sum, a source file or this script rebuilds.
#
# Usage: tools/go-tool.sh NAME      # helm | oci-image | kstatus | argo-health
#
# What each tool builds is tools/<name>/tool.env: PKG (the main package), VERSION_LDFLAGS
# (optional -X flags). Progress goes to stderr; stdout is only the path.
set -euo pipefail
name=${1:?usage: tools/go-tool.sh NAME}
tools=$(cd "$(dirname "$0")" && pwd)
here=$tools/$name
[ -f "$here/tool.env" ] || { echo "tools/go-tool.sh: no tool named $name (tools/$name/tool.env)" >&2; exit 2; }
PKG='' VERSION_LDFLAGS=''
# shellcheck disable=SC1091
. "$here/tool.env"
cache=${AUTOMANAGER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/automanager}
key=$(cd "$here" && find . -type f \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' -o -name tool.env \) \
  | LC_ALL=C sort | xargs cat "$tools/go-tool.sh" | sha256sum | cut -c1-16)
bin=$cache/tools/$name-$key/$name
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
say() { echo "[$name] $*" >&2; }
say "building $PKG into $(dirname "$bin") (cold: see docs/install.md for the measured times)"
start=$(date +%s)
cd "$here"
export GOFLAGS=-mod=readonly CGO_ENABLED=0
say "downloading modules"
go mod download >&2
mkdir -p "$(dirname "$bin")"
tmp=$(mktemp "$bin.XXXXXX")
trap 'rm -f "$tmp"' EXIT
say "go build ($(( $(date +%s) - start ))s elapsed)"
go build -trimpath -ldflags "-s -w $VERSION_LDFLAGS" -o "$tmp" "$PKG" >&2
mv "$tmp" "$bin"
# Older builds of this tool are dead weight once a new one exists.
find "$cache/tools" -mindepth 1 -maxdepth 1 -type d -name "$name-*" ! -name "$name-$key" -exec rm -rf {} + 2>/dev/null || true
say "done in $(( $(date +%s) - start ))s"
echo "$bin"
