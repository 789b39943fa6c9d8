# The two commands: `make run` starts the platform, `make test` runs the tests.
# Both create .venv from requirements.txt on first use (Python 3.11+ and make only).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast faults soak lint bench clean

$(STAMP): requirements.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@touch $(STAMP)

run: $(STAMP)
	@$(BIN)/python scripts/run.py

# Two pytest sessions side by side, each with its own Redis and database (scripts/test_sessions.py);
# PYTEST_ARGS goes to both, or is one ordinary session when it names a test path.
test: $(STAMP)
	@$(BIN)/python scripts/test_sessions.py $(PYTEST_ARGS)

# The unit tier alone: pure logic, no Redis, no database, no worker (under a minute).
test-fast: $(STAMP)
	@$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

faults: $(STAMP)
	@FAULTS_LONG=1 $(BIN)/python -m pytest tests/faults $(PYTEST_ARGS)

# Scenarios 4, 10 and S1 and the liveness ones, SOAK_RUNS times (default 5), two campaigns at once;
# prints the stuck chats of each run (scripts/soak.py). Long: about 4 minutes a run.
soak: $(STAMP)
	@$(BIN)/python scripts/soak.py

# Side-by-side benchmark (installs the bench-only requirements: dramatiq, huey, taskiq, py-spy).
bench: $(STAMP)
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-bench.txt
	@$(BIN)/python manage.py benchmark $(BENCH_ARGS)

lint: $(STAMP)
	@$(BIN)/ruff check .
	@$(BIN)/mypy

clean:
	rm -rf $(VENV) staticfiles .pytest_cache
