# Two commands: `make demo` and `make test`. Each creates .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint clients bench serve clean constraints

# constraints.txt pins every package to the set CI last passed with (`make constraints` renews it).
$(BIN)/agentproxy: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]' -c constraints.txt
	touch $@

constraints: $(BIN)/agentproxy
	{ echo "# pip constraints: the versions CI installs (make constraints renews them)"; \
	  $(BIN)/python -m pip freeze --exclude-editable; } > constraints.txt

demo: $(BIN)/agentproxy
	$(BIN)/agentproxy demo

lint: $(BIN)/agentproxy
	$(BIN)/ruff check proxy tests bench
	$(BIN)/ruff format --check proxy tests bench
	$(BIN)/mypy

# The real agent CLIs that tests/clients drives, pinned by clients/package-lock.json; without
# npm those tests skip and say why (CI installs npm, so there they always run).
CLIENTS := clients/node_modules/.package-lock.json

$(CLIENTS): clients/package.json clients/package-lock.json
	@if command -v npm >/dev/null; then \
		npm ci --prefix clients --no-audit --no-fund --loglevel=error >/dev/null && touch $@; \
	else echo "npm not found: skipping clients/ (the Claude Code and Codex CLI tests will skip)"; fi

clients: $(CLIENTS)

test: lint clients
	$(BIN)/pytest -q

bench: $(BIN)/agentproxy
	$(BIN)/python bench/overhead.py

serve: $(BIN)/agentproxy
	$(BIN)/agentproxy serve --config policies/local.yaml

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache clients/node_modules
