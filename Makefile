# Buzz artifact relay: developer commands. Needs only Python 3.11 and make.
# With DATABASE_URL / REDIS_URL unset, `run` and `test` start embedded PostgreSQL and
# Redis with their data under ./var/; with them set, they use those.

PORT ?= 7777
# uvicorn worker processes behind PORT; empty: one per core (buzz.dev.serve --workers).
WORKERS ?=
PYTEST_ARGS ?=
RUN_ARGS ?=
SUITE ?=
BENCH_ARGS ?=

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# The venv is reinstalled only when a requirements file changes.
REQ_HASH := $(shell cat requirements.txt requirements-dev.txt | { sha256sum 2>/dev/null || shasum -a 256; } | cut -c1-16)
STAMP := $(VENV)/.installed-$(REQ_HASH)

# mypy's django plugin and manage.py import buzz.settings, which requires these; nothing
# connects to them (port 1 refuses at once).
LINT_ENV := BUZZ_DEV=1 DATABASE_URL=postgres://lint@127.0.0.1:1/lint REDIS_URL=redis://127.0.0.1:1/0
MYPY_PATHS := buzz artifacts moderation tests
# makemigrations warns that it could not check the migration history against the (placeholder)
# database; the check for missing migrations needs no database, and its exit status is unaffected.
NO_DB_WARNING := -W "ignore:Got an error checking a consistent migration history:RuntimeWarning"

.DEFAULT_GOAL := help
.PHONY: help venv run test check lint bench clean-var

help:
	@echo "make run [PORT=7777] [WORKERS=N]"
	@echo "                          migrate, ensure a localhost community, serve on 127.0.0.1:PORT"
	@echo "                          with N uvicorn worker processes (default: one per core)"
	@echo "make test [PYTEST_ARGS=]  run the whole pytest suite"
	@echo "make check                what CI checks before the tests: ruff check, ruff format --check,"
	@echo "                          import-linter contracts, makemigrations --check, mypy $(MYPY_PATHS)"
	@echo "make lint                 the same as make check"
	@echo "make bench                list the benchmark suites"
	@echo "make bench SUITE=<name> [BENCH_ARGS=...]"
	@echo "                          run one suite (or all): figures beside same-run baselines, as ratios"
	@echo "make clean-var            stop leftover embedded servers and delete ./var"
	@echo "make venv                 create/update .venv only"

venv: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { \
		echo "could not create $(VENV) with $(PYTHON) (on Debian/Ubuntu: apt-get install python3-venv)" >&2; exit 1; }
	$(PY) -m pip install --disable-pip-version-check -q -r requirements-dev.txt
	@rm -f $(VENV)/.installed-*
	@touch $@

run: $(STAMP)
	$(PY) -m buzz.dev.serve --port $(PORT) $(if $(WORKERS),--workers $(WORKERS),) $(RUN_ARGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# Cheapest first; make stops at the first that fails. The import-linter contracts are in
# pyproject.toml; --no-cache leaves no cache directory in the tree (it takes under a second).
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache --no-logo
	$(LINT_ENV) $(PY) $(NO_DB_WARNING) manage.py makemigrations --check --dry-run
	$(LINT_ENV) $(VENV)/bin/mypy $(MYPY_PATHS)

lint: check

# The suites are registered in bench/run.py; without SUITE it lists them.
bench: $(STAMP)
	$(PY) bench/run.py $(SUITE) $(BENCH_ARGS)

clean-var:
	@if [ -x $(PY) ]; then $(PY) -m buzz.dev.devservices clean var; else rm -rf var; fi
