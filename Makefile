# The README's two commands: `make demo` and `make test`. Both build .venv/ on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch 2.13.0 is pinned for the self-contained venv: on CPU-only machines of this project it is the CPU build.
TORCH  ?= torch==2.13.0

.PHONY: demo test test-fast venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

demo: venv
	$(BIN)/draftheads demo

test: venv
	$(BIN)/python -m pytest -q

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) build dist *.egg-info
