# `make demo` and `make test` are the whole set-up on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# the browser tests (pytest -m browser) drive Debian's chromium; Playwright's own browsers are
# never downloaded
CHROMIUM ?= /usr/bin/chromium
export ATTNLAB_CHROMIUM := $(CHROMIUM)

.PHONY: demo test test-fast test-browser bench bench-lm docs lint format clean

# the pip the venv brings (Python 3.11's is pip 23) installs the package editable (PEP 660); no
# upgrade of pip itself (a download and a reinstall on every fresh clone)
$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "make: attnlab needs Python 3.11 or newer; $(PYTHON) is $$($(PYTHON) -V 2>&1) (try: make PYTHON=python3.11 ...)"; exit 2; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt -e '.[test,docs]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/attnlab demo

test: $(STAMP)
	@test -x $(CHROMIUM) || echo "make test: no Chromium at $(CHROMIUM): the browser tests will be SKIPPED (apt-get install chromium)"
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

test-browser: $(STAMP)
	$(PY) -m pytest -q -m browser

# the tests not marked slow, on both cores, stopping at the first failure
test-fast: $(STAMP)
	$(PY) -m pytest -q -x -n 2 --dist loadfile --no-loadscope-reorder -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/attention.py
	$(PY) benchmarks/train_throughput.py
	$(PY) benchmarks/generate.py

# the budget rule's sweep (resumable, ~1.5 h on 2 idle cores) and attnlab against nanoGPT at
# equal wall-clock; NANOGPT=DIR is a nanoGPT checkout (its model.py is imported, never copied)
bench-lm: $(STAMP)
	@test -n "$(NANOGPT)" || { echo "usage: make bench-lm NANOGPT=DIR (a nanoGPT checkout)"; exit 2; }
	$(PY) benchmarks/budget_sweep.py
	$(PY) benchmarks/lm_vs_nanogpt.py --nanogpt $(NANOGPT) --budgets 150 300

# the documentation site, offline, into site/: the eight notebooks executed in full (a few
# minutes on 2 cores) and rendered into docs/notebooks/, then mkdocs build --strict (every link,
# image and API reference must resolve)
docs: $(STAMP)
	$(PY) notebooks/render.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: $(STAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check src tests benchmarks notebooks
	$(VENV)/bin/ruff format --check src tests benchmarks notebooks

format: $(STAMP)
	$(VENV)/bin/ruff format src tests benchmarks notebooks
	$(VENV)/bin/ruff check --fix src tests benchmarks notebooks

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache site docs/notebooks
