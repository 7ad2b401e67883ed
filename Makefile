# Two commands matter: `make demo` and `make test`. Everything else is set-up they pull in.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMPS := .stamps

.PHONY: demo test lint typecheck unit integration bench setup clean docs

setup: $(STAMPS)/venv $(STAMPS)/npm

$(STAMPS)/venv: pyproject.toml
	@mkdir -p $(STAMPS)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "shardflow needs Python 3.11 or newer")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

$(STAMPS)/npm: package.json package-lock.json
	@mkdir -p $(STAMPS)
	@node -e 'const v=+process.versions.node.split(".")[0]; if (v<18) { console.error("Node >= 18 needed"); process.exit(1) }'
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

demo: setup
	$(BIN)/python -m shardflow.demo

lint: $(STAMPS)/venv
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMPS)/venv
	$(BIN)/mypy

unit: $(STAMPS)/venv
	$(BIN)/pytest -q tests/unit

integration: setup
	$(BIN)/pytest -q tests/integration

docs: $(STAMPS)/venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir .site

test: setup lint typecheck docs
	$(BIN)/pytest -q -p no:cacheprovider

bench: setup
	$(BIN)/python bench/producer.py

clean:
	rm -rf $(VENV) node_modules $(STAMPS) .site
