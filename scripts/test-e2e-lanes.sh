#!/usr/bin/env bash
# Runs the end-to-end suites `make test` runs (every test target of tests/e2e that needs no
# feature) in E2E_LANES parallel lanes, largest suite first, and then prints each suite's output
# in name order and one summary line. Exits non-zero when any suite fails.
#
# Why lanes: each suite starts its own control plane, simulator and operator and mostly waits on
# timers and processes, so one after another leaves the CPUs idle; side by side they finish in a
# fraction of the time. Each suite still runs its own tests as cargo does (libtest's threads).
#
# E2E_SUITES (space-separated suite names) runs those instead of every suite; the suites read
# AUTOMANAGER_E2E_MANAGER_API (tests/e2e/src/stack.rs) from the environment, which this passes on.
set -euo pipefail
cd "$(dirname "$0")/.."
lanes=${E2E_LANES:-2}
cargo=${CARGO:-cargo}
out=${E2E_LANES_DIR:-.tmp/e2e-lanes}
rm -rf "$out"
mkdir -p "$out"

# The suites: test targets of automanager-e2e without required features, largest source first
# (a longer suite starts earlier, so the lanes end close together).
suites=$("$cargo" metadata --no-deps --format-version 1 | python3 -c '
import json, os, sys
meta = json.load(sys.stdin)
pkg = next(p for p in meta["packages"] if p["name"] == "automanager-e2e")
tests = [t for t in pkg["targets"] if "test" in t["kind"] and not t.get("required-features")]
tests.sort(key=lambda t: (-os.path.getsize(t["src_path"]), t["name"]))
print("\n".join(t["name"] for t in tests))
')
if [ -n "${E2E_SUITES:-}" ]; then
  # Keep the size order, and refuse a name that is not a suite rather than skip it.
  for want in $E2E_SUITES; do
    if ! grep -qx "$want" <<<"$suites"; then
      echo "e2e-lanes: E2E_SUITES names $want, which is not a suite without features" >&2
      exit 1
    fi
  done
  suites=$(grep -xF -f <(tr ' ' '\n' <<<"$E2E_SUITES" | grep .) <<<"$suites")
fi
if [ -z "$suites" ]; then
  echo "e2e-lanes: no suites found" >&2
  exit 1
fi

run_suite() {
  local suite=$1 start rc
  start=$(date +%s)
  rc=0
  "$cargo" test -q -p automanager-e2e --test "$suite" -- --color never >"$out/$suite.log" 2>&1 || rc=$?
  echo "$suite $rc $(( $(date +%s) - start ))" >"$out/$suite.result"
  # A line as each suite ends, so a long run shows progress; the outputs follow at the end.
  echo "--- e2e suite $suite ended: exit $rc in $(( $(date +%s) - start ))s"
}
export -f run_suite
export cargo out

echo "==> e2e suites in $lanes lanes (manager API: ${AUTOMANAGER_E2E_MANAGER_API:-default}): $(echo "$suites" | tr '\n' ' ')"
started=$(date +%s)
echo "$suites" | xargs -P "$lanes" -I{} bash -c 'run_suite "$@"' _ {} || true

failed=()
for suite in $(echo "$suites" | sort); do
  echo "==> e2e suite $suite"
  cat "$out/$suite.log"
  if [ ! -f "$out/$suite.result" ]; then
    failed+=("$suite(did not finish)")
    continue
  fi
  read -r _ rc secs <"$out/$suite.result"
  echo "==> e2e suite $suite: exit $rc in ${secs}s"
  [ "$rc" = 0 ] || failed+=("$suite")
done
total=$(echo "$suites" | wc -l)
echo "e2e suites=$total lanes=$lanes api=${AUTOMANAGER_E2E_MANAGER_API:-default} failed=${#failed[@]} took_s=$(( $(date +%s) - started ))${failed:+ failed_suites=$(IFS=,; echo "${failed[*]}")}"
[ "${#failed[@]}" = 0 ]
