# The course's commands. `make lab` to teach and learn, `make test` to check everything.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
NB     ?= $(wildcard notebooks/*.ipynb) $(wildcard solutions/*.ipynb)
# JupyterLab refuses to run as root (containers, CI) without this flag.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup browser lab test execute labs headers figures bench site grade leaderboard clean

# The environment: created once, refreshed when pyproject.toml changes. torch is pinned here only.
# Which torch build: a wheel already on this machine's pip paths first (no download); else, on a machine
# without an NVIDIA driver (no nvidia-smi), PyTorch's CPU build from its CPU index (about a tenth of the
# CUDA build's size); else PyPI's default (CUDA) build. TORCH_BUILD=cpu or TORCH_BUILD=cuda overrides.
TORCH_VERSION ?= 2.13.0
TORCH_BUILD   ?= $(if $(shell command -v nvidia-smi 2>/dev/null),cuda,cpu)
TORCH_INDEX   := $(if $(filter cpu,$(TORCH_BUILD)),--index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple,)
PIP           := $(PY) -m pip install --disable-pip-version-check --progress-bar on
# Students get the lessons and JupyterLab (extra "lab"); `make test`, `make site` and `make grade` add the
# authors' tools (extra "dev": tests, site builder, browser driver, linter).
$(VENV)/.torch:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "== torch $(TORCH_VERSION) ($(TORCH_BUILD) build; TORCH_BUILD=cpu|cuda to choose) =="
	{ $(PIP) --no-index --no-deps torch==$(TORCH_VERSION) 2>/dev/null && $(PIP) torch==$(TORCH_VERSION); } \
	    || $(PIP) torch==$(TORCH_VERSION) $(TORCH_INDEX)
	touch $@

$(VENV)/.installed-lab: pyproject.toml $(VENV)/.torch
	@echo "== the course and JupyterLab =="
	$(PIP) -e ".[lab]"
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.installed-lab
	@echo "== the authors' tools: tests, site, browser driver =="
	$(PIP) -e ".[dev]"
	touch $@

# The grader's sandbox is Debian's bubblewrap: installed when missing and when this runs as root with
# apt-get; otherwise `make grade` runs without it and says so (and STRICT=1 refuses to grade).
setup: $(VENV)/.installed
	@if ! command -v bwrap >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; } \
	    || echo "bubblewrap could not be installed: make grade will run without a sandbox"; \
	fi

# JupyterLab as students meet it: no news pop-up, no update check (the course's venv only).
LAB_QUIET := --LabApp.news_url=None --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate
# The address JupyterLab prints (and opens) is lesson 0 itself, not the Launcher.
lab: $(VENV)/.installed-lab  ## open the course in JupyterLab (LAB_ARGS=... passes options, e.g. --no-browser --port=8899)
	$(VENV)/bin/jupyter labextension disable --level=sys_prefix "@jupyterlab/apputils-extension:announcements" >/dev/null
	$(VENV)/bin/jupyter lab --notebook-dir=. $(ROOT_FLAG) $(LAB_QUIET) \
	    --LabApp.default_url=/lab/tree/notebooks/00_setup.ipynb $(LAB_ARGS)

# The browser test drives Debian's chromium (never a downloaded browser): installed when missing and
# when this runs as root with apt-get; otherwise that one test is skipped and says why.
browser:
	@if ! command -v chromium >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	    || echo "chromium could not be installed: the browser test will be skipped"; \
	fi

test: setup browser  ## package tests, nbval on notebooks/ and solutions/, labs executed, labs up to date
	$(VENV)/bin/ruff check .
	$(PY) -m pytest --nbval -n 2 --dist loadfile --no-loadscope-reorder tests notebooks solutions

execute: setup  ## run notebooks (NB=...) and store their outputs, then regenerate the labs
	$(PY) -m attnkit.classroom.notebooks execute $(NB)
	$(PY) -m attnkit.classroom.labgen

labs: setup  ## generate labs/ from solutions/ (FORCE=1 overwrites edited labs, keeping each as <lab>.bak-<time>)
	$(PY) -m attnkit.classroom.labgen $(if $(FORCE),--force,)

headers: setup  ## rewrite titles, badges, objectives, setup cells, questions and nbval tags from attnkit/classroom/course.py
	$(PY) -m attnkit.classroom.notebooks headers

figures: setup  ## redraw the diagrams in figures/
	$(PY) -m attnkit.classroom.figures

bench: setup  ## GPU only: measure the kernels, write CSVs to attnkit/bench/results/
	$(PY) -m attnkit.bench.suites

site: setup  ## the course as a static website in site/_build/html, from stored outputs (SITE_ARGS=--no-solutions)
	$(PY) -m attnkit.classroom.site $(SITE_ARGS)

grade: setup  ## grade students' labs: make grade LAB=01 NOTEBOOK="a.ipynb b.ipynb" [GRADES=build/grades] [STRICT=1 (also refuses to grade without bubblewrap)] [TIMEOUT=600 (s per cell)] [NOTEBOOK_TIMEOUT=1800] [MEMORY=4096 (MiB per process tree)]
	@test -n "$(LAB)" -a -n "$(NOTEBOOK)" || { echo "usage: make grade LAB=01 NOTEBOOK=path/to/student_lab.ipynb"; exit 2; }
	$(PY) -m attnkit.classroom.grading --lab "$(LAB)" --out "$(or $(GRADES),build/grades)" $(if $(STRICT),--strict --require-sandbox,) \
	    $(if $(TIMEOUT),--timeout $(TIMEOUT),) $(if $(NOTEBOOK_TIMEOUT),--notebook-timeout $(NOTEBOOK_TIMEOUT),) \
	    $(if $(MEMORY),--memory $(MEMORY),) $(NOTEBOOK)

# The kernel leaderboard (GPU only): the notebooks are graded as `make grade` grades them; each kernel of labs
# 04, 05, 06 and 08 that passes every check is timed beside the course's kernel and cuDNN's (PyTorch's op for
# lab 04) in a worker of the grader; a timing is never part of a grade. Each notebook's lab comes from its file
# name (labNN_...) unless LAB is given. Output: $(OUT) (default build/leaderboard).
leaderboard: setup  ## GPU only: time the passing kernels of labs 04/05/06/08 against the course's and cuDNN's: make leaderboard NOTEBOOK="a.ipynb b.ipynb" [LAB=05] [OUT=build/leaderboard] [REPEATS=5] [JOBS=N] (never a grade)
	@test -n "$(NOTEBOOK)" || { echo "usage: make leaderboard NOTEBOOK=\"solutions/lab05_flash_attention.ipynb subs/*/lab05*.ipynb\" [LAB=05] [OUT=dir]"; exit 2; }
	$(PY) -m attnkit.classroom.grading leaderboard --out "$(or $(OUT),build/leaderboard)" $(if $(LAB),--lab "$(LAB)",) \
	    $(if $(REPEATS),--repeats $(REPEATS),) $(if $(JOBS),--jobs $(JOBS),) $(NOTEBOOK)

clean:
	rm -rf $(VENV) build *.egg-info
