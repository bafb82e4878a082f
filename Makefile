# Set-up and checks for clconv. `make test` and `make demo` install what is missing first.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
APT_PACKAGES := libclblast-dev ocl-icd-opencl-dev opencl-headers clinfo oclgrind mesa-opencl-icd pocl-opencl-icd clang-15
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup system venv vendors demo test pytest check-kernels docs clean

setup: system venv

# Debian packages: CLBlast (pyclblast builds against it), the OpenCL loader and headers, clinfo,
# Oclgrind (an OpenCL simulator that checks every memory access) for check-kernels, and Mesa's
# OpenCL (rusticl; RUSTICL_ENABLE=llvmpipe shows its CPU device), whose compiler path (clang to
# SPIR-V to NIR) is the one rusticl takes for AMD and Intel GPUs: a third runtime for the tests.
system:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:" $$missing; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $$missing; \
	fi

venv: $(VENV)/.installed vendors

# Intel's CPU OpenCL runtime (the `intel` extra) ships an .icd file holding a placeholder path:
# its library is registered in a vendors folder of the environment, beside copies of the
# system's own .icd files, and clconv points the ICD loader there on import unless
# OCL_ICD_VENDORS is set (clconv/device.py). PoCL from pyopencl is found either way.
ICD_DIR := $(VENV)/etc/OpenCL/clconv-vendors

$(VENV)/.installed: setup.cfg pyproject.toml | system
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[pocl,intel,test,plot,bench,examples,mpi]'
	touch $@

# made anew on every run: a system driver installed after the environment (rusticl) is registered too
vendors: $(VENV)/.installed
	@rm -rf $(ICD_DIR) && mkdir -p $(ICD_DIR)
	@for f in /etc/OpenCL/vendors/*.icd; do [ -f "$$f" ] && cp "$$f" $(ICD_DIR)/ || true; done
	@if [ -f $(VENV)/lib/libintelocl.so ]; then echo $(abspath $(VENV))/lib/libintelocl.so > $(ICD_DIR)/intel-cpu.icd; fi

# rusticl shows its CPU device only when asked (RUSTICL_ENABLE); it is not the default device either way
export RUSTICL_ENABLE ?= llvmpipe

demo: setup
	$(PY) -m clconv.demo

# One job per device side by side, and each Oclgrind sweep as another. Each is mostly one busy
# thread (the runtimes' kernel builds, single-threaded; Oclgrind's simulation), so on two cores
# the jobs keep both busy to the end (devices in turn left one core idle while the last ran on:
# 39-44 minutes cold; the two sweeps one after the other, the second ran alone for 2-5 minutes
# after the pytest jobs). -k: every job runs to its end whatever another's outcome; any failure
# fails the target.
# A job skipped (below) says so again after all of them.
test: setup
	@rm -f $(SKIPPED); status=0; \
	$(MAKE) --no-print-directory -k -j$(words $(OCLGRIND_JOBS) $(TEST_DEVICES)) $(OCLGRIND_JOBS) $(PYTEST_JOBS) \
	  || status=$$?; if [ -f $(SKIPPED) ]; then cat $(SKIPPED); fi; exit $$status

# The suite on each device of TEST_DEVICES: the three CPU runtimes, PoCL, Intel's and Mesa's
# rusticl (llvmpipe, with the compiler path rusticl takes for AMD and Intel GPUs), or the one
# CLCONV_DEVICE names (a GPU, say), each as a job of its own (pytest-1, pytest-2, ...: a device's
# own name, such as 0:1, could not name a make target).
# Two kinds of tests run on one device only: those marked whole_program (end-to-end runs: the
# command line, benchmarks, training, MPI ranks), whose kernels the other tests check one by one
# on every device, and those marked clblast (CLBlast's own kernels, for an engine no device takes
# unless asked). That device is Intel's runtime where listed, which builds kernels fastest (the
# whole_program tests took 1:36 cold there, 1:58 on PoCL, 13 minutes on rusticl), else the first.
# Those marked gpu_form (the kernels' GPU forms, in plans made for a GPU: each shape its own
# builds) run on Intel's runtime and rusticl, the compiler path rusticl takes for GPUs, where
# listed (else on the first device), and on a GPU named by CLCONV_DEVICE; not on PoCL beside
# them, where they took 8 of the suite's 20 minutes cold.
# Each run lists its ten slowest tests (where the suite's time goes: make test must stay within
# 30 minutes cold); its output is shown when it ends, not interleaved with the others'. With
# PoCL, the spread tests run once more over two root PoCL devices (POCL_DEVICES), which a process
# only gets if PoCL is told before it loads.
TEST_DEVICES ?= $(or $(CLCONV_DEVICE),pocl intel rusticl)
PYTEST_JOBS := $(addprefix pytest-,$(shell seq $(words $(TEST_DEVICES))))
.PHONY: $(PYTEST_JOBS)
ONCE_DEVICE := $(if $(filter intel,$(TEST_DEVICES)),intel,$(firstword $(TEST_DEVICES)))
GPU_FORM_DEVICES := $(or $(filter intel rusticl,$(TEST_DEVICES)),$(firstword $(TEST_DEVICES)))
LOGS := build/pytest
# the -m selection of device $$d (empty: every test)
SELECT = m=; [ $$d = $(ONCE_DEVICE) ] || m="not whole_program and not clblast"; \
	case " $(GPU_FORM_DEVICES) " in *" $$d "*) ;; *) m="$${m:+$$m and }not gpu_form";; esac

pytest: $(PYTEST_JOBS)

# Where no PoCL builds kernels (PyPI's PoCL on a CPU newer than its LLVM, and no other PoCL),
# the PoCL job is skipped, saying why when it starts and after all jobs (python -m clconv probe
# exits 1 there; 2, no PoCL at all, fails the job: the set-up installs two).
SKIPPED := $(LOGS)/skipped
$(PYTEST_JOBS): pytest-%: setup
	@mkdir -p $(LOGS); status=0; d='$(word $*,$(TEST_DEVICES))'; log=$(LOGS)/$$d.log; $(SELECT); \
	if [ $$d = pocl ]; then probe=$$(CLCONV_DEVICE=pocl $(PY) -m clconv probe 2>/dev/null) || [ $$? != 1 ] || { \
	  line="pytest on CLCONV_DEVICE=pocl SKIPPED: no PoCL here builds kernels: $$probe"; \
	  echo "$$line"; echo "$$line" >> $(SKIPPED); exit 0; }; fi; \
	CLCONV_DEVICE=$$d $(PY) -m pytest -q --durations=10 $${m:+-m "$$m"} tests > $$log 2>&1 || status=1; \
	if [ $$d = pocl ]; then echo "pytest tests/test_spread.py on two root PoCL devices" >> $$log; \
	  POCL_DEVICES="pthread pthread" CLCONV_DEVICE=pocl $(PY) -m pytest -q tests/test_spread.py >> $$log 2>&1 || status=1; fi; \
	echo "pytest on CLCONV_DEVICE=$$d, $${m:-all tests}"; cat $$log; exit $$status

# Every kernel and algorithm under Oclgrind; fails unless its log stays empty. At a lower
# priority (nice): beside make test's pytest jobs, which are its longest, the sweeps take what
# they leave. Two sweeps, each a job: clblast, with CLBlast, data races and out-of-bounds
# accesses; host-gemm, GEMMs on the host (see tests/oclgrind_sweep.py for why), plus
# uninitialised-memory tracking. The known-answer check is off in both: the sweep checks every
# result itself, on the kernels Oclgrind simulates.
OCLGRIND_DIR := build/oclgrind
OCLGRIND_JOBS := oclgrind-clblast oclgrind-host-gemm
.PHONY: $(OCLGRIND_JOBS)
check-kernels: $(OCLGRIND_JOBS)

$(OCLGRIND_DIR)/oclgrind.icd:
	@mkdir -p $(OCLGRIND_DIR) && echo /usr/lib/oclgrind/liboclgrind-rt-icd.so > $@

$(OCLGRIND_JOBS): oclgrind-%: setup $(OCLGRIND_DIR)/oclgrind.icd
	@mode=$*; log=$(OCLGRIND_DIR)/$$mode.log; rm -f $$log; \
	if [ $$mode = host-gemm ]; then checks="OCLGRIND_UNINITIALIZED=1"; args=--host-gemm; else checks=; args=; fi; \
	nice -n 10 env OCL_ICD_VENDORS=$(CURDIR)/$(OCLGRIND_DIR) CLCONV_DEVICE=oclgrind OCLGRIND_LOG=$$log CLCONV_SELFCHECK=0 \
	    OCLGRIND_DATA_RACES=1 $$checks $(PY) tests/oclgrind_sweep.py $$args > $(OCLGRIND_DIR)/$$mode.out \
	  || { echo "Oclgrind sweep ($$mode) failed:"; cat $(OCLGRIND_DIR)/$$mode.out; exit 1; }; \
	if [ -s $$log ]; then echo "Oclgrind sweep ($$mode) reported problems ($$log):"; head -60 $$log; exit 1; fi; \
	echo "Oclgrind sweep ($$mode): $$(grep -c ' ok' $(OCLGRIND_DIR)/$$mode.out) results match the reference; Oclgrind log empty"

# The documentation site into build/docs: the docs extra into the environment (not part of setup,
# so make test does not install it), the performance pages and charts from bench/results, then
# Sphinx with warnings as errors (-n: every reference must resolve). Needs no OpenCL device.
docs: $(VENV)/.docs-installed
	$(PY) docs/generate.py
	$(PY) -m sphinx -W --keep-going -n -q -b html docs build/docs
	@echo "documentation in build/docs/index.html"

$(VENV)/.docs-installed: setup.cfg pyproject.toml | system
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[docs]'
	touch $@

clean:
	rm -rf $(VENV) build dist *.egg-info
