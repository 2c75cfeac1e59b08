# GitOps: the Argo CD health checks (deploy/gitops/argocd/resource_customizations, in Argo CD's
# own layout) and how kstatus, which Flux uses for our objects, reads the same test objects,
# tested without a cluster. `make test` runs the same through tests/e2e/tests/gitops.rs. See
# docs/gitops.md.
.PHONY: test-gitops

test-gitops: ## the Argo CD health tests (gopher-lua), and kstatus (Flux's reading) on the same objects
	@argo=$$(tools/go-tool.sh argo-health) && "$$argo" test deploy/gitops/argocd/resource_customizations
	$(CARGO) test -p automanager-e2e --test gitops -- --nocapture
