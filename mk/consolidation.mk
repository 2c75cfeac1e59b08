# Consolidation of a fragmented elastic binpack pool.
.PHONY: bench-consolidation

bench-consolidation: control-plane ## a wave, random deletes, then consolidation: consolidation nodes_before=... nodes_after=... lower_bound=... dropped=...
	@# Its reader of Manager is a client of our first API.
	AUTOMANAGER_E2E_MANAGER_API=v1 AUTOMANAGER_K8S_BIN="$$(tools/control-plane/build.sh)" cargo bench -p automanager-e2e --bench consolidation
