# The workspace as a whole: CRDs, tests, lint, the local cluster with the examples.
CARGO ?= cargo
K8S_BIN = $(shell tools/control-plane/build.sh)
QUICKSTART_DIR ?= .tmp/quickstart

.PHONY: crds test test-unit test-e2e test-e2e-published test-e2e-v1 test-e2e-standard lint fmt quickstart quickstart-down

# Areas add what `make test` needs first (an npm install, say) to TEST_PREREQS in their mk file.
TEST_PREREQS += control-plane
# How many end-to-end suites run side by side in `make test` (scripts/test-e2e-lanes.sh).
E2E_LANES ?= 2

crds: ## regenerate crds/*.yaml, the Helm chart's copy and docs/reference/crds.md from crates/api
	$(CARGO) run -q -p automanager-api --bin crdgen -- crds
	$(CARGO) run -q -p automanager-api --bin crdgen -- deploy/helm/automanager/files/crds
	$(CARGO) run -q -p automanager-api --bin crdgen -- --reference docs/reference/crds.md

test: $(TEST_PREREQS) ## the whole test suite: unit, property, component and e2e (real apiserver)
	@echo "==> cargo test --workspace --no-run (building the tests)"
	$(CARGO) test --workspace --no-run
	@# The end-to-end tests mostly wait on timers and processes: a cold promtool build (about
	@# 3 CPU-minutes) fits in the CPU they leave, where the alerts test would build it alone.
	@mkdir -p .tmp
	@echo "==> promtool for crates/operator/tests/alert_rules.rs, built in the background at nice 10 (log: .tmp/promtool-build.log; instant when cached)"
	@(nice -n 10 tools/promtool/build.sh > .tmp/promtool-build.log 2>&1 &)
	@echo "==> cargo test: every crate but the end-to-end suites (control plane binaries: $(K8S_BIN))"
	@status=0; \
	AUTOMANAGER_K8S_BIN="$(K8S_BIN)" $(CARGO) test --workspace --exclude automanager-e2e --no-fail-fast || status=$$?; \
	AUTOMANAGER_K8S_BIN="$(K8S_BIN)" $(CARGO) test -p automanager-e2e --lib || status=$$?; \
	AUTOMANAGER_K8S_BIN="$(K8S_BIN)" CARGO="$(CARGO)" E2E_LANES="$(E2E_LANES)" scripts/test-e2e-lanes.sh || status=$$?; \
	exit $$status
	@echo "==> demo smoke test (the README's first command, stopping once every bundle is Ready)"
	$(MAKE) --no-print-directory demo-smoke DEMO_BUILD_ARGS="--workspace --bins --tests --examples"

test-unit: ## tests that need no control plane
	$(CARGO) test --workspace --exclude automanager-e2e --exclude testenv

test-e2e: control-plane ## only the end-to-end suites (E2E_LANES of them side by side)
	@status=0; \
	AUTOMANAGER_K8S_BIN="$(K8S_BIN)" $(CARGO) test -p automanager-e2e --lib || status=$$?; \
	AUTOMANAGER_K8S_BIN="$(K8S_BIN)" CARGO="$(CARGO)" E2E_LANES="$(E2E_LANES)" scripts/test-e2e-lanes.sh || status=$$?; \
	exit $$status

# The suites that prove the operator's core over the published API alone (standard mode):
# placement, recovery, terminate drains and spares (operator, spares); published_api asserts
# that a Migration (stopThenStart) and a warm tier say there that they need our extension.
E2E_STANDARD_SUITES ?= operator spares published_api

test-e2e-published: control-plane ## every end-to-end suite over Manager's published API with our extension (what `make test` runs)
	AUTOMANAGER_K8S_BIN="$(K8S_BIN)" CARGO="$(CARGO)" E2E_LANES="$(E2E_LANES)" \
	  AUTOMANAGER_E2E_MANAGER_API=published E2E_LANES_DIR=.tmp/e2e-lanes-published scripts/test-e2e-lanes.sh

test-e2e-v1: control-plane ## every end-to-end suite over our first API (norsk.manager.v1), while it is kept
	AUTOMANAGER_K8S_BIN="$(K8S_BIN)" CARGO="$(CARGO)" E2E_LANES="$(E2E_LANES)" \
	  AUTOMANAGER_E2E_MANAGER_API=v1 E2E_LANES_DIR=.tmp/e2e-lanes-v1 scripts/test-e2e-lanes.sh

test-e2e-standard: control-plane ## the core end-to-end suites over Manager's published API alone (no extension: standard mode)
	AUTOMANAGER_K8S_BIN="$(K8S_BIN)" CARGO="$(CARGO)" E2E_LANES="$(E2E_LANES)" \
	  AUTOMANAGER_E2E_MANAGER_API=published-standard E2E_LANES_DIR=.tmp/e2e-lanes-standard \
	  E2E_SUITES="$(E2E_STANDARD_SUITES)" scripts/test-e2e-lanes.sh

lint: ## rustfmt check and clippy with warnings as errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt: ## format the workspace
	$(CARGO) fmt --all

quickstart: control-plane ## local control plane + CRDs + examples/, left running (stop: make quickstart-down)
	$(CARGO) build -q -p testenv --bin testenv
	@mkdir -p $(QUICKSTART_DIR)
	$(CARGO) run -q -p testenv --bin testenv -- up --detach --dir $(QUICKSTART_DIR) > $(QUICKSTART_DIR)/env.sh
	@. $(QUICKSTART_DIR)/env.sh; \
	  echo "==> applying crds/"; kubectl apply -f crds/; \
	  kubectl wait --for condition=established --timeout=60s -f crds/ >/dev/null; \
	  echo "==> applying examples/"; \
	  for i in 1 2 3 4 5 6 7 8 9 10; do kubectl apply -f examples/ && break; sleep 1; done; \
	  echo; kubectl get automanager -A; echo; \
	  echo "The cluster is running. To use it:  . $(QUICKSTART_DIR)/env.sh && kubectl get automanager -A"; \
	  echo "To stop it:                         make quickstart-down"

quickstart-down: ## stop what `make quickstart` started
	$(CARGO) run -q -p testenv --bin testenv -- down --dir $(QUICKSTART_DIR)
