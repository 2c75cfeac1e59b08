#!/usr/bin/env bash
# Packs static binaries (or any files) into a one-layer OCI image and pushes it to the node's
# registry with crane, no container engine:
#
#   crane append --oci-empty-base -f layer.tar -t REF      one layer on an empty OCI base
#   crane mutate --entrypoint ... --set-platform linux/amd64 REF
#
# (containerd matches an image's platform against the node's, so the config must name one.)
#
# Usage: tools/node/push-image.sh REF --entrypoint PATH[,ARG...] [--user UID[:GID]] SRC=/DEST...
#   REF   e.g. 127.0.0.1:5000/hello:1 (default registry: the running node's, see NODE_DIR)
# Prints the pushed reference with its digest (REF@sha256:...) on stdout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage() { echo "usage: $0 REF --entrypoint PATH[,ARG...] [--user UID[:GID]] SRC=/DEST..." >&2; exit 2; }
[ $# -ge 3 ] || usage
ref=$1
shift
entrypoint='' user='' files=()
while [ $# -gt 0 ]; do
  case $1 in
    --entrypoint) entrypoint=$2; shift 2 ;;
    --entrypoint=*) entrypoint=${1#*=}; shift ;;
    --user) user=$2; shift 2 ;;
    --user=*) user=${1#*=}; shift ;;
    *=/*) files+=("$1"); shift ;;
    *) usage ;;
  esac
done
[ -n "$entrypoint" ] && [ ${#files[@]} -gt 0 ] || usage
crane=${CRANE:-$("$here/build.sh")/crane}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/root"
for f in "${files[@]}"; do
  src=${f%%=*} dest=${f#*=}
  [ -f "$src" ] || { echo "$0: $src is not a file" >&2; exit 1; }
  mkdir -p "$work/root$(dirname "$dest")"
  cp "$src" "$work/root$dest"
done
# Fixed owner and times: the same files give the same layer digest.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/root" -cf "$work/layer.tar" .
"$crane" append --insecure --oci-empty-base -f "$work/layer.tar" -t "$ref" >/dev/null
mutate=(--entrypoint "$entrypoint" --set-platform linux/amd64 -t "$ref")
[ -z "$user" ] || mutate+=(--user "$user")
pushed=$("$crane" mutate --insecure "${mutate[@]}" "$ref")
echo "$pushed"
