# The two commands a newcomer needs: `make demo` and `make test`. Both set themselves up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup bytecode services demo test lint format bench clean readme stack stack-down test-stack

$(STAMP): pyproject.toml
	ops/setup.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The sandbox's exec helper (C): lets the worker vfork instead of running Python
# between fork and exec. Static where libc.a is there (no dynamic loading per job:
# ~0.15 ms each exec); without a compiler the backends fall back to Python.
$(BIN)/sandfarm-exec: sandbox_core/native/sandfarm-exec.c sandbox_core/native/standby.h $(STAMP)
	cc -O2 -Wall -Wextra -static -o $@ $< 2>/dev/null || cc -O2 -Wall -Wextra -o $@ $< \
		|| echo "[setup] no C compiler: Python child setup"

# The project's own bytecode, written here: an editable install leaves it to the first
# import, and where PYTHONDONTWRITEBYTECODE is set (this kind of machine sets it) every
# start of the CLI, a worker or the gateway compiled its ~55 modules again, ~60 ms of a
# `batch run`'s ~0.35 s start (ops/bench/RESULTS.md). checked-hash: each import checks
# the file against a hash of its source (~2 us a module), not against its mtime, which
# misses a same-size edit within the second (-f: a timestamp file left by an earlier
# Python is rewritten too). A tree this user cannot write keeps compiling at each start,
# as before: a note, not a failure.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -f --invalidation-mode checked-hash producer sandbox_core worker \
		>/dev/null 2>&1 || echo "[setup] bytecode not written here: each start compiles it"

setup: $(STAMP) $(BIN)/sandfarm-exec bytecode

# Start what the tests and the demo need (Redis, a Docker engine, bubblewrap), when root.
services: setup
	ops/services.sh

demo: services
	ops/demo.sh

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

readme: setup  # the settings table, from the settings model
	$(BIN)/python ops/update_readme.py

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test: services lint
	$(BIN)/pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# The whole farm in containers (docker-compose.yml, ops/stack.sh); README "The stack".
stack:
	ops/stack.sh up

stack-down:  # VOLUMES=1 also removes the named data volumes (Redis, Prometheus)
	ops/stack.sh down $(if $(filter 1,$(VOLUMES)),--volumes)

# The stack end to end: up from clean, a batch through the gateway, Flower in Chromium,
# Prometheus, down (tests/stack/, which plain `make test` leaves out).
test-stack: setup
	SANDFARM_TEST_STACK=1 $(BIN)/pytest -q -p no:cacheprovider -s tests/stack $(PYTEST_ARGS)

bench: services
	$(BIN)/python ops/bench/sandbox_overhead.py
	$(BIN)/python ops/bench/docker_latency.py
	$(BIN)/python ops/bench/farm_throughput.py
	$(BIN)/python ops/bench/tenants.py
	$(BIN)/python ops/bench/scale.py
	$(BIN)/python ops/bench/humaneval.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
