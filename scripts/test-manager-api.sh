#!/usr/bin/env bash
# `make test-manager-api`: runs the published API's proofs and prints one summary line:
#   manager-api rpcs_used=…/13 ext_rpcs=…/8 descriptor_diffs=… js_client=… js_server=…
#               foreign_jobs_touched=… resnapshot_10k_s=… spurious_actions=…
# The package-backed tests run with CI=true, so a missing npm package fails them rather than
# skipping them: every "pass" below is a run, not a skip.
set -euo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
run() {
  if ! "$@" >>"$log" 2>&1; then
    cat "$log" >&2
    echo "test-manager-api: failed: $*" >&2
    exit 1
  fi
}
# Our protos against the package's own tables (a diff fails the test) and its classes.
run env CI=true cargo test -q -p manager-proto --test published_api
descriptor_diffs=0
# The package's grpc-js client drives manager-sim's published service.
run env CI=true cargo test -q -p manager-sim --test published_api
js_client=pass
# A Manager built from the package's service definition, driven by our client.
run env CI=true cargo test -q -p manager-client --test published_scripted_manager
js_server=pass
# The operator over the published API against the manager-sim binary.
e2e=$(cargo test -q -p automanager-e2e --test published_api -- --nocapture 2>>"$log" | grep '^manager-api-e2e ' || true)
if [ -z "$e2e" ]; then
  cat "$log" >&2
  echo "test-manager-api: the end-to-end test printed no figures" >&2
  exit 1
fi
# The operator over the published API with our extension: which of its 8 RPCs it called (each
# test prints the names its sim served; the union is counted).
# (-q prints a test's progress dot on the line a parallel test's figures may follow.)
ext=$(cargo test -q -p automanager-e2e --test published_extension -- --nocapture 2>>"$log" | grep -o 'manager-api-ext-e2e used=[A-Za-z,]*' || true)
if [ -z "$ext" ]; then
  cat "$log" >&2
  echo "test-manager-api: the extension's end-to-end tests printed no figures" >&2
  exit 1
fi
ext_rpcs=$(sed -n 's/^manager-api-ext-e2e used=//p' <<<"$ext" | tr ',' '\n' | sed '/^$/d' | sort -u | wc -l | tr -d ' ')
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $2"; }
# A forced reconnect at 10k jobs / 2k nodes (the published client's bench).
bench=$(cargo bench -q -p manager-client --bench published_mirror 2>>"$log" | grep '^published-mirror ' || true)
if [ -z "$bench" ]; then
  cat "$log" >&2
  echo "test-manager-api: the reconnect bench printed no figures" >&2
  exit 1
fi
echo "manager-api rpcs_used=$(field rpcs_used "$e2e") ext_rpcs=$ext_rpcs/8 descriptor_diffs=$descriptor_diffs js_client=$js_client js_server=$js_server foreign_jobs_touched=$(field foreign_jobs_touched "$e2e") resnapshot_10k_s=$(field resnapshot_10k_s "$bench") spurious_actions=$(field spurious_actions "$e2e")"
