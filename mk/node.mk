# node: one real Kubernetes node on this machine (containerd, runc, kubelet, kube-proxy,
# kube-scheduler, kube-controller-manager, CoreDNS, an OCI registry), joined to the testenv
# control plane. Needs root. See docs/node.md.
NODE_DIR ?= .tmp/node
NODE_APISERVER_ARGS = --apiserver-arg=--enable-admission-plugins=ServiceAccount

.PHONY: node node-up node-down test-node

node: ## build the node's binaries (kubelet, containerd, runc, CNI, CoreDNS, crane, pause; cached) and print their bin dir
	@tools/node/build.sh

node-up: ## start a node joined to the control plane in TESTENV_DIR (started if not running); prints export lines
	@if ! $(TESTENV) env --dir $(TESTENV_DIR) >/dev/null 2>&1; then \
	  bin=$$(tools/control-plane/build.sh) && \
	  echo "[node-up] starting a control plane in $(TESTENV_DIR) (ServiceAccount admission on)" >&2 && \
	  $(TESTENV) up --detach --dir $(TESTENV_DIR) --bin-dir "$$bin" $(NODE_APISERVER_ARGS) >/dev/null; \
	fi
	@tools/node/up.sh --testenv $(TESTENV_DIR) --dir $(NODE_DIR)

node-down: ## stop the node and undo its host changes (bridge, iptables, mounts, sysctls); the control plane stays
	@tools/node/down.sh --dir $(NODE_DIR)

test-node: ## smoke: control plane + node, a Deployment and Service, ClusterIP, DNS, kubernetes Service, port-forward; tears down
	@tools/node/smoke.sh
