# revgate: two commands on a fresh machine, `make demo` and `make test`.
SHELL := /bin/bash
PY := .venv/bin/python
export HF_HUB_OFFLINE := 1
export DO_NOT_TRACK := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: setup demo test test-fast lint bench zoo clean

setup:
	bash .ci/setup

zoo: setup
	$(PY) -m revgate.cli.main models make .cache/zoo

demo: setup
	$(PY) -m revgate.cli.main demo

# Every test: the reference zoo trains beside the unit tests, then the integration tests in two phases (.ci/test).
test: setup
	bash .ci/test

test-fast: setup
	$(PY) -m pytest -q tests/unit -m "not lint"

lint: setup
	$(PY) -m pytest -q tests/unit -m lint

bench: setup
	command -v nginx >/dev/null && command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -q nginx wrk; }
	for b in bench/*.py; do case $$b in bench/soak.py|bench/decisions.py) ;; *) $(PY) $$b || exit 1;; esac; done  # soak and decisions run on demand

clean:
	rm -rf .cache .pytest_cache .mypy_cache .ruff_cache
