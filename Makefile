# Set-up and checks for clconv. `make test` and `make demo` install what is missing first.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
APT_PACKAGES := libclblast-dev ocl-icd-opencl-dev opencl-headers clinfo
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup system venv demo test clean

setup: system venv

# Debian packages: CLBlast (pyclblast builds against it), the OpenCL loader and headers, clinfo.
system:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:" $$missing; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $$missing; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml | system
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[pocl,test]'
	touch $@

demo: setup
	$(PY) -m clconv.demo

test: setup
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) build dist *.egg-info
