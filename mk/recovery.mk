# Recovery figures: gold restart after a node kill, handover migration time.
.PHONY: bench-recovery

bench-recovery: control-plane ## gold recovery after 100 node kills and handover migration time: recovery kills=... gold_p99_ms=... handover_p99_ms=...
	AUTOMANAGER_K8S_BIN="$$(tools/control-plane/build.sh)" cargo bench -p automanager-e2e --bench recovery
