# Spare tiers, disruption windows and reclaim notices (crates/policy).

.PHONY: bench-spare-tiers bench-warm-recovery

bench-spare-tiers: ## policy simulation on a fake clock, then bench-warm-recovery: spare-tiers idle_node_hours_saved=... voluntary_moves_outside_windows=... moved_before_deadline=...% gaps=... gold_silver_left_to_recovery=... dropped_bronze=... notice_plan_p99_ms=...
	cargo bench -q -p automanager-policy --bench spare_tiers
	$(MAKE) --no-print-directory bench-warm-recovery

bench-warm-recovery: control-plane ## a gold recovery that starts a warm spare vs provisioning, then inside a schedule's window vs a flat hot target: warm-recovery ... operator_share_p99_ms=...; spare-schedule gold_recovery_in_window_p99_ms=... flat_hot_p99_ms=...
	@# Its reader of Manager is a client of our first API.
	AUTOMANAGER_E2E_MANAGER_API=v1 AUTOMANAGER_K8S_BIN="$$(tools/control-plane/build.sh)" cargo bench -p automanager-e2e --bench warm_recovery
