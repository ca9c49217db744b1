# Every target creates .venv and installs the locked versions on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# wheels a test installs beside agentmend in a fresh venv (tests never reach a registry)
WHEELHOUSE := $(VENV)/wheelhouse
WHEELHOUSE_PACKAGES := openai-agents==0.24.0

.PHONY: run demo test test-fast lint typecheck bench clean

$(STAMP): pyproject.toml setup.py constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	$(PY) -m pip download --quiet -c constraints.txt -d $(WHEELHOUSE) $(WHEELHOUSE_PACKAGES)
	touch $(STAMP)

run: $(STAMP)
	$(PY) main.py

demo: $(STAMP)
	$(PY) main.py --demo

# Tests start many interpreters (the CLI, workers, servers): each may keep what it compiled, even
# where the environment sets PYTHONDONTWRITEBYTECODE, so no child compiles the package again.
TEST_PY := env -u PYTHONDONTWRITEBYTECODE $(PY)

# every test, on every core (pytest-xdist); what a run builds once is shared by its workers
test: $(STAMP)
	$(TEST_PY) -m pytest -q -n auto --dist worksteal

# the inner loop: everything but the tests marked slow (crash trials, the real CLI, wheels)
test-fast: $(STAMP)
	$(TEST_PY) -m pytest -q -n auto --dist worksteal -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
