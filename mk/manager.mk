# Manager gRPC API, manager-sim and manager-client.

.PHONY: test-manager test-manager-api test-sim-socket bench-sim-socket bench-manager manager-sim lint-manager

test-manager: ## test manager-proto, manager-sim and manager-client (loopback, property tests)
	cargo test -p manager-proto -p manager-sim -p manager-client

test-manager-api: control-plane ## Manager's published API: our protos vs the package, the package's client vs manager-sim and its server vs our client, the operator over it end to end, a forced reconnect at 10k jobs; one summary line
	@AUTOMANAGER_K8S_BIN="$(K8S_BIN)" scripts/test-manager-api.sh

test-sim-socket: ## handovers through manager-sim over gRPC and the real job socket (refuse, abort, slow cutover, failed participant)
	cargo test -p manager-sim --test job_socket

bench-sim-socket: ## handover latency through manager-sim over the real job socket vs in process; prints one summary line
	@log=$$(mktemp); \
	if cargo bench -q -p manager-sim --bench handover 2>"$$log" | grep '^sim-socket '; then rm -f "$$log"; \
	else cat "$$log" >&2; rm -f "$$log"; exit 1; fi

bench-manager: ## mirror ingest, 10k-node sync and StartJob rate over loopback; prints one summary line
	@log=$$(mktemp); \
	if cargo bench -q -p manager-client --bench manager 2>"$$log" | grep '^manager '; then rm -f "$$log"; \
	else cat "$$log" >&2; rm -f "$$log"; exit 1; fi

bench-published-mirror: ## the published API's client: a forced reconnect at 10k jobs / 2k nodes vs a first snapshot; prints one summary line
	@log=$$(mktemp); \
	if cargo bench -q -p manager-client --bench published_mirror 2>"$$log" | grep '^published-mirror '; then rm -f "$$log"; \
	else cat "$$log" >&2; rm -f "$$log"; exit 1; fi

manager-sim: ## run the Manager simulator (jobs on the real job socket) with the demo config (MANAGER_SIM_ARGS for more flags, e.g. --no-job-socket)
	cargo run -q -p manager-sim --bin manager-sim -- serve --config crates/manager-sim/examples/demo.yaml $(MANAGER_SIM_ARGS)

lint-manager: ## fmt check and clippy -D warnings for the manager crates
	cargo fmt -p manager-proto -p manager-sim -p manager-client -- --check
	cargo clippy -p manager-proto -p manager-sim -p manager-client --all-targets -- -D warnings
