# Two commands: `make demo` and `make test`. Each creates .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench serve clean

$(BIN)/agentproxy: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

demo: $(BIN)/agentproxy
	$(BIN)/agentproxy demo

lint: $(BIN)/agentproxy
	$(BIN)/ruff check proxy tests bench
	$(BIN)/ruff format --check proxy tests bench
	$(BIN)/mypy

test: lint
	$(BIN)/pytest -q

bench: $(BIN)/agentproxy
	$(BIN)/python bench/overhead.py

serve: $(BIN)/agentproxy
	$(BIN)/agentproxy serve --config policies/local.yaml

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
