# Two commands set up a fresh machine and run ddp_lab:
#   make train   # 2-process LeNet on CPU (gloo) on the local Fashion-MNIST, logs to TensorBoard
#   make test    # unit tests and quick multi-process ones (under 90 s), and the linter
#   make test-all  # everything: also torchrun end to end, namespaces, SLURM, full disks (CI)
# Both create .venv (reusing torch if the system Python already has it) and
# `pip install -e .` into it; `make train` also installs the Debian packages
# dataset-fashion-mnist and fortunes (`make data`) when they are not there yet.

PYTHON ?= python3
VENV   ?= .venv
NPROC  ?= 2
ARGS   ?=
PY     := $(VENV)/bin/python
DATA   := /usr/share/datasets/fashion-mnist

.PHONY: train test test-all lint data references

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	-git config core.hooksPath .githooks  # commit subjects of at most 72 characters (.githooks/commit-msg)
	touch $@

TEXT   := /usr/share/games/fortunes

# Fashion-MNIST (data=fashion_mnist) and plain text for data=text, both Debian packages
data:
	@if [ -d $(DATA) ] && [ -d $(TEXT) ]; then echo "Fashion-MNIST: $(DATA); text: $(TEXT)"; \
	elif command -v apt-get >/dev/null; then \
	  apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist fortunes; \
	else echo "No $(DATA) or $(TEXT) and no apt-get: set data.root=<folder with the four .gz files>" \
	  "or data.path=<a text file>"; fi

train: $(VENV)/.installed data
	$(VENV)/bin/torchrun --standalone --nproc_per_node=$(NPROC) -m ddp_lab.train $(ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check ddp_lab tests

test: lint data  # the everyday tier: under 90 s on 2 cores
	$(PY) -m pytest -q -m "not system and not slow" --durations=10

test-all: lint data  # also the slow multi-process proofs and the system tests (CI)
	$(PY) -m pytest -q --durations=25

references: $(VENV)/.installed  # docs/configuration.md's generated tables, after a key changes
	$(PY) scripts/update_references.py
