#!/usr/bin/env bash
# Packages kubectl-automanager for kubectl users: a tarball with the plugin (statically linked,
# release build), its kubectl completion helper and the licence, and a krew manifest that names
# the tarball's sha256. The tarball is reproducible (sorted, fixed mtime and owner, gzip -n), so
# the same commit gives the same sha256.
#
# Usage: scripts/dist-plugin.sh [OUT_DIR]   (default: dist). PLUGIN_PROFILE=debug packages a
# debug build instead (for a quick check of the packaging; never for release).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/dist}
profile=${PLUGIN_PROFILE:-release}
target=x86_64-unknown-linux-gnu
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)
repo=https://github.com/norskvideo/automanager
target_dir=${CARGO_TARGET_DIR:-$root/target}

cd "$root"
flags=(--locked --target "$target" -p automanager-cli --bin kubectl-automanager)
if [ "$profile" = release ]; then flags+=(--release); fi
echo "[dist-plugin] cargo build ${flags[*]} (static: +crt-static)" >&2
RUSTFLAGS='-C target-feature=+crt-static' cargo build "${flags[@]}" >&2
bin=$target_dir/$target/$([ "$profile" = release ] && echo release || echo debug)/kubectl-automanager

name=kubectl-automanager-v$version-linux-amd64
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$name" "$out"
strip --strip-debug -o "$stage/$name/kubectl-automanager" "$bin"
install -m 0755 deploy/plugin/kubectl_complete-automanager "$stage/$name/"
install -m 0644 LICENSE "$stage/$name/"
tarball=$out/$name.tar.gz
tar -C "$stage" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - "$name" | gzip -9n > "$tarball"
sha=$(sha256sum "$tarball" | cut -d' ' -f1)
echo "$sha  $name.tar.gz" > "$tarball.sha256"

manifest=$out/automanager.yaml
cat > "$manifest" <<YAML
# The krew manifest of kubectl-automanager $version, written by scripts/dist-plugin.sh.
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: automanager
spec:
  version: v$version
  homepage: $repo
  shortDescription: Run and debug AutoManager, Norsk's placement operator
  description: |
    Validate Bundles offline as strictly as the apiserver, ask the running operator what-if,
    read placement traces, see the fleet as a map and capacity with top, and cordon, drain,
    migrate and retry with the objects a person would write. It finds the operator's leader Pod
    itself and port-forwards to it through the apiserver. For completion of
    \`kubectl automanager <TAB>\`, put kubectl_complete-automanager (in the archive) on PATH.
  caveats: |
    The operator's debugging API must be on in its Helm release (debug.enabled) for trace and
    what-if; the plugin needs RBAC to list pods, get leases and create pods/portforward in the
    operator's namespace for those two commands.
  platforms:
    - selector:
        matchLabels:
          os: linux
          arch: amd64
      uri: $repo/releases/download/v$version/$name.tar.gz
      sha256: $sha
      bin: kubectl-automanager
      files:
        - from: $name/kubectl-automanager
          to: .
        - from: $name/kubectl_complete-automanager
          to: .
        - from: $name/LICENSE
          to: .
YAML
echo "[dist-plugin] $tarball (sha256 $sha)" >&2
echo "[dist-plugin] $manifest" >&2
echo "$tarball"
echo "$manifest"
