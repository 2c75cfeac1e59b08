# The reliability suite: faults against the real stack with the invariant checker (docs/reliability.md).
# Not part of `make test`: each scenario takes minutes. RELIABILITY_BUNDLES sets the wave size.
# Both run over our first API unless AUTOMANAGER_E2E_MANAGER_API says otherwise
# (docs/manager-api.md says which scenarios pass over the published API).
.PHONY: test-reliability test-reliability4 test-soak test-chaos test-chaos-published test-loaded

RELIABILITY_LOG ?= .tmp/reliability.log
# Extra libtest arguments, e.g. a scenario name.
RELIABILITY_TEST_ARGS ?=

test-reliability: control-plane ## fault scenarios (operator kill -9, zone outage, stream cuts, restart storm, hostile input, leader pause, deep config, sim restart, apiserver pause and restart, cordon, migration race, kill mid-handover, hostile objects, hostile peers, fleet load; the soak is `make test-soak`) with the invariant checker; one summary line per scenario
	@mkdir -p $(dir $(RELIABILITY_LOG))
	@echo "==> cargo test -p automanager-e2e --features reliability --test reliability (RELIABILITY_BUNDLES=$${RELIABILITY_BUNDLES:-200}; log: $(RELIABILITY_LOG))"
	@status=0; AUTOMANAGER_E2E_MANAGER_API=$${AUTOMANAGER_E2E_MANAGER_API:-v1} AUTOMANAGER_K8S_BIN="$(K8S_BIN)" $(CARGO) test -p automanager-e2e --features reliability \
	  --test reliability -- --test-threads=1 --nocapture $(RELIABILITY_TEST_ARGS) 2>&1 | tee $(RELIABILITY_LOG) || status=$$?; \
	echo "==> summary"; \
	lines=$$(grep -oE 'reliability scenario=.*' $(RELIABILITY_LOG) || true); \
	echo "$${lines:-no scenario reported}"; \
	echo "reliability scenarios=$$(grep -c . <<<"$$lines" || true) failed=$$(grep -c ' ok=false' <<<"$$lines" || true)"; \
	echo "==> round four's figures (scripts/reliability4-summary.sh; log: $(RELIABILITY4_LOG))"; \
	AUTOMANAGER_K8S_BIN="$(K8S_BIN)" REL4_LOG=$(RELIABILITY4_LOG) LOADED_DIR=$(LOADED_DIR) scripts/reliability4-summary.sh || status=1; \
	exit $$status

RELIABILITY4_LOG ?= .tmp/reliability4.log
LOADED_DIR ?= .tmp/loaded

test-reliability4: control-plane ## only round four's line: reliability4 notice_vs_held_gaps=… terminating_pool_healed=… never_open_window=… degraded_zone_recoveries=… flaky_runs=K/N (the last make test-loaded; missing fails)
	@AUTOMANAGER_K8S_BIN="$(K8S_BIN)" REL4_LOG=$(RELIABILITY4_LOG) LOADED_DIR=$(LOADED_DIR) scripts/reliability4-summary.sh

# Each run is a whole make test beside the hog: RUNS=5 takes hours.
RUNS ?= 5

test-loaded: ## make test RUNS times (5) beside a CPU hog of one busy process per core; each run's verdict and failed tests in .tmp/loaded/; prints loaded runs=N failed_runs=K failed_tests=…
	@RUNS=$(RUNS) LOADED_DIR=$(LOADED_DIR) scripts/loaded-runs.sh

test-soak: control-plane ## the memory soak: 7 minutes of create/delete churn to warm up, then 10 measured (RELIABILITY_SOAK_WARM_UP_S, RELIABILITY_SOAK_S); RSS within ±10 % and every invariant held
	AUTOMANAGER_K8S_BIN="$(K8S_BIN)" $(CARGO) test -p automanager-e2e --features reliability \
	  --test reliability -- --test-threads=1 --nocapture --ignored soak

CHAOS_LOG ?= .tmp/chaos.log

test-chaos: control-plane ## seeded chaos schedules on one shared stack (CHAOS_SEEDS=n from CHAOS_SEED_FROM, or CHAOS_SEED=s to replay one); one line per seed and a summary
	@mkdir -p $(dir $(CHAOS_LOG))
	@echo "==> cargo test -p automanager-e2e --features reliability --test chaos (AUTOMANAGER_E2E_MANAGER_API=$${AUTOMANAGER_E2E_MANAGER_API:-v1} CHAOS_SEEDS=$${CHAOS_SEEDS:-10} CHAOS_SEED_FROM=$${CHAOS_SEED_FROM:-1} CHAOS_SEED=$${CHAOS_SEED:-}; log: $(CHAOS_LOG))"
	@status=0; AUTOMANAGER_E2E_MANAGER_API=$${AUTOMANAGER_E2E_MANAGER_API:-v1} AUTOMANAGER_K8S_BIN="$(K8S_BIN)" $(CARGO) test -p automanager-e2e --features reliability \
	  --test chaos -- --nocapture 2>&1 | tee $(CHAOS_LOG) || status=$$?; \
	echo "==> summary"; \
	grep -E '^chaos (run|seed=[0-9]+ faults=|summary)' $(CHAOS_LOG) || echo "no seed reported"; \
	exit $$status

test-chaos-published: ## test-chaos over Manager's published API with our extension (AUTOMANAGER_E2E_MANAGER_API=published; the same CHAOS_* settings)
	@AUTOMANAGER_E2E_MANAGER_API=published $(MAKE) --no-print-directory test-chaos
