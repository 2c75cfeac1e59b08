# job-socket: the worker<->job WebSocket contract (crates/job-socket).
JOB_SOCKET_REF := crates/job-socket/reference

.PHONY: job-socket-reference job-socket-vectors job-socket-test job-socket-conformance bench-socket

job-socket-reference: ## install the job-socket oracle (published migration-socket.js + zod 4.4.3) with npm ci
	cd $(JOB_SOCKET_REF) && npm ci --no-audit --no-fund --loglevel=error

job-socket-vectors: job-socket-reference ## regenerate crates/job-socket/vectors from the reference
	cd $(JOB_SOCKET_REF) && node gen-vectors.mjs

job-socket-test: job-socket-reference ## job-socket tests, incl. reference vs binary side by side
	cargo test -p job-socket

job-socket-conformance: job-socket-reference ## run the reference and the job-socket binary over the vectors
	cargo test -p job-socket --test side_by_side -- --nocapture

bench-socket: ## job-socket figures: socket parse_mb_s=<x> relay_p99_us=<x>
	cargo bench -p job-socket --bench socket -- --summary
