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

# Lint and types first (fast), then the suite twice: on the embedded default (SQLite) and on
# PostgreSQL. The suite includes the import-cycle check (tests/test_import_graph.py).
test: lint typecheck test-sqlite test-postgres

# Import order, imports only at the top of a module, unused code (ruff.toml).
lint: $(STAMP)
	$(VENV)/bin/ruff check .

typecheck: $(STAMP)
	$(PY) -m mypy boxsite tasks approvals schedules

test-sqlite: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

test-postgres: $(STAMP)
	DATABASE_URL=$${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres} $(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/dispatch.py

# The long run of the layer model test (tests/layers/test_model.py runs a few seeds): as root for overlay.
bench-layers-model: $(STAMP)
	$(PY) bench/layers_model.py --walks $${WALKS:-300}

clean:
	rm -rf $(VENV) var
