# The two commands a newcomer needs: `make demo` (set up + demo) and `make test` (set up + tests).
PY := .venv/bin/python

.PHONY: setup demo test bench
setup: .venv/.installed

.venv/.installed: requirements.txt pyproject.toml scripts/setup.sh
	scripts/setup.sh

demo: setup
	scripts/demo.sh

test: setup
	$(PY) -m pytest -q

bench: setup
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done
