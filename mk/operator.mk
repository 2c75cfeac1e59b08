# The operator: the demo and its figures.
.PHONY: demo demo-smoke operator

operator: ## build the operator binary
	cargo build -p automanager-operator --bin automanager-operator

demo: control-plane ## the whole product locally: control plane + manager-sim + operator + examples/ (Ctrl-C stops it)
	scripts/demo.sh

demo-smoke: control-plane ## run the demo to the point where the bundles are Ready, print, and stop
	DEMO_EXIT=1 DEMO_DIR=$(CURDIR)/.tmp/demo-smoke DEMO_HTTP_PORT=18081 scripts/demo.sh
