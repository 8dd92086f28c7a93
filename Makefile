# The two commands of the README: `make demo` brings FRLM web up and runs a demo FRLM run;
# `make test` runs the whole test suite. Both set up what they need first.
PY := .venv/bin/python

.PHONY: demo up down test lint bench

demo:
	@.ci/bootstrap
	@$(PY) manage.py migrate --no-input -v 0
	@$(PY) manage.py frlm_up --demo

up:
	@.ci/bootstrap
	@$(PY) manage.py migrate --no-input -v 0
	@$(PY) manage.py frlm_up

down:
	@$(PY) manage.py frlm_down

test:
	@.ci/bootstrap --test
	@$(PY) -m pytest $(PYTEST_ARGS)

lint:
	@$(PY) -m ruff check .
	@$(PY) -m ruff format --check .

bench:
	@$(PY) bench/fanout.py
