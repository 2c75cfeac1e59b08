# Recovery figures: gold restart after a node kill, handover migration time.
.PHONY: bench-recovery

bench-recovery: control-plane ## gold recovery after 100 node kills and handover migration time: recovery kills=... gold_p99_ms=... handover_p99_ms=...
	@# BENCHMARKS.md's figures are over our first API; AUTOMANAGER_E2E_MANAGER_API=published measures over the published one.
	AUTOMANAGER_E2E_MANAGER_API=$${AUTOMANAGER_E2E_MANAGER_API:-v1} AUTOMANAGER_K8S_BIN="$$(tools/control-plane/build.sh)" cargo bench -p automanager-e2e --bench recovery
