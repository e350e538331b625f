# Two commands a newcomer needs: `make demo` and `make test`. Each sets itself up first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup browser postgres mpi demo demo-run test test-quick lint typecheck clean

setup: $(STAMP)

# torch is pinned and installed on its own first: an unpinned torch, pulled in as a
# dependency, would fetch the multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# Two jobs share 8 virtual slots on an embedded server: 8 -> 4/4 -> 3/5 -> 8, live.
demo: $(STAMP)
	$(PY) examples/fairshare_demo.py

# One job under `tidal run`, growing and shrinking 2 -> 4 -> 1 -> 3 while it trains.
demo-run: $(STAMP)
	$(PY) -m tidal.cli run --workers 1:4 --initial 2 --resize-at 25:4,90:1,130:3 -- \
		examples/digits_mlp.py --epochs 10 --step-delay 0.05

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests examples benchmarks
	$(VENV)/bin/ruff format --check src tests examples benchmarks
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The fast subset, one test process per core. `make test` runs it so too, then the slow
# multi-process suites one at a time: they time recoveries and would share the cores with
# each other.
test-quick: $(STAMP)
	$(VENV)/bin/pytest -q -m "not slow" -n auto

# The dashboard's browser tests drive Debian's Chromium (Playwright's own download is not
# used); installed here when missing so a fresh machine and CI run them.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	test -x /usr/bin/chromium || ($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium)

# The store tests run on a real PostgreSQL as well: Debian's server binaries (the tests
# start a private cluster of their own); installed here when missing, for CI.
postgres:
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || ($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq postgresql)

# The MPI launcher's test runs a real mpirun over the host list it is given: Debian's
# Open MPI, installed here when missing.
mpi:
	command -v mpirun >/dev/null || ($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq openmpi-bin)

test: lint typecheck browser postgres mpi
	$(VENV)/bin/pytest -q -m "not slow" -n auto
	$(VENV)/bin/pytest -q -m slow

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
