# On call: the kubectl plugin (crates/cli), the Grafana dashboard and Prometheus alerts
# (deploy/grafana, deploy/prometheus), the job-socket examples. See docs/cli.md, docs/runbook.md.
.PHONY: promtool test-alerts test-cli bench-cli plugin

promtool: ## build promtool from the Prometheus Go module v0.316.0 (cached; ~5 CPU-minutes cold) and print its path
	@tools/promtool/build.sh

test-alerts: ## check deploy/prometheus/rules.yaml and run its unit tests with promtool (builds promtool first; not part of `make test`)
	@p=$$(tools/promtool/build.sh) && cd deploy/prometheus && \
	  echo "==> promtool check rules" && $$p check rules rules.yaml && \
	  echo "==> promtool test rules" && $$p test rules rules.test.yaml

plugin: ## build kubectl-automanager (put target/debug on PATH, then: kubectl automanager --help)
	cargo build -p automanager-cli --bin kubectl-automanager

test-cli: control-plane ## the plugin's unit and snapshot tests, then its end-to-end suite against the real stack
	cargo test -p automanager-cli
	AUTOMANAGER_K8S_BIN="$$(tools/control-plane/build.sh)" cargo test -p automanager-e2e --test cli

JOB_EXAMPLE_TS := examples/job-socket/typescript
.PHONY: job-socket-examples

job-socket-examples: ## install (npm ci) and build the TypeScript handover job example; build the Rust one
	cd $(JOB_EXAMPLE_TS) && npm ci --no-audit --no-fund --loglevel=error && npm run -s build
	cargo build -p job-socket --example handover_job

# The e2e suite runs both example jobs under manager-sim.
test: job-socket-examples

bench-cli: control-plane ## trace and top nodes latency at CLI_BENCH_NODES (2000) / CLI_BENCH_BUNDLES (10000): cli trace_ms=... top_ms=...
	AUTOMANAGER_K8S_BIN="$$(tools/control-plane/build.sh)" cargo bench -p automanager-e2e --bench cli
