# Spare tiers, disruption windows and reclaim notices (crates/policy).

.PHONY: bench-spare-tiers

bench-spare-tiers: ## policy simulation on a fake clock: spare-tiers idle_node_hours_saved=... voluntary_moves_outside_windows=... moved_before_deadline=...% gaps=... gold_silver_left_to_recovery=... dropped_bronze=... notice_plan_p99_ms=...
	cargo bench -q -p automanager-policy --bench spare_tiers
