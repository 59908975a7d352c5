# The README's two commands: `make demo` and `make test`. Both set everything up first.
.PHONY: setup demo dagster test test-heavy bench lint clean

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/krishiv demo

dagster: setup
	@bash scripts/dagster-dev.sh

test: setup
	@bash scripts/setup-browser.sh
	.venv/bin/ruff check .
	.venv/bin/pytest -n 2

test-heavy: setup
	.venv/bin/pytest -m heavy

bench: setup
	.venv/bin/python -m benchmarks

bench-ledger: setup
	.venv/bin/python -m benchmarks.ledger_scale

lint: setup
	.venv/bin/ruff check . && .venv/bin/ruff format --check .

clean:
	rm -rf state .pytest_cache .ruff_cache
