# The operator at fleet size: 10,000 Bundles on 2,000 simulated nodes (tests/e2e/benches/scale.rs).
# Not part of `make test`; figures in BENCHMARKS.md.
.PHONY: bench-scale

bench-scale: control-plane ## 10,000 bundles on 2,000 sim nodes (~12 min; SCALE_BUNDLES / SCALE_NODES shrink it): scale bundles=... nodes=... ready_s=... rss_mib=... reconciles_per_node_event=... restart_settle_s=... noop_restart_writes=... whatif_p99_ms=... wave_slowdown=... (then extra fields, history_calls_per_bundle=... among them)
	@# BENCHMARKS.md's figures are over our first API; AUTOMANAGER_E2E_MANAGER_API=published measures over the published one.
	AUTOMANAGER_E2E_MANAGER_API=$${AUTOMANAGER_E2E_MANAGER_API:-v1} AUTOMANAGER_K8S_BIN="$$(tools/control-plane/build.sh)" cargo bench -p automanager-e2e --bench scale
