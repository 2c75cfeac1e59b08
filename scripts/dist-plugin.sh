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
# The manifest is deploy/plugin/automanager.krew.yaml (checked by crates/cli/tests/krew.rs)
# with the version and the tarball's sha256 filled in.
{
  echo "# The krew manifest of kubectl-automanager $version, written by scripts/dist-plugin.sh."
  grep -Ev '^[[:space:]]*#' deploy/plugin/automanager.krew.yaml \
    | sed -e "s/__VERSION__/$version/g" -e "s/__SHA256__/$sha/g"
} > "$manifest"
if grep -q '__[A-Z0-9]*__' "$manifest"; then
  echo "[dist-plugin] $manifest still has a placeholder" >&2
  exit 1
fi
echo "[dist-plugin] $tarball (sha256 $sha)" >&2
echo "[dist-plugin] $manifest" >&2
echo "$tarball"
echo "$manifest"
