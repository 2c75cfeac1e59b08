#!/usr/bin/env bash
# `make test-fidelity`: runs the proofs that the operator keeps the TypeScript library's promises
# on the real stack, collects the `fidelity-figure key=value` lines they print once their
# assertions passed, and prints one summary line:
#   fidelity split_placed=… drain_gaps_overlap_handover=… trace_after_failover=…
#            notice_moved_before_deadline=…% notice_gaps=… flap_holdout_tested=… schedule_ahead_tested=…
# A figure no test printed (its test failed, or does not exist) reads `missing`, and the script
# then fails: every figure is a run.
# Every test's output, with the figures behind the summary (gaps, hold-outs, times), is kept in
# .tmp/test-fidelity.log.
set -euo pipefail
mkdir -p .tmp
log=.tmp/test-fidelity.log
: >"$log"
figures=$(mktemp)
trap 'rm -f "$figures"' EXIT
failed=()
# Each test alone, its output uncaptured, so its figure line reaches the log whole.
run() {
  local what=$1
  shift
  echo "==> $what" >&2
  if "$@" -- --exact --nocapture >>"$log" 2>&1; then
    :
  else
    failed+=("$what")
  fi
}
run "split across pools (placement)" cargo test -q -p automanager-placement --lib \
  tests::props::replicas_placed_only_by_a_split_in_a_fixed_generated_set
for t in a_migrate_drain_leaves_overlap_and_handover_jobs_never_uncovered \
  a_flapping_node_is_held_out_one_two_and_four_times_the_base \
  a_scheduled_spare_tier_is_up_when_its_window_opens \
  a_reclaim_notice_run_to_its_deadline_moves_every_job_before_the_node_goes; do
  run "fidelity::$t" cargo test -q -p automanager-e2e --test fidelity "$t"
done
run "placement_history::trace_survives_leader_failover" \
  cargo test -q -p automanager-e2e --test placement_history trace_survives_leader_failover
grep -o 'fidelity-figure .*' "$log" | cut -d' ' -f2- | tr ' ' '\n' >"$figures" || true
last() { grep "^$1=" "$figures" | tail -n 1 | cut -d= -f2- || true; }
or_missing() { if [ -n "$1" ]; then echo "$1"; else echo missing; fi; }
line="fidelity"
for key in split_placed drain_gaps_overlap_handover trace_after_failover \
  notice_moved_before_deadline notice_gaps flap_holdout_tested schedule_ahead_tested; do
  line+=" $key=$(or_missing "$(last "$key")")"
done
echo "$line"
if [ "${#failed[@]}" -gt 0 ] || grep -q '=missing' <<<"$line"; then
  cat "$log" >&2
  for f in "${failed[@]}"; do echo "test-fidelity: failed: $f" >&2; done
  echo "test-fidelity: a figure was not printed by its test (log above)" >&2
  exit 1
fi
