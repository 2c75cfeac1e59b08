# Distribution and the chart on a real node: `make dist` pushes the image and the chart to an
# OCI registry; `make test-cluster` installs them on a node built here (docs/node.md,
# docs/install.md). Neither is part of `make test`.
REGISTRY ?= 127.0.0.1:5000
REGISTRY_DIR ?= .tmp/registry
CHART_DIR = deploy/helm/automanager

.PHONY: dist registry-up registry-down chart-files chart-readme test-cluster

registry-up: ## a local OCI registry on $(REGISTRY) (crane registry serve, blobs in .tmp/registry); stop: make registry-down
	@crane=$$(tools/go-tool.sh registry) && \
	if "$$crane" catalog --insecure $(REGISTRY) >/dev/null 2>&1; then echo "a registry already answers on $(REGISTRY)"; exit 0; fi && \
	mkdir -p $(REGISTRY_DIR) && \
	(setsid "$$crane" registry serve --address $(REGISTRY) --disk $(REGISTRY_DIR) > $(REGISTRY_DIR)/registry.log 2>&1 < /dev/null & echo $$! > $(REGISTRY_DIR)/registry.pid) && \
	for i in $$(seq 1 50); do "$$crane" catalog --insecure $(REGISTRY) >/dev/null 2>&1 && break; sleep 0.2; done && \
	"$$crane" catalog --insecure $(REGISTRY) >/dev/null && echo "registry on $(REGISTRY) (pid $$(cat $(REGISTRY_DIR)/registry.pid)); stop it with make registry-down"

registry-down: ## stop the registry registry-up started
	@if [ -f $(REGISTRY_DIR)/registry.pid ]; then kill "$$(cat $(REGISTRY_DIR)/registry.pid)" 2>/dev/null || true; rm -f $(REGISTRY_DIR)/registry.pid; echo "registry stopped"; else echo "no registry started by registry-up"; fi

dist: image dist-plugin ## push the image and the chart (helm push, OCI) to REGISTRY (default: a local one, started if none answers); the plugin tarball and krew manifest in dist/
	@if [ "$(REGISTRY)" = 127.0.0.1:5000 ]; then $(MAKE) --no-print-directory registry-up; fi
	@tools/dist.sh $(REGISTRY) --image $(IMAGE_TAR)

chart-files: ## copy the alerts and the dashboard into the chart (files/) from their source in deploy/, and the chart's user roles out to deploy/rbac/
	cp deploy/prometheus/rules.yaml $(CHART_DIR)/files/prometheus/rules.yaml
	cp deploy/grafana/automanager.json $(CHART_DIR)/files/grafana/automanager.json
	cp $(CHART_DIR)/files/user-roles.yaml deploy/rbac/user-roles.yaml

chart-readme: ## regenerate the chart's README.md from values.yaml's comments (helm-docs, built from its Go module)
	@tool=$$(tools/go-tool.sh helm-docs) && "$$tool" --chart-search-root $(CHART_DIR) --template-files README.md.gotmpl --skip-version-footer

# Root: the node needs network namespaces, mounts, iptables and cgroups. One node per machine:
# the test waits for another one to finish (tests/e2e/src/cluster.rs).
test-cluster: control-plane image ## the chart from a registry on a real node: install, leader kill, upgrade, helm test, a second release, uninstall; prints one line
	@tools/node/build.sh > /dev/null
	@tools/go-tool.sh helm > /dev/null
	AUTOMANAGER_K8S_BIN="$(K8S_BIN)" AUTOMANAGER_IMAGE="$(CURDIR)/$(IMAGE_TAR)" \
	  $(CARGO) test -p automanager-e2e --features cluster --test cluster -- --nocapture
