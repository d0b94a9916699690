# shardfs — two commands on a fresh Debian machine: `make demo` and `make test`.
# Both install what they need: Debian packages (as root, or through sudo) and a venv.
# Deeper checks (tests/fuzz/README.md): `make test-asan`, `make test-valgrind`,
# `make fuzz` (FUZZ_SECONDS per harness) and `make fuzz-ci` (about a minute).

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
APT_PACKAGES := git libcmph-dev libssl-dev libfuse3-dev fuse3 pkg-config gcc make python3-venv python3-dev rsync fio \
	clang libclang-rt-dev llvm valgrind squashfuse squashfs-tools erofs-utils time \
	postgresql libpq-dev libsystemd-dev ceph-mon ceph-osd ceph-common rbd-fuse librbd-dev libzstd-dev zlib1g-dev \
	libcurl4-openssl-dev radosgw
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
CFLAGS_C := -O2 -g -std=gnu11 -Wall -Wextra -Wno-unused-parameter $(shell pkg-config --cflags cmph 2>/dev/null)
LIBS_C := $(shell pkg-config --libs cmph 2>/dev/null || echo -lcmph) \
	$(shell pkg-config --libs libcrypto 2>/dev/null || echo -lcrypto) -lzstd -lz -ldl
# The test oracle of the MOSAIC perfect hash (shardfs/c/ph/: Rust, the ph
# crate itself) needs cargo >= 1.78, as on the machines CI runs on.
CARGO ?= $(shell command -v cargo || echo $(HOME)/.cargo/bin/cargo)
C_SOURCES := shardfs/c/shard.c shardfs/c/chd.c shardfs/c/chd_build.c shardfs/c/writer.c shardfs/c/sidecar.c shardfs/c/output.c \
	shardfs/c/gindex.c shardfs/c/guard.c shardfs/c/ll_names.c shardfs/c/hashindex.c shardfs/c/rbd.c \
	shardfs/c/kind_file.c shardfs/c/kind_rbd.c shardfs/c/kind_mosaic.c shardfs/c/remote_copy.c shardfs/c/s3.c shardfs/c/kind_s3.c shardfs/c/mosaic.c shardfs/c/gof.c \
	shardfs/c/lookup_pack.c shardfs/c/probe.c
# The Python binding (setup.py): module.c, one py_*.c per type, py_module.h.
PY_C_SOURCES := shardfs/c/module.c $(wildcard shardfs/c/py_*.c) shardfs/c/py_module.h shardfs/c/ll.h \
	shardfs/c/ll_fast.c shardfs/c/ll_snapshot.c shardfs/c/ll_snapshot.h shardfs/c/ll_resolve.c shardfs/c/ll_resolve.h \
	shardfs/c/ll_guarded.h shardfs/c/ll_ahead.c shardfs/c/ll_ahead.h shardfs/c/ll_pool.c shardfs/c/ll_pool.h
C_HEADERS := shardfs/c/shard.h shardfs/c/chd.h shardfs/c/internal.h shardfs/c/sidecar.h shardfs/c/guard.h \
	shardfs/c/gindex.h shardfs/c/ll_names.h shardfs/c/hashindex.h shardfs/c/rbd.h shardfs/c/kind.h \
	shardfs/c/mosaic.h shardfs/c/ph.h shardfs/c/remote_copy.h shardfs/c/s3.h shardfs/c/lookup_pack.h shardfs/c/probe.h

.PHONY: all deps apt venv demo test test-quick test-c test-ph test-py bench bench-full clean \
	test-asan test-tsan test-valgrind fuzz fuzz-ci fuzz-build fuzz-replay fuzz-coverage

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

$(VENV)/.stamp: setup.py pyproject.toml $(C_SOURCES) $(PY_C_SOURCES) $(C_HEADERS)
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

tests/c/test_gindex: tests/c/test_gindex.c tests/c/check.h $(C_SOURCES) $(C_HEADERS)
	gcc $(CFLAGS_C) -Ishardfs/c -o $@ tests/c/test_gindex.c $(C_SOURCES) $(LIBS_C) -lpthread

tests/c/test_chd_build: tests/c/test_chd_build.c tests/c/check.h $(C_SOURCES) $(C_HEADERS)
	gcc $(CFLAGS_C) -Ishardfs/c -o $@ tests/c/test_chd_build.c $(C_SOURCES) $(LIBS_C) -lpthread

tests/c/test_ll_names: tests/c/test_ll_names.c tests/c/check.h $(C_SOURCES) $(C_HEADERS)
	gcc $(CFLAGS_C) -Ishardfs/c -o $@ tests/c/test_ll_names.c $(C_SOURCES) $(LIBS_C) -lpthread

tests/c/test_hashindex: tests/c/test_hashindex.c tests/c/check.h $(C_SOURCES) $(C_HEADERS)
	gcc $(CFLAGS_C) -Ishardfs/c -o $@ tests/c/test_hashindex.c $(C_SOURCES) $(LIBS_C) -lpthread

tests/c/test_mosaic: tests/c/test_mosaic.c tests/c/check.h $(C_SOURCES) $(C_HEADERS)
	gcc $(CFLAGS_C) -Ishardfs/c -o $@ tests/c/test_mosaic.c $(C_SOURCES) $(LIBS_C) -lpthread

tests/c/test_ph: tests/c/test_ph.c shardfs/c/gof.c shardfs/c/ph.h
	gcc $(CFLAGS_C) -Ishardfs/c -o $@ tests/c/test_ph.c shardfs/c/gof.c -lpthread

# The C perfect hash of MOSAIC indexes (gof.c) against the ph crate itself:
# the oracle (shardfs/c/ph/, cargo) writes functions, keys and ph's answers.
test-ph: tests/c/test_ph
	$(CARGO) test -q --release --manifest-path shardfs/c/ph/Cargo.toml
	./tests/c/test_ph

test-c: apt venv tests/c/test_shard tests/c/test_sidecar tests/c/test_gindex tests/c/test_chd_build \
		tests/c/test_ll_names tests/c/test_hashindex tests/c/test_mosaic test-ph
	MOSAIC_PYTHON=$(PY) ./tests/c/test_mosaic
	./tests/c/test_hashindex
	./tests/c/test_shard
	./tests/c/test_sidecar
	./tests/c/test_gindex
	./tests/c/test_chd_build
	./tests/c/test_ll_names

# The suites that mount run twice: with the default worker count, then with
# one worker per mount (SHARDFS_WORKERS=1: workers=1 must keep working; the
# 60-s stress tests are shortened to 20 s there).
MOUNT_TESTS := tests/test_fuse.py tests/test_mount_scale.py tests/test_workers.py tests/test_hardening.py \
	tests/test_winery.py tests/test_open_bound.py

test-py: venv
	$(PY) -m pytest -q tests
	SHARDFS_WORKERS=1 SHARDFS_STRESS_SECONDS=20 $(PY) -m pytest -q $(MOUNT_TESTS)

# `make test`: everything a change must pass (tests/fuzz/README.md): the C and
# Python tests, the same under ASan+UBSan, ThreadSanitizer and valgrind, and
# a short fuzzing run that first replays every input that ever crashed.
# `make test-quick`: the C and Python tests only.
test: test-c test-py test-asan test-tsan test-valgrind fuzz-ci

test-quick: test-c test-py

demo: venv
	PATH="$(abspath $(VENV))/bin:$$PATH" bash scripts/demo.sh

# Benchmarks: bench/bench_NAME.py on the shared harness (bench/harness.py),
# each writing bench/results/NAME.md and .json (every run) and plots, then
# bench/results/README.md with every goal line. `make bench`: the quick set
# (small datasets, one round; about 10 minutes); `make bench-full`: the full
# set that the committed results come from (about an hour). One benchmark:
# `make bench-full BENCHES=mount`, with its own options in ARGS (see
# `bench/bench_NAME.py --help`; e.g. ARGS=--before-venv=DIR for mount).
BENCHES ?= build lookup mount shards failover winery winery_mosaic hashes ceph mosaic s3 profile
bench bench-full: venv
	$(PIP) install -q -e '.[test,bench]'
	mkdir -p bench/results
	@failed=""; for b in $(BENCHES); do \
	  echo "== bench/bench_$$b.py"; \
	  $(PY) bench/bench_$$b.py $(if $(filter bench,$@),--quick) $(ARGS) 2>&1 | tee bench/results/$$b.log; \
	  [ "$${PIPESTATUS[0]}" = 0 ] || failed="$$failed $$b"; \
	done; \
	$(PY) -c 'import sys; sys.path.insert(0, "bench"); import harness; harness.report()'; \
	if [ -n "$$failed" ]; then echo "benchmarks that failed:$$failed (see bench/results/NAME.log)"; exit 1; fi

# ---------------------------------------------------------------- sanitizers
# test-asan: the C tests and the fuzz regressions and seeds built with gcc's
# AddressSanitizer + UBSan (leak check on), then the Python tests against a
# sanitized build of the extension in build/asan/py (a copy of the package:
# the editable install in $(VENV) is not touched), libasan and libubsan
# preloaded into the stock python3, leaks off there (CPython keeps memory
# until exit by design).
SAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
SAN_DIR := build/asan
SAN_ENV := UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
SAN_PY_TESTS ?= tests/test_api.py tests/test_bad_input.py tests/test_sidecar.py tests/test_sigbus_guard.py \
	tests/test_gindex.py tests/test_open_shards.py tests/test_interop.py tests/test_cli.py tests/test_fuse.py \
	tests/test_hashes.py tests/test_ceph.py tests/test_workers.py tests/test_slow_device.py tests/test_mount_scale.py \
	tests/test_mosaic.py tests/test_open_bound.py tests/test_lookups.py
# swh's winery setup runs psql, which hangs with the sanitizer runtime preloaded.
SAN_PY_DESELECT := --deselect tests/test_ceph.py::test_a_winery_mount_reads_its_rbd_pool_through_librbd
FUZZ_DIR ?= build/fuzz
FUZZ_HARNESSES := shard sidecar ll_names
FUZZ_LIB_SOURCES := shardfs/c/shard.c shardfs/c/chd.c shardfs/c/sidecar.c shardfs/c/output.c \
	shardfs/c/ll_names.c shardfs/c/rbd.c shardfs/c/kind_file.c shardfs/c/kind_rbd.c \
	shardfs/c/kind_mosaic.c shardfs/c/mosaic.c shardfs/c/gof.c shardfs/c/remote_copy.c shardfs/c/s3.c \
	shardfs/c/kind_s3.c
# what the kinds link (libzstd, zlib: MOSAIC files; libcurl: S3)
FUZZ_LIBS := -lzstd -lz -ldl
FUZZ_DEPS := tests/fuzz/fuzz_common.h $(FUZZ_LIB_SOURCES) $(C_HEADERS)

$(SAN_DIR)/test_%: tests/c/test_%.c tests/c/check.h $(C_SOURCES) $(C_HEADERS)
	@mkdir -p $(@D)
	gcc -O1 -g -std=gnu11 -Wall -Wextra -Wno-unused-parameter $(SAN_FLAGS) -Ishardfs/c \
	  -o $@ $< $(C_SOURCES) $(LIBS_C) -lpthread

$(SAN_DIR)/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c $(FUZZ_DEPS)
	@mkdir -p $(@D)
	gcc -O1 -g -std=gnu11 -Wall -Wextra -Wno-unused-parameter $(SAN_FLAGS) -Ishardfs/c \
	  -o $@ tests/fuzz/replay.c $< $(FUZZ_LIB_SOURCES) $(FUZZ_LIBS)

test-asan: apt venv test-ph $(SAN_DIR)/test_shard $(SAN_DIR)/test_sidecar $(SAN_DIR)/test_gindex \
		$(SAN_DIR)/test_chd_build $(SAN_DIR)/test_ll_names $(SAN_DIR)/test_hashindex \
		$(SAN_DIR)/test_mosaic $(SAN_DIR)/test_ph \
		$(foreach h,$(FUZZ_HARNESSES),$(SAN_DIR)/replay_$(h)) $(FUZZ_DIR)/seeds/.stamp
	$(SAN_ENV) ASAN_OPTIONS=detect_leaks=1 ./$(SAN_DIR)/test_shard
	$(SAN_ENV) ASAN_OPTIONS=detect_leaks=1 ./$(SAN_DIR)/test_sidecar
	$(SAN_ENV) ASAN_OPTIONS=detect_leaks=1 ./$(SAN_DIR)/test_gindex
	$(SAN_ENV) ASAN_OPTIONS=detect_leaks=1 ./$(SAN_DIR)/test_chd_build
	$(SAN_ENV) ASAN_OPTIONS=detect_leaks=1 ./$(SAN_DIR)/test_ll_names
	$(SAN_ENV) ASAN_OPTIONS=detect_leaks=1 ./$(SAN_DIR)/test_hashindex
	$(SAN_ENV) ASAN_OPTIONS=detect_leaks=1 MOSAIC_PYTHON=$(PY) ./$(SAN_DIR)/test_mosaic
	$(SAN_ENV) ASAN_OPTIONS=detect_leaks=1 ./$(SAN_DIR)/test_ph
	$(foreach h,$(FUZZ_HARNESSES),$(SAN_ENV) ASAN_OPTIONS=detect_leaks=1 \
	  ./$(SAN_DIR)/replay_$(h) $(wildcard tests/fuzz/regressions/$(h)) $(FUZZ_DIR)/seeds/$(h) &&) true
	rm -rf $(SAN_DIR)/py $(SAN_DIR)/tmp
	mkdir -p $(SAN_DIR)/py
	rsync -a --exclude '*.so' --exclude __pycache__ --exclude c shardfs $(SAN_DIR)/py/
	CFLAGS="-O1 -g $(SAN_FLAGS)" LDFLAGS="$(SAN_FLAGS)" $(PY) setup.py -q build_ext --force \
	  --build-lib $(SAN_DIR)/py --build-temp $(SAN_DIR)/tmp
	@# PYTHONSAFEPATH (python -P, inherited by the tests' subprocesses such as
	@# `python -m shardfs`): no current directory on sys.path, so the
	@# sanitized copy on PYTHONPATH is the one imported.
	set -o pipefail; export PYTHONPATH=$(abspath $(SAN_DIR)/py) PYTHONSAFEPATH=1 $(SAN_ENV) \
	  ASAN_OPTIONS=detect_leaks=0 \
	  LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)"; \
	  so=$$($(PY) -c 'import shardfs._shardfs as m; print(m.__file__)'); \
	  echo "sanitized extension: $$so"; \
	  case "$$so" in $(abspath $(SAN_DIR)/py)/*) ;; *) echo "not the sanitized build" >&2; exit 1;; esac; \
	  $(PY) -m pytest -q -p no:cacheprovider $(SAN_PY_DESELECT) $(SAN_PY_TESTS)

# test-tsan: ThreadSanitizer (gcc -fsanitize=thread): the C tests (test_hashindex
# hashes on 4 threads, test_shard reads from several), then the mount tests
# whose workers answer requests on libfuse's threads (fuse_session_loop_mt in
# processes forked from the coordinator: the C request path) against a build
# of the extension in build/tsan/py (a copy of the package, as test-asan),
# libtsan preloaded into the stock python3. Into the Pythons only: bash (its
# own getenv) dies when the runtime starts in it, so the tests' tools run
# without it (tests/tsan/python and sitecustomize.py say how). Options: a
# report ends the process (halt_on_error) and goes to build/tsan/log, and any
# report there fails the run (a worker's report would otherwise only end
# the worker, which the coordinator replaces); die_after_fork=0: the
# coordinator forks workers and builders while it has threads, and they
# start threads (TSan's default is to end such a child); handle_sigbus=0: a
# process the tests expect to die of SIGBUS (a mapping of a taken-down
# object, test_workers.py) dies of it, not of a report. Reports inside
# CPython, libfuse or glibc (not instrumented) are suppressed by
# tests/tsan/tsan.supp, never one in shardfs/c. The C code runs several
# times slower instrumented: SHARDFS_TEST_SLOWDOWN (tests/mounting.py).
TSAN_FLAGS := -fsanitize=thread -fno-omit-frame-pointer
TSAN_DIR := build/tsan
TSAN_OPTS := halt_on_error=1 second_deadlock_stack=1 suppressions=$(abspath tests/tsan/tsan.supp)
TSAN_PY_TESTS ?= tests/test_workers.py tests/test_slow_device.py tests/test_mount_scale.py tests/test_open_bound.py

$(TSAN_DIR)/test_%: tests/c/test_%.c tests/c/check.h $(C_SOURCES) $(C_HEADERS)
	@mkdir -p $(@D)
	gcc -O1 -g -std=gnu11 -Wall -Wextra -Wno-unused-parameter $(TSAN_FLAGS) -Ishardfs/c \
	  -o $@ $< $(C_SOURCES) $(LIBS_C) -lpthread

test-tsan: apt venv $(TSAN_DIR)/test_shard $(TSAN_DIR)/test_sidecar $(TSAN_DIR)/test_gindex \
		$(TSAN_DIR)/test_chd_build $(TSAN_DIR)/test_ll_names $(TSAN_DIR)/test_hashindex
	TSAN_OPTIONS="$(TSAN_OPTS)" ./$(TSAN_DIR)/test_hashindex
	TSAN_OPTIONS="$(TSAN_OPTS)" ./$(TSAN_DIR)/test_shard
	TSAN_OPTIONS="$(TSAN_OPTS)" ./$(TSAN_DIR)/test_sidecar
	TSAN_OPTIONS="$(TSAN_OPTS)" ./$(TSAN_DIR)/test_gindex
	TSAN_OPTIONS="$(TSAN_OPTS)" ./$(TSAN_DIR)/test_chd_build
	TSAN_OPTIONS="$(TSAN_OPTS)" ./$(TSAN_DIR)/test_ll_names
	rm -rf $(TSAN_DIR)/py $(TSAN_DIR)/tmp $(TSAN_DIR)/log
	mkdir -p $(TSAN_DIR)/py $(TSAN_DIR)/log
	rsync -a --exclude '*.so' --exclude __pycache__ --exclude c shardfs $(TSAN_DIR)/py/
	cp tests/tsan/sitecustomize.py $(TSAN_DIR)/py/
	CFLAGS="-O1 -g $(TSAN_FLAGS)" LDFLAGS="$(TSAN_FLAGS)" $(PY) setup.py -q build_ext --force \
	  --build-lib $(TSAN_DIR)/py --build-temp $(TSAN_DIR)/tmp
	@# tests/tsan/python: $(PY) with libtsan preloaded; PYTHONSAFEPATH as in test-asan.
	set -o pipefail; export PYTHONPATH=$(abspath $(TSAN_DIR)/py) PYTHONSAFEPATH=1 SHARDFS_TEST_SLOWDOWN=5 \
	  SHARDFS_TSAN_RUNTIME="$$(gcc -print-file-name=libtsan.so)" SHARDFS_TSAN_PYTHON=$(abspath $(PY)) \
	  SHARDFS_TSAN_WRAPPER=$(abspath tests/tsan/python) \
	  TSAN_OPTIONS="$(TSAN_OPTS) die_after_fork=0 handle_sigbus=0 log_path=$(abspath $(TSAN_DIR)/log)/tsan"; \
	  so=$$(tests/tsan/python -c 'import shardfs._shardfs as m; \
	    assert "libtsan" in open("/proc/self/maps").read(), "no libtsan"; print(m.__file__)'); \
	  echo "sanitized extension: $$so"; \
	  case "$$so" in $(abspath $(TSAN_DIR)/py)/*) ;; *) echo "not the sanitized build" >&2; exit 1;; esac; \
	  tests/tsan/python -m pytest -q -p no:cacheprovider $(TSAN_PY_TESTS); rc=$$?; \
	  if [ -n "$$(ls $(TSAN_DIR)/log)" ]; then \
	    cat $(TSAN_DIR)/log/*; echo "ThreadSanitizer reported (above; one file per process)" >&2; exit 1; \
	  fi; exit $$rc

# test-valgrind: the C tests (and the fuzz regressions and seeds) built
# normally (-O1 -g) and run under memcheck: any error or leak fails.
VG_DIR := build/valgrind
VALGRIND := valgrind --error-exitcode=1 --leak-check=full \
	--errors-for-leak-kinds=definite,indirect,possible --show-leak-kinds=definite,indirect,possible

$(VG_DIR)/test_%: tests/c/test_%.c tests/c/check.h $(C_SOURCES) $(C_HEADERS)
	@mkdir -p $(@D)
	gcc -O1 -g -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Ishardfs/c \
	  -o $@ $< $(C_SOURCES) $(LIBS_C) -lpthread

$(VG_DIR)/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c $(FUZZ_DEPS)
	@mkdir -p $(@D)
	gcc -O1 -g -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Ishardfs/c \
	  -o $@ tests/fuzz/replay.c $< $(FUZZ_LIB_SOURCES) $(FUZZ_LIBS)

test-valgrind: apt venv $(VG_DIR)/test_shard $(VG_DIR)/test_sidecar $(VG_DIR)/test_gindex \
		$(VG_DIR)/test_chd_build $(VG_DIR)/test_ll_names $(VG_DIR)/test_hashindex \
		$(foreach h,$(FUZZ_HARNESSES),$(VG_DIR)/replay_$(h)) $(FUZZ_DIR)/seeds/.stamp
	$(VALGRIND) ./$(VG_DIR)/test_shard
	$(VALGRIND) ./$(VG_DIR)/test_sidecar
	$(VALGRIND) ./$(VG_DIR)/test_gindex
	$(VALGRIND) ./$(VG_DIR)/test_chd_build
	$(VALGRIND) ./$(VG_DIR)/test_ll_names
	$(VALGRIND) ./$(VG_DIR)/test_hashindex
	$(foreach h,$(FUZZ_HARNESSES),$(VALGRIND) -q ./$(VG_DIR)/replay_$(h) \
	  $(wildcard tests/fuzz/regressions/$(h)) $(FUZZ_DIR)/seeds/$(h) &&) true

# ---------------------------------------------------------------- fuzzing
# libFuzzer harnesses tests/fuzz/fuzz_{shard,sidecar,ll_names}.c, built with clang:
# the library with coverage feedback + ASan + UBSan, the harness with the
# sanitizers only (its own loops give no feedback). Work files (binaries,
# seed corpus, growing corpus, logs, crash inputs) under $(FUZZ_DIR).
FUZZ_SECONDS ?= 900
FUZZ_CI_SECONDS ?= 30
FUZZ_CC := clang -g -O1 -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Ishardfs/c
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=all

$(FUZZ_DIR)/bin/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_DEPS)
	@mkdir -p $(@D)/obj-$*
	for f in $(FUZZ_LIB_SOURCES); do \
	  $(FUZZ_CC) $(FUZZ_SAN) -fsanitize=fuzzer-no-link -c $$f -o $(@D)/obj-$*/$$(basename $$f .c).o \
	  || exit 1; done
	$(FUZZ_CC) $(FUZZ_SAN) -c $< -o $(@D)/obj-$*/harness.o
	$(FUZZ_CC) $(FUZZ_SAN) -fsanitize=fuzzer -o $@ $(@D)/obj-$*/*.o $(FUZZ_LIBS)

# Line coverage: the harness replayed (no libFuzzer) over corpus + seeds.
$(FUZZ_DIR)/bin/cov_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c $(FUZZ_DEPS)
	@mkdir -p $(@D)
	$(FUZZ_CC) -fprofile-instr-generate -fcoverage-mapping -o $@ tests/fuzz/replay.c $< \
	  $(FUZZ_LIB_SOURCES) $(FUZZ_LIBS)

$(FUZZ_DIR)/seeds/.stamp: tests/fuzz/make_corpus.py $(VENV)/.stamp
	$(PY) tests/fuzz/make_corpus.py $(FUZZ_DIR)/seeds
	@touch $@

fuzz-build: apt venv $(foreach h,$(FUZZ_HARNESSES),$(FUZZ_DIR)/bin/fuzz_$(h)) $(FUZZ_DIR)/seeds/.stamp

# Every input of tests/fuzz/regressions/ and of the seed corpus, once.
fuzz-replay: fuzz-build
	bash tests/fuzz/run_fuzz.sh replay $(FUZZ_DIR) $(FUZZ_HARNESSES)

fuzz: fuzz-replay
	bash tests/fuzz/run_fuzz.sh fuzz $(FUZZ_SECONDS) $(FUZZ_DIR) $(FUZZ_HARNESSES)
	$(MAKE) --no-print-directory fuzz-coverage

fuzz-ci: fuzz-replay
	bash tests/fuzz/run_fuzz.sh fuzz $(FUZZ_CI_SECONDS) $(FUZZ_DIR) $(FUZZ_HARNESSES)

fuzz-coverage: apt $(foreach h,$(FUZZ_HARNESSES),$(FUZZ_DIR)/bin/cov_$(h)) $(FUZZ_DIR)/seeds/.stamp
	rm -rf $(FUZZ_DIR)/profile && mkdir -p $(FUZZ_DIR)/profile
	$(foreach h,$(FUZZ_HARNESSES),mkdir -p $(FUZZ_DIR)/corpus/$(h) && \
	  LLVM_PROFILE_FILE=$(FUZZ_DIR)/profile/$(h).profraw ./$(FUZZ_DIR)/bin/cov_$(h) \
	  $(FUZZ_DIR)/corpus/$(h) $(wildcard tests/fuzz/regressions/$(h)) $(FUZZ_DIR)/seeds/$(h) &&) true
	llvm-profdata merge -o $(FUZZ_DIR)/profile/all.profdata $(FUZZ_DIR)/profile/*.profraw
	llvm-cov report $(FUZZ_DIR)/bin/cov_$(firstword $(FUZZ_HARNESSES)) \
	  $(foreach h,$(wordlist 2,9,$(FUZZ_HARNESSES)),-object $(FUZZ_DIR)/bin/cov_$(h)) \
	  -instr-profile=$(FUZZ_DIR)/profile/all.profdata $(FUZZ_LIB_SOURCES) | tee $(FUZZ_DIR)/coverage.txt

# (the .so of the editable install goes too: the next `make venv` rebuilds it)
clean:
	rm -rf build *.egg-info tests/c/test_shard tests/c/test_sidecar tests/c/test_gindex \
	  tests/c/test_chd_build tests/c/test_ll_names tests/c/test_hashindex shardfs/*.so $(VENV)/.stamp
