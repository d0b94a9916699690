# shardfs — two commands on a fresh Debian machine: `make demo` and `make test`.
# Both install what they need: Debian packages (as root, or through sudo) and a venv.

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
APT_PACKAGES := libcmph-dev libfuse3-dev fuse3 pkg-config gcc make python3-venv python3-dev rsync fio
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
CFLAGS_C := -O2 -g -std=gnu11 -Wall -Wextra -Wno-unused-parameter $(shell pkg-config --cflags cmph 2>/dev/null)
LIBS_C := $(shell pkg-config --libs cmph 2>/dev/null || echo -lcmph)
C_SOURCES := shardfs/c/shard.c shardfs/c/chd.c shardfs/c/writer.c shardfs/c/sidecar.c
C_HEADERS := shardfs/c/shard.h shardfs/c/chd.h shardfs/c/internal.h shardfs/c/sidecar.h

.PHONY: all deps apt venv demo test test-c test-py bench bench-full clean

all: venv

# Debian packages: installed only when one is missing.
apt:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

$(VENV)/.stamp: setup.py pyproject.toml $(C_SOURCES) shardfs/c/module.c $(C_HEADERS)
	@[ -x $(PY) ] || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test]'
	@touch $@

venv: apt $(VENV)/.stamp

deps: venv

tests/c/test_shard: tests/c/test_shard.c tests/c/check.h $(C_SOURCES) $(C_HEADERS)
	gcc $(CFLAGS_C) -Ishardfs/c -o $@ tests/c/test_shard.c $(C_SOURCES) $(LIBS_C) -lpthread

tests/c/test_sidecar: tests/c/test_sidecar.c tests/c/check.h $(C_SOURCES) $(C_HEADERS)
	gcc $(CFLAGS_C) -Ishardfs/c -o $@ tests/c/test_sidecar.c $(C_SOURCES) $(LIBS_C) -lpthread

test-c: apt tests/c/test_shard tests/c/test_sidecar
	./tests/c/test_shard
	./tests/c/test_sidecar

test-py: venv
	$(PY) -m pytest -q tests

test: test-c test-py

demo: venv
	PATH="$(abspath $(VENV))/bin:$$PATH" bash scripts/demo.sh

# Benchmarks: figures and plots under bench/results/, summed up in
# bench/results/README.md. `make bench` takes under 5 minutes; bench-full
# builds datasets up to millions of objects (check bench/*.py --help).
BENCH_RUN = mkdir -p bench/results && \
	$(PIP) install -q -e '.[test,bench]' && \
	set -o pipefail && \
	$(PY) bench/build_bench.py $(1) | tee bench/results/build.log && \
	$(PY) bench/lookup_bench.py $(1) | tee bench/results/lookup.log && \
	$(PY) bench/fio_bench.py $(1) | tee bench/results/fio.log && \
	{ grep -h -E "PASS|MISS" bench/results/build.log bench/results/lookup.log bench/results/fio.log > bench/results/goals.txt || true; } && \
	$(PY) bench/report.py

bench: venv
	$(call BENCH_RUN,--quick)

bench-full: venv
	$(call BENCH_RUN,--full)

# Scale: 1,000 shards vs 1, mount start time, daemon memory (bench/scale_bench.py;
# ARGS=--quick for about 3 minutes, default 10M objects).
.PHONY: bench-scale
bench-scale: venv
	mkdir -p bench/results && set -o pipefail && \
	$(PY) bench/scale_bench.py $(ARGS) | tee bench/results/scale.log

clean:
	rm -rf build *.egg-info tests/c/test_shard tests/c/test_sidecar shardfs/*.so
