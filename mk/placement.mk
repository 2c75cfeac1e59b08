# Placement engine (crates/placement).

.PHONY: bench-placement bench-placement-ops test-placement

bench-placement: ## placement engine: wave at 1k/5k/10k nodes vs the naive placer; ends with one summary line
	cargo bench -q -p automanager-placement --features naive --bench placement

test-placement: ## placement engine: unit and property tests
	cargo test -p automanager-placement

bench-placement-ops: ## placement engine: criterion per-operation figures at 10k nodes
	cargo bench -p automanager-placement --bench ops
