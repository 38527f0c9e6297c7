#!/usr/bin/env bash
# The H200 checks of polyattn's input-robustness guarantees (issue 18): the shared suites and
# the stale-cache, isolation, concurrency and fuzz suites on CUDA and WGPU, compute-sanitizer
# memcheck over the CUDA fuzzer and the CUDA stale-cache suite, and the WGPU fuzzer.
#
# Binaries: ../shared/gpu/pack.sh --tests --bin polyattn, then
#   tar cJf .devpack/bins.tar.xz .devbin   (what travels must stay under 64 MiB)
# and on the GPU machine (carry .devpack and .gl):
#   tar xJf .devpack/bins.tar.xz && bash benches/h200_robustness.sh PHASE...
# Phases: sanitize (run before the Vulkan loaders are unpacked, so the WGPU backend is
# unavailable and only CUDA runs under the sanitizer), tests, check, fuzz-wgpu, fuzz-cuda.
# Logs go to $OUT; each phase prints its summary lines.
set -u
OUT=${OUT:-/tmp/h200}
mkdir -p "$OUT"
export POLYATTN_CACHE_DIR=/tmp/polyattn-cache
B=.devbin
FUZZ_SECS=${FUZZ_SECS:-120}
say() { echo "== $* ($(date +%T))"; }
run() { # run NAME SECONDS CMD...: logs to $OUT/NAME.log, prints its summary lines
  local name=$1 secs=$2; shift 2
  say "$name"
  timeout "$secs" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  grep -E '^\[|test result|panicked|FAIL|ERROR SUMMARY|passed, |error:|within tolerance|^(CPU|CUDA|WGPU) ' "$OUT/$name.log" | head -40
  echo "-- $name rc=$rc"
}
MEMCHECK="compute-sanitizer --tool memcheck --error-exitcode 99"
for p in "$@"; do
  case $p in
  sanitize)
    run memcheck-fuzz-cuda $((FUZZ_SECS + 120)) $MEMCHECK $B/bin-polyattn fuzz --backend cuda --seconds "$FUZZ_SECS" --seed 18000
    run memcheck-stale-cache 300 $MEMCHECK $B/test-stale_cache --test-threads=1
    run memcheck-isolation 200 $MEMCHECK $B/test-isolation --test-threads=1
    run memcheck-merge-states 120 $MEMCHECK $B/test-merge_states --test-threads=1
    ;;
  tests)
    for t in stale_cache validation isolation concurrency fuzz merge_states kv_cache \
      attention_correctness cuda_gpu wgpu_kernels wgpu_coop; do
      run "test-$t" 400 $B/test-$t
    done
    run test-lib 200 $B/test-polyattn
    ;;
  check)
    run check 120 $B/bin-polyattn check
    ;;
  fuzz-wgpu)
    run fuzz-wgpu $((FUZZ_SECS + 60)) $B/bin-polyattn fuzz --backend wgpu --seconds "$FUZZ_SECS" --seed 18000
    ;;
  fuzz-cuda)
    run fuzz-cuda $((FUZZ_SECS + 60)) $B/bin-polyattn fuzz --backend cuda --seconds "$FUZZ_SECS" --seed 28000
    ;;
  *)
    echo "unknown phase $p"
    ;;
  esac
done
