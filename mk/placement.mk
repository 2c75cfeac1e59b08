# Placement engine (crates/placement).

.PHONY: bench-placement test-placement

bench-placement: ## placement engine: wave at 1k/5k/10k nodes vs the naive placer; ends with one summary line
	cargo bench -q -p automanager-placement --features naive --bench placement

test-placement: ## placement engine: unit and property tests
	cargo test -p automanager-placement
