# AutoManager: every entry point a person or CI uses. `make help` lists them.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

export CARGO_TERM_COLOR ?= never

help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sort | awk -F ':.*## ' '{printf "  %-22s %s\n", $$1, $$2}'

# Each area keeps its own targets in mk/<area>.mk.
include $(sort $(wildcard mk/*.mk))
