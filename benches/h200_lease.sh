#!/usr/bin/env bash
# One lease on the GPU machine in a few calls on one warm machine (each call must start within
# the machine's idle window of the one before; a carried path is gone in the next call, so
# every call stashes what it brings in /tmp).
# Build here first:
#   ../shared/gpu/pack.sh --test cuda_gpu --test attention_correctness --test compute \
#       --test graph_replay --bin polyattn --example generate
#   plus the example's test harness as .devbin/test-generate (cargo test --release --no-run
#   -p polyattn-tools --example generate --message-format=json: its test executable), then
#   the binaries in one archive (9.7 MB: xz -9e finds the code the binaries share):
#     mkdir -p .dz && tar cf - -C .devbin . | xz -9e -T2 >.dz/b.tar.xz
#   and SmolLM2's GGUF (94 MiB) in two parts, .m1/p its first 47,000,000 bytes, .m2/p the
#   rest (a call carries 64 MiB, the tracked files included).
# Calls, each with the command `. .devbin/on-device.sh; bash benches/h200_lease.sh NAME`:
#   kernels: carry .devbin/on-device.sh .dz .m1 .gl
#            The GPU tests and the shared bodies (on sm_90 the Hopper prefill), the CUDA-core
#            decode kernel's test, the hopper call's rows, memcheck and racecheck of the decode
#            kernel, the graph replays, the three sanitizers on the prefill's small test set.
#   hopper:  carry .devbin/on-device.sh .gl (after kernels, whose binaries it runs)
#            The Hopper prefill's goal rows beside cuDNN and one launch of it under ncu.
#   model:   carry .devbin/on-device.sh .m2 .gl
#            SmolLM2 joined: the greedy-token identity, the graph tests, the cache-write A/B
#            (cache-write-ab), then the tokens/s of every backend (speed).
#   variants: carry .devbin/on-device.sh .dz .gl
#            Kernel variants built from other branches, each as a pair bin-polyattn-NAME and
#            test-cuda_gpu-NAME in the archive beside this tree's bin-polyattn
#            (benches/pack_variants.sh NAME=BRANCH ... after pack.sh): each variant's prefill tests and its small set under memcheck, racecheck
#            and synccheck, then the goal rows of this tree and of every variant that passed,
#            interleaved twice, beside cuDNN.
# Each call leaves $OUT/summary-NAME.txt and $OUT/logs-NAME.tgz (its logs and JSON, packed
# after every step: a call returns only a few files, and one cut short still brings back what
# it did).
set -u
call=${1:?usage: h200_lease.sh kernels|hopper|model|variants}
R=${OUT:?run on the GPU machine, where \$OUT is set}
here=$(dirname "$0")
mkdir -p /tmp/b
if [ -f .dz/b.tar.xz ]; then
  python3 -c 'import tarfile; tarfile.open(".dz/b.tar.xz").extractall("/tmp/b")'
fi
cp .devbin/* /tmp/b/ 2>/dev/null
for i in 1 2 3; do [ -f .m$i/p ] && cp .m$i/p /tmp/m$i; done
export OUT=/tmp/h200-$call B=/tmp/b POLYATTN_CACHE_DIR=/tmp/polyattn-cache
mkdir -p "$OUT"
phases() { # phases PHASE...: h200_model.sh's phases, the logs packed after each
  for p in "$@"; do
    bash "$here/h200_model.sh" "$p"
    tar czf "$R/logs-$call.tgz" -C "$OUT" . 2>/dev/null
  done
}
sh=P2.b1s16k.p16,P2.b1s32k.p16,P2.b8s4k.p16,P1.d128.b16s1k.nc,P1.d128.b1s16k.c,P2.b1s4k.p16
bench() { # bench NAME: the goal rows with the environment given (BIN: another build)
  t "$1" 100 "${BIN:-$B/bin-polyattn}" bench --backend cuda --shapes $sh --budget 0.3 \
    --json "$OUT/$1.json" --no-svg
  grep -E '^ *P[12]' "$OUT/$1.log" | head -8
}
t() { # t NAME SECONDS CMD...: the command's log under $OUT, its summary lines here
  local n=$1 secs=$2; shift 2
  echo "== $n ($(date +%T))"
  timeout "$secs" "$@" >"$OUT/$n.log" 2>&1
  echo "-- $n rc=$? $(grep -E 'test result|panicked|ERROR SUMMARY' "$OUT/$n.log" | head -3 | tr '\n' ' ')"
  tar czf "$R/logs-$call.tgz" -C "$OUT" . 2>/dev/null
}
# The Hopper prefill's goal rows beside cuDNN, then one launch of it under ncu.
hopper_rows() {
  t torch 120 env PYTHONUNBUFFERED=1 python3 benches/reference_sdpa.py --shapes $sh \
    --budget 0.3 --out "$OUT/torch.json"
  grep -E '^\[' "$OUT/torch.log" | head -8
  bench wgmma-bench
  t ncu-wgmma 120 ncu --clock-control none -k regex:paged_attention_wgmma --launch-skip 5 \
    --launch-count 1 --section SpeedOfLight --section Occupancy --section SchedulerStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis \
    --metrics sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active \
    $B/bin-polyattn bench --backend cuda --shapes P2.b1s16k.p16 --budget 0.05 \
    --gpu-warmup-secs 0 --no-svg
}
case $call in
  kernels)
    { $B/bin-polyattn info | tail -3; phases gpu-tests decode-cores
      hopper_rows; phases sanitize-decode-cores graph-replay
      for tool in memcheck racecheck synccheck; do
        t $tool-wgmma 120 compute-sanitizer --tool $tool --error-exitcode 99 \
          $B/test-cuda_gpu prefill_kernel_sanitizer_set --test-threads=1
      done; } 2>&1 | tee "$R/summary-$call.txt" ;;
  hopper)
    hopper_rows 2>&1 | tee "$R/summary-$call.txt" ;;
  model)
    phases join identity graphs cache-write-ab speed 2>&1 | tee "$R/summary-$call.txt" ;;
  variants)
    {
      names=()
      for b in $B/bin-polyattn-*; do [ -f "$b" ] && names+=("${b##*/bin-polyattn-}"); done
      echo "variants: ${names[*]:-none}"
      ok=()
      for v in "${names[@]}"; do
        t $v-tests 200 $B/test-cuda_gpu-$v prefill --test-threads=1
        grep -q 'test result: ok' "$OUT/$v-tests.log" || continue
        pass=1
        for tool in memcheck racecheck synccheck; do
          t $v-$tool 150 compute-sanitizer --tool $tool --error-exitcode 99 \
            $B/test-cuda_gpu-$v prefill_kernel_sanitizer_set --test-threads=1
          grep -q 'ERROR SUMMARY: 0 errors\|RACECHECK SUMMARY: 0 hazards' "$OUT/$v-$tool.log" || pass=0
        done
        [ $pass = 1 ] && ok+=("$v")
      done
      t torch 120 env PYTHONUNBUFFERED=1 python3 benches/reference_sdpa.py --shapes $sh \
        --budget 0.3 --out "$OUT/torch.json"
      grep -E '^\[' "$OUT/torch.log" | head -8
      for rep in 1 2; do
        bench main-bench-$rep
        for v in "${ok[@]}"; do BIN=$B/bin-polyattn-$v bench $v-bench-$rep; done
      done
    } 2>&1 | tee "$R/summary-$call.txt" ;;
  *) echo "unknown call $call"; exit 2 ;;
esac
