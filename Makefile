# The two commands a newcomer needs: `make demo` (set up + demo) and `make test` (set up + tests).
PY := .venv/bin/python

.PHONY: setup demo test test-fast lint format typecheck bench
setup: .venv/.installed

.venv/.installed: requirements.txt requirements-dev.txt pyproject.toml scripts/setup.sh
	scripts/setup.sh

demo: setup
	scripts/demo.sh

test: setup
	$(PY) -m pytest -q

# The in-process tests only (no multi-process training): under a minute.
test-fast: setup
	$(PY) -m pytest -q -m "not slow"

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

format: setup
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

typecheck: setup
	.venv/bin/mypy

bench: setup
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done
