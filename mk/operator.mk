# The operator: the demo and its figures.
.PHONY: demo demo-smoke operator bench-e2e bench-state config-docs chart-schema

operator: ## build the operator binary
	cargo build -p automanager-operator --bin automanager-operator

config-docs: ## rewrite the reference tables of docs/operator-config.md from the settings' schema
	cargo run -q -p automanager-operator --bin automanager-operator -- config docs --write docs/operator-config.md

chart-schema: ## rewrite the config part of the Helm chart's values.schema.json from the settings' schema
	cargo run -q -p automanager-operator --bin automanager-operator -- config schema --chart-values deploy/helm/automanager/values.schema.json

demo: control-plane ## the whole product locally: control plane + manager-sim + operator + examples/ (Ctrl-C stops it)
	scripts/demo.sh

demo-smoke: control-plane ## run the demo to the point where the bundles are Ready, print, and stop
	DEMO_BUILD_ARGS="$(DEMO_BUILD_ARGS)" DEMO_EXIT=1 DEMO_DIR=$(CURDIR)/.tmp/demo-smoke scripts/demo.sh

bench-e2e: control-plane ## end-to-end Bundle throughput vs a client making the same four writes per bundle: e2e bundles=... ratio=... operator_cpu_ms_per_bundle=... rss_mib=...
	@# BENCHMARKS.md's figures are over our first API; AUTOMANAGER_E2E_MANAGER_API=published measures over the published one.
	AUTOMANAGER_E2E_MANAGER_API=$${AUTOMANAGER_E2E_MANAGER_API:-v1} AUTOMANAGER_K8S_BIN="$$(tools/control-plane/build.sh)" cargo bench -p automanager-e2e --bench e2e

bench-state: ## who reaches the operator's state, counted from the source: state lock_sites_outside_state=... controllers_given_context=... migration_builders=... (bench figures not run here read not-measured)
	scripts/bench-state.sh
