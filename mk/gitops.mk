# GitOps: the Argo CD health checks (deploy/gitops/argocd/resource_customizations, in Argo CD's
# own layout) and the Flux health expressions (deploy/gitops/flux), tested without a cluster.
# `make test` runs the same through tests/e2e/tests/gitops.rs. See docs/gitops.md.
.PHONY: test-gitops

test-gitops: ## the Argo CD health tests (gopher-lua) and the Flux CEL health checks on the same objects; seconds
	@argo=$$(tools/go-tool.sh argo-health) && "$$argo" test deploy/gitops/argocd/resource_customizations
	@flux=$$(tools/go-tool.sh flux-health) && "$$flux" --kustomization deploy/gitops/flux/automanager.yaml \
	  --argo-tests deploy/gitops/argocd/resource_customizations
