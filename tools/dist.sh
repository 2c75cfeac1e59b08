#!/usr/bin/env bash
# `make dist`: pushes the operator's image (the OCI archive `make image` wrote) and the Helm chart,
# packaged, as an OCI artifact, to a registry, with no container engine:
#
#   crane push LAYOUT REGISTRY/automanager-operator:VERSION     the image, digest unchanged
#   helm package CHART; helm push CHART.tgz oci://REGISTRY/charts
#
# A registry on 127.0.0.1 or localhost is spoken to over plain HTTP; any other over HTTPS with
# the credentials of `crane auth login` / `docker login` (the image) and `helm registry login`
# (the chart).
#
# Usage: tools/dist.sh REGISTRY [--image ARCHIVE] [--chart DIR]
#   REGISTRY   host[:port][/path], e.g. 127.0.0.1:5000 or registry.example.com/team
#   --image    the OCI archive (default dist/automanager-operator-VERSION.oci.tar)
#   --chart    the chart directory (default deploy/helm/automanager)
# Environment: CRANE, HELM (the binaries; default: built from tools/registry and tools/helm).
# Prints, on stdout:
#   image=REGISTRY/automanager-operator@sha256:…
#   image_repository=REGISTRY/automanager-operator
#   image_digest=sha256:…
#   chart=oci://REGISTRY/charts/automanager
#   chart_version=VERSION
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
usage() { echo "usage: $0 REGISTRY [--image ARCHIVE] [--chart DIR]" >&2; exit 2; }
[ $# -ge 1 ] || usage
registry=${1%/}
shift
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -n1)
image_tar=$repo/dist/automanager-operator-$version.oci.tar
chart_dir=$repo/deploy/helm/automanager
while [ $# -gt 0 ]; do
  case $1 in
    --image) image_tar=$2; shift 2 ;;
    --chart) chart_dir=$2; shift 2 ;;
    *) usage ;;
  esac
done
say() { echo "[dist] $*" >&2; }
[ -f "$image_tar" ] || { say "no image archive at $image_tar: run \`make image\` first"; exit 1; }
crane=${CRANE:-$("$here/go-tool.sh" registry)}
helm=${HELM:-$("$here/go-tool.sh" helm)}

host=${registry%%/*}
crane_flags=() helm_flags=()
case ${host%:*} in
  127.0.0.1 | localhost | '[::1]')
    crane_flags=(--insecure)
    helm_flags=(--plain-http)
    ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# helm's own state stays out of the user's home unless they logged in there.
export HELM_CACHE_HOME=${HELM_CACHE_HOME:-$work/helm-cache}

# The image: the archive is an OCI image layout; crane pushes a layout directory as it is, so
# the digest in the registry is the one `make image` printed.
mkdir -p "$work/layout"
tar -xf "$image_tar" -C "$work/layout"
repository=$registry/automanager-operator
say "pushing $image_tar to $repository:$version"
"$crane" push "${crane_flags[@]}" "$work/layout" "$repository:$version" >&2
digest=$("$crane" digest "${crane_flags[@]}" "$repository:$version")
expected=$(cat "$image_tar.digest" 2>/dev/null || true)
if [ -n "$expected" ] && [ "$digest" != "$expected" ]; then
  say "the registry says $digest, make image printed $expected"
  exit 1
fi

# The chart.
say "packaging $chart_dir"
"$helm" package "$chart_dir" --destination "$work" >&2
chart_version=$(sed -n 's/^version: *//p' "$chart_dir/Chart.yaml" | head -n1 | tr -d '"')
say "pushing the chart to oci://$registry/charts"
"$helm" push "${helm_flags[@]}" "$work/automanager-$chart_version.tgz" "oci://$registry/charts" >&2

cat <<EOF
image=$repository@$digest
image_repository=$repository
image_digest=$digest
chart=oci://$registry/charts/automanager
chart_version=$chart_version
EOF
