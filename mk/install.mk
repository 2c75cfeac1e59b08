# Installing into a cluster: the static binaries, the OCI image (no container engine), the Helm
# chart, and the tests that prove them with real tools. See docs/install.md.
CARGO ?= cargo
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
STATIC_TARGET := x86_64-unknown-linux-gnu
STATIC_DIR = $(or $(CARGO_TARGET_DIR),target)/$(STATIC_TARGET)/release
# The name recorded in the archive; `make dist` pushes it as REGISTRY/automanager-operator.
IMAGE_NAME ?= automanager-operator
IMAGE_DIR ?= dist
IMAGE_TAR = $(IMAGE_DIR)/automanager-operator-$(VERSION).oci.tar
CHART = deploy/helm/automanager
INSTALL_TOOLS = helm kstatus argo-health oci-image dockerfile-config kube-score kubeconform

.PHONY: static sbom image install-tools helm-lint test-install test-install-k8s-second lint-install

static: ## statically linked automanager-operator and manager-sim (release, +crt-static; ~7-15 min cold)
	@echo "==> cargo build --release --target $(STATIC_TARGET) (static: +crt-static)"
	RUSTFLAGS='-C target-feature=+crt-static' $(CARGO) build --release --locked \
	  --target $(STATIC_TARGET) -p automanager-operator -p manager-sim --bins
	@echo "$(STATIC_DIR)/automanager-operator"
	@echo "$(STATIC_DIR)/manager-sim"

sbom: ## the SBOMs of the image's binaries: CycloneDX JSON from Cargo.lock (cargo-cyclonedx, installed once) into dist/sbom/
	@tools/sbom.sh $(IMAGE_DIR)/sbom

# The binaries go in without their DWARF debug info (symbols stay, so backtraces name functions):
# 25 MB instead of 140 MB for the operator. The labels are the Dockerfile's (a test compares).
image: static sbom ## the operator's OCI image, no container engine: writes dist/automanager-operator-<version>.oci.tar, prints its digest
	@tool=$$(tools/go-tool.sh oci-image) && mkdir -p $(IMAGE_DIR)/bin && \
	for b in automanager-operator manager-sim; do strip --strip-debug -o $(IMAGE_DIR)/bin/$$b $(STATIC_DIR)/$$b; done && \
	revision=$$(git rev-parse HEAD 2>/dev/null || echo unknown) && \
	digest=$$("$$tool" --out $(IMAGE_TAR) --name $(IMAGE_NAME):$(VERSION) \
	  --file $(IMAGE_DIR)/bin/automanager-operator=/automanager-operator \
	  --file $(IMAGE_DIR)/bin/manager-sim=/manager-sim \
	  --data $(IMAGE_DIR)/sbom/automanager-operator.cdx.json=/sbom/automanager-operator.cdx.json \
	  --data $(IMAGE_DIR)/sbom/manager-sim.cdx.json=/sbom/manager-sim.cdx.json \
	  --entrypoint /automanager-operator --user 65532:65532 \
	  --label org.opencontainers.image.title=automanager-operator \
	  --label org.opencontainers.image.description="The AutoManager Kubernetes operator (and manager-sim)" \
	  --label org.opencontainers.image.version=$(VERSION) \
	  --label org.opencontainers.image.revision=$$revision \
	  --label org.opencontainers.image.source=https://github.com/norskvideo/automanager \
	  --label org.opencontainers.image.licenses=Apache-2.0) && \
	echo "$$digest" > $(IMAGE_TAR).digest && \
	echo "image: $(IMAGE_TAR) ($(IMAGE_NAME):$(VERSION))" && echo "$$digest"

install-tools: ## build helm, the kstatus checker, the Argo CD health runner, oci-image, dockerfile-config, kube-score and kubeconform from Go modules (cached)
	@for t in $(INSTALL_TOOLS); do echo "==> tools/$$t"; tools/go-tool.sh $$t; done

helm-lint: ## helm lint the chart, with the defaults and with every optional feature on
	@helm=$$(tools/go-tool.sh helm) && "$$helm" lint --strict $(CHART) && \
	"$$helm" lint --strict $(CHART) --set managerSim.enabled=true --set debug.enabled=true \
	  --set metrics.serviceMonitor.enabled=true --set networkPolicy.enabled=true

# The install suites: the image, the chart (lint, dry run, schema, install/upgrade/uninstall,
# GitOps), and the operator under the chart's ServiceAccount with kstatus and Argo CD health.
# Each suite's figures are printed by its tests (--nocapture) and kept in .tmp/test-install.log;
# scripts/ecosystem-summary.sh reads them into the one summary line it ends with.
test-install: control-plane install-tools image ## the install suites (image, chart, RBAC, kstatus, Argo CD health, GitOps); see docs/install.md; ends with the `ecosystem` summary line
	@mkdir -p .tmp && : > .tmp/test-install.log
	@echo "==> cargo test -p automanager-e2e --features install (install_image, install_chart, install_operator)"
	AUTOMANAGER_K8S_BIN="$(K8S_BIN)" AUTOMANAGER_IMAGE="$(CURDIR)/$(IMAGE_TAR)" \
	  $(CARGO) test -p automanager-e2e --features install \
	  --test install_image --test install_chart --test install_operator --no-fail-fast \
	  -- --nocapture 2>&1 | tee -a .tmp/test-install.log
	@$(MAKE) --no-print-directory test-install-k8s-second 2>&1 | tee -a .tmp/test-install.log
	@scripts/ecosystem-summary.sh .tmp/test-install.log

# The other Kubernetes minor of the support matrix (docs/install.md#supported-kubernetes): one
# test, the chart installed, the operator ready under its ServiceAccount over two watched
# namespaces and their Bundles placed, against that release's own control plane.
K8S_SECOND_RELEASE = v1.34.4
test-install-k8s-second: install-tools ## the install suite's core test against Kubernetes v1.34.4 (its control plane built once, ~4 min cold, then cached)
	@echo "==> install_chart's core test against Kubernetes $(K8S_SECOND_RELEASE)"
	bin=$$(tools/control-plane/build.sh $(K8S_SECOND_RELEASE)) && AUTOMANAGER_K8S_BIN="$$bin" \
	  $(CARGO) test -p automanager-e2e --features install --test install_chart -- --exact \
	  the_operator_works_with_the_charts_rights_over_two_watched_namespaces --nocapture

lint-install: ## clippy -D warnings on the install suites (they build only with --features install)
	$(CARGO) clippy -p automanager-e2e --features install --all-targets -- -D warnings
