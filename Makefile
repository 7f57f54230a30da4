# Inference Lab: `make lab` opens the curriculum, `make test` runs every test.
# Both set up .venv first (a Python >= 3.12 is found for you; PYTHON=... chooses one).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV   := .venv
PY     := $(VENV)/bin/python
ACCEL  ?= $(shell scripts/detect_accel.sh)
comma  := ,
CUDA   := $(filter cuda12 cuda13,$(ACCEL))
# The learner's environment (make lab) has no test tools; make test adds the dev extra.
LAB_SPEC := .$(if $(CUDA),[$(CUDA)])
DEV_SPEC := .[dev$(if $(CUDA),$(comma)$(CUDA))]
LAB_STAMP := $(VENV)/.installed-$(ACCEL)
DEV_STAMP := $(VENV)/.installed-dev-$(ACCEL)
SITE   ?= build/site
export PYTHON

# nbval runs in lax mode: every cell must run, cells tagged nbval-check-output are compared,
# and the notebooks' own asserts test the lessons. Flags live here, not in pytest's addopts,
# because the GPU image has pytest but no nbval.
NBVAL_FLAGS := --nbval-lax --nbval-current-env -p no:cacheprovider

.PHONY: help setup setup-dev lab reset-lesson check-root test unit-test notebook-test browser-test chromium notebooks site gpu-check bench probe \
        triton-report clean check-python

help:
	@echo "make lab        set up, then open the curriculum in JupyterLab"
	@echo "make test       set up, then run every test (unit, notebooks under nbval, browser)"
	@echo "make reset-lesson LESSON=05  put lesson 05 back as shipped in my-notebooks/ (your copy is kept)"
	@echo "make notebooks  re-execute the notebooks in place so they are stored with outputs"
	@echo "make site       the stored notebooks as a static site in $(SITE)/ (reads offline; installs only nbconvert)"
	@echo "make gpu-check  on a GPU machine (<= 5 min; QUICK=1: <= 2): GPU tests, kernel benchmarks, the probe"
	@echo "make triton-report  no GPU needed: compile every kernel the model launches for sm_90 and sm_80"
	@echo "options: PYTHON=/path/to/python3.12  ACCEL=cpu|cuda12|cuda13  ALLOW_ROOT=1 (make lab as root)"

check-python:
	@scripts/find_python.sh >/dev/null

setup: check-python $(LAB_STAMP)
setup-dev: check-python $(DEV_STAMP)

ifneq ($(filter-out cpu cuda12 cuda13,$(ACCEL)),)
$(error ACCEL=$(ACCEL) is not one of cpu, cuda12, cuda13)
endif

# install(SPEC): create the venv if needed, install SPEC editable through constraints.txt (every
# wheel pinned, the CUDA plugins included), install the lab's JupyterLab defaults. The wheels go in
# with uv (pinned too, put into the venv by pip in ~3 s): it downloads, unpacks and byte-compiles
# them side by side, ~25 s for the dev stack on 2 cores where pip took ~1:45. uv does not read
# pip's own settings (a mirror in pip.conf, say): where it cannot install, pip does, as before.
# Both byte-compile every module: where PYTHONDONTWRITEBYTECODE is set (the 2-core build machines
# set it), Python never writes a .pyc itself, and each new process (a notebook's kernel, a server,
# a test's child) compiled jax, flax and the rest from source again: `import jax` took 2.9 s, 1.0 s
# compiled.
define install
	@py=$$(scripts/find_python.sh); \
	if ! $(PY) -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then \
	  echo "creating $(VENV) with $$py"; rm -rf $(VENV); "$$py" -m venv $(VENV); \
	fi
	@echo "installing inference-lab$(patsubst .%,%,$(1)) with the pinned stack (constraints.txt)..."
	@if $(PY) -m pip install -q --disable-pip-version-check -c constraints.txt uv >/dev/null 2>&1 \
	    && $(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode -c constraints.txt -e "$(1)"; then :; else \
	  echo "uv could not install it; pip does (about two minutes)"; \
	  $(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e "$(1)"; \
	fi
	@$(PY) scripts/lab_settings.py >/dev/null
	@$(PY) -c "import jax, flax, inference_lab; print('jax', jax.__version__, 'flax', flax.__version__, 'ready in $(VENV)')"
	@rm -f $(VENV)/.installed-*
endef

# Re-running when pyproject.toml and constraints.txt are unchanged does nothing. The dev install
# includes the learner's, so it marks both as done.
$(LAB_STAMP): pyproject.toml constraints.txt
	$(call install,$(LAB_SPEC))
	@touch $@

$(DEV_STAMP): pyproject.toml constraints.txt
	$(call install,$(DEV_SPEC))
	@touch $@ $(LAB_STAMP)

# The lab's own modules as .pyc too (they are imported from this folder, not installed), for the
# same reason as the wheels above: ~1 s, before every run, so each kernel and child process reads
# them compiled. An edit is never run stale: Python checks a .pyc against its source's time.
compile_sources = $(PY) -m compileall -q inference_lab pallas_kernels scripts tests

# As root, lab.sh refuses unless ALLOW_ROOT=1 (in the environment or on make's command line);
# check-root says so before the set-up spends a minute installing.
lab: check-root setup
	@$(compile_sources)
	ALLOW_ROOT="$(ALLOW_ROOT)" scripts/lab.sh

# make lab serves my-notebooks/, the learner's copy (scripts/learner_copy.py); this puts one
# lesson back as shipped, the learner's version renamed beside it.
reset-lesson: setup
	$(PY) scripts/learner_copy.py --reset "$(LESSON)"

check-root:
	@if [ "$$(id -u)" = "0" ] && [ "$(ALLOW_ROOT)" != "1" ]; then \
	  echo "make lab: refusing to start JupyterLab as root (its terminals would give anyone with the token a root shell); run it as an ordinary user, or opt in with ALLOW_ROOT=1 make lab" >&2; \
	  exit 1; \
	fi

# The unit tests and the notebooks run as one pytest session: the two workers share one queue
# of whole files (a notebook is one), so neither idles while the other finishes one part before
# the next starts. The queue's order is tests/conftest.py's, the longest first;
# --no-loadscope-reorder keeps it (xdist would sort the files by how many tests each holds).
# Then the browser tests, alone: beside a timing lesson, as a third busy process on two cores,
# they made three of its verdicts fail rather than say CANNOT DECIDE, and inside the session, as
# one of the two workers, their JupyterLab pages took 3-5x as long to draw (the suite ran longer).
# make unit-test and make notebook-test run each part alone. In CI, Chromium's install (apt) runs
# beside the Python set-up (uv): both mostly wait on downloads. Each part's time is printed
# (seconds since make started).
MAKE_STARTED := $(shell date +%s)
elapsed = $$(( $$(date +%s) - $(MAKE_STARTED) )) s
test: check-python
	@$(MAKE) --no-print-directory -j2 setup-dev chromium
	@$(compile_sources)
	@echo "make test: set-up done at $(elapsed)"
	INFERENCE_LAB_PROGRESS=0 $(PY) -m pytest tests notebooks --ignore=tests/browser $(NBVAL_FLAGS) -q \
	  --durations=15 -n 2 --dist loadfile --no-loadscope-reorder
	@echo "make test: unit tests and notebooks done at $(elapsed)"
	$(MAKE) --no-print-directory browser-test
	@echo "make test: all passed in $(elapsed)"

# Two workers: most of a unit test's time is XLA compiling one program, on one core (unoptimized
# on a CPU: tests/conftest.py); no unit test times anything (performance is measured by the
# benchmarks), so sharing the cores bends no result. UNIT_WORKERS=0 runs them in this process.
UNIT_WORKERS ?= 2
unit-test: setup-dev
	@$(compile_sources)
	$(PY) -m pytest tests -q --ignore=tests/browser --durations=15 \
	  $(if $(filter 0,$(UNIT_WORKERS)),,-n $(UNIT_WORKERS) --dist loadfile --no-loadscope-reorder)

# Notebooks run two at a time, each whole on one worker (--dist loadfile: a notebook's cells share
# one kernel, in order). A timing lesson then runs beside another one: its verdicts weigh their
# repeats' spread and say CANNOT DECIDE HERE rather than fail on a busy machine, and they were
# checked under heavier load (two spinning processes and two memory streams beside them).
# NOTEBOOK_WORKERS=0: one at a time.
NOTEBOOK_WORKERS ?= 2
notebook-test: setup-dev
	@$(compile_sources)
	INFERENCE_LAB_PROGRESS=0 $(PY) -m pytest notebooks $(NBVAL_FLAGS) -q \
	  $(if $(filter 0,$(NOTEBOOK_WORKERS)),,-n $(NOTEBOOK_WORKERS) --dist loadfile)

# In CI, Debian's Chromium is installed when missing; on a learner's machine system
# packages are never installed: the browser tests skip and say what to install.
chromium:
	@if [ -n "$${CI:-}" ] && ! command -v chromium >/dev/null 2>&1; then \
	  echo "CI: installing Debian's chromium for the browser tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	fi

browser-test: setup-dev chromium
	@$(compile_sources)
	$(PY) -m pytest tests/browser -q -rs

# Before running: nbval markers become cell tags (scripts/nbval_tags.py). While running: no
# progress bars (they would be stored as stale widgets). After: every widget's state is stored
# in the notebook's metadata, so `make site` shows the widget views as they were left.
notebooks: setup
	@$(compile_sources)
	$(PY) scripts/nbval_tags.py notebooks/*.ipynb
	INFERENCE_LAB_PROGRESS=0 $(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace \
	  --ExecutePreprocessor.timeout=1200 --ExecutePreprocessor.store_widget_state=True \
	  notebooks/*.ipynb
	# A streamed answer prints one piece per token: store it as one block of text, not hundreds.
	$(VENV)/bin/jupyter nbconvert --to notebook --inplace --CoalesceStreamsPreprocessor.enabled=True notebooks/*.ipynb

# The stored notebooks as HTML (nothing is executed, and the pages load nothing from elsewhere):
# open $(SITE)/index.html. It needs nbconvert and BeautifulSoup only: with no lab environment
# set up yet, they go into a small one of their own (.venv-site, ~65 MB, ~15 s), pinned by
# constraints.txt, so reading the course never installs jax.
SITE_VENV  := .venv-site
SITE_STAMP := $(SITE_VENV)/.installed
SITE_PY    := $(if $(wildcard $(VENV)/.installed-*),$(PY),$(SITE_VENV)/bin/python)
site: check-python $(if $(wildcard $(VENV)/.installed-*),,$(SITE_STAMP))
	$(SITE_PY) scripts/build_site.py --out $(SITE)

$(SITE_STAMP): constraints.txt
	@py=$$(scripts/find_python.sh); rm -rf $(SITE_VENV); "$$py" -m venv $(SITE_VENV)
	@echo "installing nbconvert and beautifulsoup4 (pinned by constraints.txt) into $(SITE_VENV) for the site..."
	@$(SITE_VENV)/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt nbconvert beautifulsoup4
	@touch $@

# The GPU image's own python3 (jax + flax, nothing installable): no venv, PYTHONPATH=.
gpu-check:
	PYTHONPATH=. bash scripts/gpu_check.sh

bench: setup
	$(PY) -m pallas_kernels.bench

probe: setup
	$(PY) -m inference_lab probe

# Every kernel the model launches (base and llama3_8b, prefill and decode, batch 1 and 64) and the
# benchmark's shapes, compiled by Triton for Hopper and Ampere on this machine: grid, warps, stages,
# shared memory, registers, spills. About 3 minutes on 2 cores; no GPU needed (docs/benchmarks.md).
triton-report: setup-dev
	@mkdir -p test-artifacts
	$(PY) -m inference_lab.triton_report --target all --json test-artifacts/triton-report.json

clean:
	rm -rf $(VENV) $(SITE_VENV) .cache .pytest_cache test-artifacts $(SITE)
