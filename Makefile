# Every target creates .venv and installs the locked versions on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# wheels a test installs beside agentmend in a fresh venv, and the build backend the documented
# `pip install .` lines build agentmend with (tests never reach a registry)
WHEELHOUSE := $(VENV)/wheelhouse
WHEELHOUSE_PACKAGES := openai-agents==0.24.0 setuptools wheel

.PHONY: run demo test test-fast lint typecheck docs bench clean instrumented-venv

# The instrumentation packages users run, in a venv of their own (their dependencies are not
# agentmend's): the telemetry tests run small apps with it as child processes and skip without it.
APPS_VENV := .venv-apps
APPS_STAMP := $(APPS_VENV)/.installed
APPS_PACKAGES := \
	'pydantic-ai-slim[anthropic,openai]==2.68.0' logfire==5.4.0 anthropic==2.14.0 \
	openai==3.57.0 openai-agents==0.24.0 \
	openinference-instrumentation-anthropic==3.1.0 \
	openinference-instrumentation-openai-agents==2.6.0 \
	opentelemetry-instrumentation-anthropic==0.62.4 \
	opentelemetry-instrumentation-openai-agents==0.62.4 \
	opentelemetry-sdk==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2

$(STAMP): pyproject.toml setup.py constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	$(PY) -m pip download --quiet -c constraints.txt -d $(WHEELHOUSE) $(WHEELHOUSE_PACKAGES)
	touch $(STAMP)

$(APPS_STAMP): Makefile
	test -x $(APPS_VENV)/bin/python || $(PYTHON) -m venv $(APPS_VENV)
	$(APPS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(APPS_VENV)/bin/python -m pip install --quiet $(APPS_PACKAGES)
	touch $(APPS_STAMP)

instrumented-venv: $(APPS_STAMP)

run: $(STAMP)
	$(PY) main.py

demo: $(STAMP)
	$(PY) main.py --demo

# Tests start many interpreters (the CLI, workers, servers): each may keep what it compiled, even
# where the environment sets PYTHONDONTWRITEBYTECODE, so no child compiles the package again.
TEST_PY := env -u PYTHONDONTWRITEBYTECODE $(PY)

# Tests spend about a quarter of their time waiting on the processes and servers they start
# (a CLI, a worker, PostgreSQL, Chromium): two pytest-xdist workers more than cores keep the
# cores busy through those waits (on 2 cores, 4 workers ran the suite in 278 s where 2 took 302).
TEST_WORKERS ?= $(shell expr $$(nproc) + 2)

# every test, on every core (pytest-xdist); what a run builds once is shared by its workers
test: $(STAMP) $(APPS_STAMP)
	$(TEST_PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal

# the inner loop: everything but the tests marked slow (crash trials, the real CLI, wheels)
test-fast: $(STAMP)
	$(TEST_PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# the documentation site (docs/, mkdocs.yml), every warning an error; the site is built in a new
# temporary folder, never in the repository (`make docs DOCS_SITE=DIR` to choose)
DOCS_SITE ?=
docs: $(STAMP)
	@site="$(DOCS_SITE)"; [ -n "$$site" ] || site="$$(mktemp -d)/site"; \
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir "$$site" && \
	echo "the documentation: $$site/index.html"

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) $(APPS_VENV) .pytest_cache .mypy_cache .ruff_cache
