# control-plane: the Go-built etcd/kube-apiserver/kubectl and the testenv CLI around them.
# See docs/testenv.md.
CARGO ?= cargo
TESTENV_DIR ?= .tmp/testenv
TESTENV = $(CARGO) run -q -p testenv --bin testenv --

.PHONY: control-plane cluster-up cluster-env cluster-down

control-plane: ## build etcd, kube-apiserver and kubectl v1.35.4 (cached; ~4 min cold) and print their bin dir
	@tools/control-plane/build.sh

cluster-up: ## start a local control plane in the background; prints export lines (eval "$(make -s cluster-up)")
	@bin=$$(tools/control-plane/build.sh) && $(TESTENV) up --detach --dir $(TESTENV_DIR) --bin-dir "$$bin"

cluster-env: ## print the export lines (KUBECONFIG, PATH) of the running local control plane
	@$(TESTENV) env --dir $(TESTENV_DIR)

cluster-down: ## stop the local control plane started by cluster-up
	@$(TESTENV) down --dir $(TESTENV_DIR)
