#!/usr/bin/env bash
# The state-ownership figures of the operator crate, counted from its source, on one line:
#   state lock_sites_outside_state=… controllers_given_context=… migration_builders=…
#         operator_cpu_ratio=… scale40k_ready_s=… scale40k_rss_mib=…
# The last three come from benches this script does not run; until a run feeds them in
# (OPERATOR_CPU_RATIO, SCALE40K_READY_S, SCALE40K_RSS_MIB) they read `not-measured`.
#
# What is counted (whitespace, line breaks included, is collapsed first, so a call split over
# lines counts once):
# - lock_sites_outside_state: in crates/operator/src outside state/, every call that takes the
#   state's lock or reaches a book for writing from outside: `ctx.state()`, `self.0.state()`,
#   `self.state()` in context.rs (the Context's own guard), `.with_mirror(`, and the books'
#   `_mut()` accessors (`model_mut`, `bundles_mut`, `nodes_mut`, `provisioning_mut`,
#   `disruptions_mut`, `wake_mut`, `retries_mut`). Tests inside those files count too: a guard
#   they can take is a guard that leaves.
# - controllers_given_context: files under controllers/ (not context.rs itself) that name the
#   whole `Context` or use a `ctx` binding.
# - migration_builders: places outside tests that build a Migration object (`Migration::new(`,
#   `MigrationSpec {`).
# Set STATE_DETAIL=1 to also print the lock sites per file.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src="$root/crates/operator/src"

# One file's text with runs of whitespace collapsed and spaces around `.` removed.
flat() { perl -0777 -pe 's/\s+/ /g; s/ ?\. ?/./g' "$1"; }
# The same, without the trailing `#[cfg(test)] mod tests` block.
flat_no_tests() { perl -0777 -pe 's/#\[cfg\(test\)\]\s*mod tests\b.*//s; s/\s+/ /g; s/ ?\. ?/./g' "$1"; }

lock_re='\b(ctx|self\.0)\.state\(\)|\.with_mirror\(|\b(model|bundles|nodes|provisioning|disruptions|wake|retries)_mut\(\)'
count() { { grep -oE "$1" || true; } | wc -l | tr -d ' '; }

locks=0
detail=""
while IFS= read -r f; do
  rel=${f#"$src"/}
  n=$(flat "$f" | count "$lock_re")
  if [ "$rel" = controllers/context.rs ]; then
    n=$((n + $(flat "$f" | count '\bself\.state\(\)')))
  fi
  if [ "$n" -gt 0 ]; then
    locks=$((locks + n))
    detail+="  $n $rel"$'\n'
  fi
done < <(find "$src" -name '*.rs' -not -path "$src/state/*" | sort)

given=0
while IFS= read -r f; do
  [ "$f" = "$src/controllers/context.rs" ] && continue
  if flat "$f" | grep -qE '\bContext\b|\bctx\b'; then
    given=$((given + 1))
  fi
done < <(find "$src/controllers" -name '*.rs' | sort)

builders=0
while IFS= read -r f; do
  builders=$((builders + $(flat_no_tests "$f" | count 'Migration::new\(|MigrationSpec \{')))
done < <(find "$src" -name '*.rs' | sort)

line="state lock_sites_outside_state=$locks controllers_given_context=$given migration_builders=$builders"
line+=" operator_cpu_ratio=${OPERATOR_CPU_RATIO:-not-measured}"
line+=" scale40k_ready_s=${SCALE40K_READY_S:-not-measured}"
line+=" scale40k_rss_mib=${SCALE40K_RSS_MIB:-not-measured}"
echo "$line"
if [ -n "${STATE_DETAIL:-}" ]; then
  printf '%s' "$detail" | sort -rn
fi
