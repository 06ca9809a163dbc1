# The two commands: `make run` starts the box, `make test` runs the tests.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-sqlite test-postgres lint typecheck migrate bench bench-layers-model clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): requirements.txt | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

migrate: $(STAMP)
	$(PY) manage.py migrate --no-input

run: migrate
	$(PY) manage.py runbox

# Lint and types first (fast), then the suite twice, in the box's two configurations: embedded
# (SQLite, the ORM queue, polled live updates) and PostgreSQL + Redis. The suite includes the
# import-cycle check (tests/test_import_graph.py). Each test worker's queue has a name of its own
# in the Redis database (tests/conftest.py), so suites run side by side never flush or share it.
test: lint typecheck test-sqlite test-postgres

# Import order, imports only at the top of a module, unused code (ruff.toml).
lint: $(STAMP)
	$(VENV)/bin/ruff check .

typecheck: $(STAMP)
	$(PY) -m mypy boxsite tasks approvals schedules

test-sqlite: $(STAMP)
	env -u DATABASE_URL -u REDIS_URL $(PY) -m pytest $(PYTEST_ARGS)

test-postgres: $(STAMP)
	DATABASE_URL=$${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres} \
	REDIS_URL=$${TEST_REDIS_URL:-redis://127.0.0.1:6379/13} $(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/dispatch.py

# The long run of the layer model test (tests/layers/test_model.py runs a few seeds): as root for overlay.
bench-layers-model: $(STAMP)
	$(PY) bench/layers_model.py --walks $${WALKS:-300}

clean:
	rm -rf $(VENV) var
