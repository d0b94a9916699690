#!/usr/bin/env bash
# Run libFuzzer harnesses side by side for a bounded time; print their
# executions, exec/s and coverage; fail on any crash.
#
#   tests/fuzz/run_fuzz.sh replay WORK HARNESS...   every regression and seed once
#   tests/fuzz/run_fuzz.sh fuzz SECONDS WORK HARNESS...
#
# WORK (e.g. build/fuzz) holds bin/fuzz_<h> (built by `make fuzz-build`),
# seeds/<h>/ (tests/fuzz/make_corpus.py), and receives corpus/<h>/ (kept
# across runs: the fuzzer starts from what earlier runs found), <h>.log and
# artifacts/<h>/ (crash-*, timeout-*, oom-* inputs). Regression inputs are
# tests/fuzz/regressions/<h>/: a crash input is copied there once fixed.
# Each harness is one process (this machine has 2 cores: 2 harnesses).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
mode=${1:?usage: run_fuzz.sh replay WORK HARNESS... | fuzz SECONDS WORK HARNESS...}
shift
if [ "$mode" = fuzz ]; then
    seconds=${1:?seconds}
    shift
fi
work=${1:?work directory}
shift
[ $# -gt 0 ] || { echo "run_fuzz.sh: no harness named" >&2; exit 2; }

# halt on the first UBSan report, with a stack; libFuzzer handles ASan's
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

status=0
if [ "$mode" = replay ]; then
    for h in "$@"; do
        dirs=()
        for d in "$here/regressions/$h" "$work/seeds/$h"; do [ -d "$d" ] && dirs+=("$d"); done
        log="$work/$h-replay.log"
        if "$work/bin/fuzz_$h" -runs=0 -timeout=10 "${dirs[@]}" >"$log" 2>&1; then
            n=$(grep -o 'files: [0-9]*' "$log" | head -1 | cut -d' ' -f2)
            echo "replay $h: ${n:-0} inputs (regressions + seeds), no crash"
        else
            echo "replay $h: FAILED (log: $log)"
            grep -E 'ERROR|invariant|runtime error|Test unit written' "$log" | head -20
            status=1
        fi
    done
    exit $status
fi

pids=()
for h in "$@"; do
    mkdir -p "$work/corpus/$h" "$work/artifacts/$h"
    rm -f "$work/artifacts/$h"/*
    dirs=("$work/corpus/$h")
    for d in "$here/regressions/$h" "$work/seeds/$h"; do [ -d "$d" ] && dirs+=("$d"); done
    "$work/bin/fuzz_$h" -max_total_time="$seconds" -print_final_stats=1 -timeout=10 \
        -rss_limit_mb=2048 -dict="$here/$h.dict" -artifact_prefix="$work/artifacts/$h/" \
        "${dirs[@]}" >"$work/$h.log" 2>&1 &
    pids+=($!)
done

total=0
i=0
passed=0
failed=0
for h in "$@"; do
    wait "${pids[$i]}"
    rc=$?
    i=$((i + 1))
    log="$work/$h.log"
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    # the last status line: "#N  DONE  cov: C ft: F corp: U/S ..."
    last=$(grep -E '^#[0-9]+' "$log" | grep -E 'cov: ' | tail -1)
    cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.*ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.*corp: \([^ ]*\).*/\1/p' <<<"$last")
    inited=$(grep -m1 'INITED' "$log" | sed -n 's/.*cov: \([0-9]*\) ft: \([0-9]*\).*/cov \1 ft \2/p')
    crashes=$(ls "$work/artifacts/$h" 2>/dev/null | wc -l)
    printf 'fuzz %-8s %10s executions  %6s exec/s  cov: %s  ft: %s  corpus: %s  (at start: %s)  crashes: %s\n' \
        "$h" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "${inited:-?}" "$crashes"
    total=$((total + ${execs:-0}))
    if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
        echo "fuzz $h: FAILED (exit $rc; log: $log; inputs: $work/artifacts/$h/)"
        grep -E 'ERROR|invariant|runtime error|Test unit written' "$log" | head -20
        status=1
        failed=$((failed + 1))
    else
        passed=$((passed + 1))
    fi
done
echo "fuzz: $total executions in all"
echo "fuzz: $passed passed, $failed failed"
exit $status
