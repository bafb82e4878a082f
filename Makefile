# Set-up and checks for clconv. `make test` and `make demo` install what is missing first.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
APT_PACKAGES := libclblast-dev ocl-icd-opencl-dev opencl-headers clinfo oclgrind mesa-opencl-icd
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup system venv vendors demo test pytest pytest-first pytest-others check-kernels clean

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

# Three jobs side by side: the Oclgrind sweeps, the suite on the first device and the suites on
# the others. Each is mostly one busy thread (Oclgrind's simulation; the runtimes' kernel builds,
# single-threaded), so on two cores the jobs share what one of them alone leaves idle. -k: every
# job runs to its end whatever another's outcome; any failure fails the target.
test: setup
	@$(MAKE) --no-print-directory -k -j3 check-kernels pytest-first pytest-others

# The suite on each device of TEST_DEVICES: the three CPU runtimes, PoCL, Intel's and Mesa's
# rusticl (llvmpipe, with the compiler path rusticl takes for AMD and Intel GPUs), or the one
# CLCONV_DEVICE names (a GPU, say): the first device as one job, the others in turn as another.
# Two kinds of tests run on one device only: those marked whole_program (end-to-end runs: the
# command line, benchmarks, training, MPI ranks), whose kernels the other tests check one by one
# on every device, and those marked clblast (CLBlast's own kernels, for an engine no device takes
# unless asked). That device is Intel's runtime where listed, which builds kernels fastest (the
# whole_program tests took 1:36 cold there, 1:58 on PoCL, 13 minutes on rusticl), else the first.
# Each run lists its ten slowest tests (where the suite's time goes: make test must stay within
# 30 minutes cold); its output is shown when it ends, not interleaved with the others'. With
# PoCL, the spread tests run once more over two root PoCL devices (POCL_DEVICES), which a process
# only gets if PoCL is told before it loads.
TEST_DEVICES ?= $(or $(CLCONV_DEVICE),pocl intel rusticl)
FIRST_DEVICE := $(firstword $(TEST_DEVICES))
OTHER_DEVICES := $(wordlist 2,$(words $(TEST_DEVICES)),$(TEST_DEVICES))
ONCE_DEVICE := $(if $(filter intel,$(TEST_DEVICES)),intel,$(FIRST_DEVICE))
LOGS := build/pytest
# the -m selection of device $$d (empty: every test)
SELECT = m=; [ $$d = $(ONCE_DEVICE) ] || m="not whole_program and not clblast"

pytest: pytest-first pytest-others

pytest-first: setup
	@mkdir -p $(LOGS); status=0; d=$(FIRST_DEVICE); log=$(LOGS)/$$d.log; $(SELECT); \
	CLCONV_DEVICE=$$d $(PY) -m pytest -q --durations=10 $${m:+-m "$$m"} tests > $$log 2>&1 || status=1; \
	if [ $(FIRST_DEVICE) = pocl ]; then echo "pytest tests/test_spread.py on two root PoCL devices" >> $$log; \
	  POCL_DEVICES="pthread pthread" CLCONV_DEVICE=pocl $(PY) -m pytest -q tests/test_spread.py >> $$log 2>&1 || status=1; fi; \
	echo "pytest on CLCONV_DEVICE=$$d, $${m:-all tests}"; cat $$log; exit $$status

pytest-others: setup
	@mkdir -p $(LOGS); status=0; for d in $(OTHER_DEVICES); do log=$(LOGS)/$$d.log; $(SELECT); \
	  CLCONV_DEVICE=$$d $(PY) -m pytest -q --durations=10 $${m:+-m "$$m"} tests > $$log 2>&1 || status=1; \
	  echo "pytest on CLCONV_DEVICE=$$d, $${m:-all tests}"; cat $$log; \
	done; exit $$status

# Every kernel and algorithm under Oclgrind; fails unless its log stays empty. At a lower
# priority (nice): beside make test's pytest jobs, which are its longest, it ends well within them.
# Run 1: with CLBlast, data races and out-of-bounds accesses. Run 2: GEMMs on the host
# (see tests/oclgrind_sweep.py for why), plus uninitialised-memory tracking. The known-answer
# check is off there: the sweep checks every result itself, on the kernels Oclgrind simulates.
OCLGRIND_DIR := build/oclgrind
check-kernels: setup
	@mkdir -p $(OCLGRIND_DIR) && echo /usr/lib/oclgrind/liboclgrind-rt-icd.so > $(OCLGRIND_DIR)/oclgrind.icd
	@set -e; for mode in clblast host-gemm; do \
	  log=$(OCLGRIND_DIR)/$$mode.log; rm -f $$log; \
	  if [ $$mode = host-gemm ]; then checks="OCLGRIND_UNINITIALIZED=1"; args=--host-gemm; else checks=; args=; fi; \
	  echo "Oclgrind sweep ($$mode)"; \
	  nice -n 10 env OCL_ICD_VENDORS=$(CURDIR)/$(OCLGRIND_DIR) CLCONV_DEVICE=oclgrind OCLGRIND_LOG=$$log CLCONV_SELFCHECK=0 \
	      OCLGRIND_DATA_RACES=1 $$checks $(PY) tests/oclgrind_sweep.py $$args > $(OCLGRIND_DIR)/$$mode.out \
	    || { cat $(OCLGRIND_DIR)/$$mode.out; exit 1; }; \
	  if [ -s $$log ]; then echo "Oclgrind reported problems ($$log):"; head -60 $$log; exit 1; fi; \
	  echo "  $$(grep -c ' ok' $(OCLGRIND_DIR)/$$mode.out) results match the reference; Oclgrind log empty"; \
	done

clean:
	rm -rf $(VENV) build dist *.egg-info
