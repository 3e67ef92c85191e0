# The two quick-start commands, and the rest of the workflow. Each target runs a script in
# scripts/, so developers and CI do exactly the same thing.
.PHONY: dev test check bench chaos fuzz install

install:
	@scripts/install

# The kernel and what the examples need; not the development toolchain.
dev:
	@scripts/install kernel,examples
	@.venv/bin/rebuno dev --config examples/rebuno.yaml

test: install
	@scripts/test

check: install
	@scripts/check

bench: install
	@scripts/bench

chaos: install
	@scripts/chaos

# A longer fuzzing pass of the HTTP API against its OpenAPI document, on both stores.
fuzz: install
	@scripts/fuzz
