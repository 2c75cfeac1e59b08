# The zone brake at fleet size: one zone of three lost at once.
.PHONY: bench-zone-outage

bench-zone-outage: control-plane ## one zone of three (a third of 1,000 nodes) killed at once: zone-outage gold_jobs=... gold_p99_ms=... provisioned_in_dead_zone=...
	@# BENCHMARKS.md's figures are over our first API; AUTOMANAGER_E2E_MANAGER_API=published measures over the published one.
	AUTOMANAGER_E2E_MANAGER_API=$${AUTOMANAGER_E2E_MANAGER_API:-v1} AUTOMANAGER_K8S_BIN="$$(tools/control-plane/build.sh)" cargo bench -p automanager-e2e --bench zone_outage
