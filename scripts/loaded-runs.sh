#!/usr/bin/env bash
# Runs the whole suite RUNS times (default 5), each beside a CPU hog of one busy process per
# core, and records each run's verdict and failed tests in LOADED_DIR (default .tmp/loaded):
#   run-<stamp>-<i>.log   the run's output
#   runs.log              one line per run: `loaded run stamp=… i=… ok=… exit=… took_s=… failed_tests=…`
#   summaries.log         one line per invocation (the last one is what reliability4 reads):
#                         `loaded runs=N failed_runs=K failed_tests=a,b|none stamp=…`
# LOADED_CMD replaces `make test` (a quicker suite, or a dry run of this script).
set -uo pipefail
runs=${RUNS:-5}
dir=${LOADED_DIR:-.tmp/loaded}
cmd=${LOADED_CMD:-make test}
cores=$(nproc)
stamp=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$dir"

hogs=()
stop_hogs() {
  # Only the hog processes this script started, by their ids.
  for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${hogs[@]}"; do wait "$pid" 2>/dev/null; done
  hogs=()
}
trap stop_hogs EXIT
trap 'stop_hogs; exit 130' INT TERM

failed_runs=0
all_failed=()
for i in $(seq 1 "$runs"); do
  log="$dir/run-$stamp-$i.log"
  for _ in $(seq 1 "$cores"); do
    (while :; do :; done) &
    hogs+=("$!")
  done
  echo "==> loaded run $i/$runs: $cmd beside $cores busy processes (log: $log)"
  started=$(date +%s)
  bash -c "$cmd" >"$log" 2>&1
  status=$?
  took=$(( $(date +%s) - started ))
  stop_hogs
  # libtest's verdict lines: `test path::name ... FAILED`.
  failed=$(grep -oE '^test [^ ]+ \.\.\. FAILED' "$log" | awk '{print $2}' | sort -u | paste -sd, -)
  if [ "$status" -ne 0 ]; then
    failed_runs=$((failed_runs + 1))
    # A run that failed with no failed test named (a build error, a crash) still names a cause.
    [ -n "$failed" ] || failed="exit-$status"
  fi
  [ -n "$failed" ] && all_failed+=("$failed")
  echo "loaded run stamp=$stamp i=$i ok=$([ "$status" -eq 0 ] && echo true || echo false) exit=$status took_s=$took failed_tests=${failed:-none}" | tee -a "$dir/runs.log"
done
names=$(printf '%s\n' "${all_failed[@]}" | tr ',' '\n' | grep -v '^$' | sort -u | paste -sd, -)
line="loaded runs=$runs failed_runs=$failed_runs failed_tests=${names:-none} stamp=$stamp"
echo "$line" | tee -a "$dir/summaries.log"
[ "$failed_runs" -eq 0 ]
