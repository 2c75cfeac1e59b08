# The TypeScript library's promises proven on the real stack (the tests also run in `make test`).

.PHONY: test-fidelity

test-fidelity: control-plane ## the library's promises end to end: split across pools, a drain's gaps, a trace after failover, a reclaim notice to its deadline, flap hold-outs, spares ahead of a schedule; one summary line
	@AUTOMANAGER_K8S_BIN="$(K8S_BIN)" scripts/test-fidelity.sh
