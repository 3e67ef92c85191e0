# The two quick-start commands, and the rest of the workflow. Each target runs a script in
# scripts/, so developers and CI do exactly the same thing.
.PHONY: dev test check bench install

install:
	@scripts/install

dev: install
	@.venv/bin/rebuno dev --config examples/rebuno.yaml

test: install
	@scripts/test

check: install
	@scripts/check

bench: install
	@scripts/bench
