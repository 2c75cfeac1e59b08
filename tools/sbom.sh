#!/usr/bin/env bash
# `make sbom`: the image's SBOMs, CycloneDX 1.5 JSON generated from Cargo.lock by cargo-cyclonedx
# (installed from crates.io at the version below into ~/.cache/automanager/tools/, unless
# `cargo cyclonedx` already works, as in the Dockerfile's build stage): one document per
# binary the image holds, listing every crate compiled into it for x86_64-unknown-linux-gnu with
# its version and package URL.
#
# Usage: tools/sbom.sh OUTDIR     # writes OUTDIR/automanager-operator.cdx.json, OUTDIR/manager-sim.cdx.json
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
out=${1:?usage: tools/sbom.sh OUTDIR}
version=0.5.9
cache=${AUTOMANAGER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/automanager}
say() { echo "[sbom] $*" >&2; }

if cargo cyclonedx --version >/dev/null 2>&1; then
  tool=(cargo cyclonedx)
else
  root=$cache/tools/cargo-cyclonedx-$version
  if [ ! -x "$root/bin/cargo-cyclonedx" ]; then
    say "installing cargo-cyclonedx $version from crates.io into $root (once)"
    # A target directory of its own, removed afterwards: the tool is all that is kept.
    tmp=$(mktemp -d)
    CARGO_TARGET_DIR=$tmp cargo install --locked --quiet --version "$version" --root "$root" cargo-cyclonedx >&2
    rm -rf "$tmp"
  fi
  tool=("$root/bin/cargo-cyclonedx" cyclonedx)
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
# cargo-cyclonedx writes one document beside the Cargo.toml of every workspace member; the two
# the image needs are moved out and the others removed, also on failure.
name=automanager-sbom-tmp
cleanup() { find "$repo/crates" "$repo/tests" -maxdepth 2 -name "$name.json" -delete 2>/dev/null || true; }
trap cleanup EXIT
cleanup
(cd "$repo" && "${tool[@]}" --manifest-path Cargo.toml --format json --spec-version 1.5 --all \
  --no-build-deps --target x86_64-unknown-linux-gnu --override-filename "$name" -q) >&2
for crate in operator:automanager-operator manager-sim:manager-sim; do
  dir=${crate%%:*} bin=${crate#*:}
  mv "$repo/crates/$dir/$name.json" "$out/$bin.cdx.json"
  say "$out/$bin.cdx.json"
done
