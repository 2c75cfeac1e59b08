# On call: the kubectl plugin (crates/cli), the Grafana dashboard and Prometheus alerts
# (deploy/grafana, deploy/prometheus), the job-socket examples. See docs/cli.md, docs/runbook.md.
.PHONY: promtool test-alerts test-cli bench-cli plugin dist-plugin test-oncall-cluster

promtool: ## build promtool from the Prometheus Go module v0.316.0 (cached; ~5 CPU-minutes cold) and print its path
	@tools/promtool/build.sh

test-alerts: ## check deploy/prometheus/rules.yaml and run its unit tests with promtool (builds promtool first; `make test` runs the same through crates/operator/tests/alert_rules.rs)
	@p=$$(tools/promtool/build.sh) && cd deploy/prometheus && \
	  echo "==> promtool check rules" && $$p check rules rules.yaml && \
	  echo "==> promtool test rules" && $$p test rules rules.test.yaml

plugin: ## build kubectl-automanager (put target/debug on PATH, then: kubectl automanager --help)
	cargo build -p automanager-cli --bin kubectl-automanager

PLUGIN_DIST_DIR ?= dist

dist-plugin: ## the plugin's release tarball (static binary, kubectl_complete-automanager, LICENSE) and its krew manifest with the tarball's sha256, in dist/
	@scripts/dist-plugin.sh $(PLUGIN_DIST_DIR)
	@cd $(PLUGIN_DIST_DIR) && sha256sum -c kubectl-automanager-v$(VERSION)-linux-amd64.tar.gz.sha256

test-cli: control-plane ## the plugin's unit and snapshot tests, then its end-to-end suite against the real stack
	cargo test -p automanager-cli
	AUTOMANAGER_K8S_BIN="$$(tools/control-plane/build.sh)" cargo test -p automanager-e2e --test cli

JOB_EXAMPLE_TS := examples/job-socket/typescript
.PHONY: job-socket-examples job-socket-example-ts

job-socket-examples: job-socket-example-ts ## install (npm ci) and build the TypeScript handover job example; build the Rust one
	cargo build -p job-socket --example handover_job

job-socket-example-ts:
	cd $(JOB_EXAMPLE_TS) && npm ci --no-audit --no-fund --loglevel=error && npm run -s build

# The e2e suite runs both example jobs under manager-sim; it builds the Rust one itself, as
# `cargo test --workspace` already did (tests/e2e/src/stack.rs, `cargo_build`).
test: job-socket-example-ts

bench-cli: control-plane ## trace and top nodes latency at CLI_BENCH_NODES (2000) / CLI_BENCH_BUNDLES (10000): cli trace_ms=... top_ms=...
	@# BENCHMARKS.md's figures are over our first API; AUTOMANAGER_E2E_MANAGER_API=published measures over the published one.
	AUTOMANAGER_E2E_MANAGER_API=$${AUTOMANAGER_E2E_MANAGER_API:-v1} AUTOMANAGER_K8S_BIN="$$(tools/control-plane/build.sh)" cargo bench -p automanager-e2e --bench cli

# Root: a real node (tools/node), the operator's image in its registry. One node per machine.
test-oncall-cluster: control-plane image ## the plugin with no URL flag against the chart's two Pods on a real node: trace, what-if, top, map, migrate --wait, also after the leader is killed; then --operator-service through a Service over the leader's debug port; prints cli map_ms=... trace_ms=... through=leader-portforward
	@tools/node/build.sh > /dev/null
	@tools/go-tool.sh helm > /dev/null
	AUTOMANAGER_K8S_BIN="$(K8S_BIN)" AUTOMANAGER_IMAGE="$(CURDIR)/$(IMAGE_TAR)" \
	  $(CARGO) test -p automanager-e2e --features oncall-cluster --test oncall_cluster -- --nocapture
