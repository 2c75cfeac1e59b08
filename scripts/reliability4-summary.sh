#!/usr/bin/env bash
# Runs the tests behind round four's figures, then prints one line:
#   reliability4 notice_vs_held_gaps=… terminating_pool_healed=… never_open_window=…
#                degraded_zone_recoveries=… flaky_runs=K/N
# Each test prints its `reliability4-figure key=value` line only once its assertions pass;
# flaky_runs is the latest `make test-loaded` summary (LOADED_DIR, default .tmp/loaded). A figure
# no test printed, or no loaded summary, reads `missing`, and the script then fails: every figure
# is a run. REL4_LOG (default .tmp/reliability4.log) keeps the tests' output.
set -uo pipefail
log=${REL4_LOG:-.tmp/reliability4.log}
loaded=${LOADED_DIR:-.tmp/loaded}
cargo=${CARGO:-cargo}
mkdir -p "$(dirname "$log")"
: >"$log"
status=0
run() {
  echo "==> $cargo test $* -- --nocapture" | tee -a "$log"
  "$cargo" test "$@" -- --nocapture >>"$log" 2>&1 || status=1
}
# Every notice-during-a-held-move test of the disruption suite.
run -p automanager-e2e --test disruption reclaim_notice
run -p automanager-operator --test controller_tier a_pool_being_deleted_heals_its_users
run -p automanager-e2e --test crds_and_examples windows_that_never_open_are_refused_at_admission
run -p automanager-e2e --test fleet_brakes a_zone_outage_pauses_provisioning_there_and_recovers_elsewhere

figures() { grep -o "reliability4-figure $1=[^ ]*" "$log" | cut -d= -f2- || true; }
or_missing() { if [ -n "$1" ]; then echo "$1"; else echo missing; fi; }
# Numbers add up over the tests that print them; words must agree (the last one is shown).
sum() { figures "$1" | awk '{ s += $1; n++ } END { if (n) print s }'; }
last() { figures "$1" | tail -n 1; }
flaky=""
if [ -f "$loaded/summaries.log" ]; then
  flaky=$(tail -n 1 "$loaded/summaries.log" | sed -nE 's/^loaded runs=([0-9]+) failed_runs=([0-9]+).*/\2\/\1/p')
fi
line="reliability4 notice_vs_held_gaps=$(or_missing "$(sum notice_vs_held_gaps)")"
line+=" terminating_pool_healed=$(or_missing "$(last terminating_pool_healed)")"
line+=" never_open_window=$(or_missing "$(last never_open_window)")"
line+=" degraded_zone_recoveries=$(or_missing "$(sum degraded_zone_recoveries)")"
line+=" flaky_runs=$(or_missing "$flaky")"
echo "$line"
if grep -q '=missing' <<<"$line"; then
  echo "reliability4-summary: a figure was not printed by its test, or no make test-loaded summary (see $log, $loaded)" >&2
  status=1
fi
exit $status
