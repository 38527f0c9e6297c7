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
#            The GPU tests and the shared bodies with the defaults (the Hopper prefill's `ws`
#            form on sm_90), then with the decode-step opt-ins on (POLYATTN_CUDA_DECODE_CORES,
#            _GEMV_MMA, _FUSED_CACHE_WRITE): their kernels' tests and the shared bodies; the
#            hopper call's rows; memcheck and racecheck of the two new kernels, the graph
#            replays, the three sanitizers on the `ws-tma` form's small test set.
#   hopper:  carry .devbin/on-device.sh .gl (after kernels, whose binaries it runs)
#            The Hopper prefill's goal rows at 128 and 64 keys a tile beside cuDNN, and one
#            launch of the default form under ncu.
#   model:   carry .devbin/on-device.sh .m2 .gl
#            SmolLM2 joined: the greedy-token identity with the opt-ins, the decode-step A/B
#            (h200_model.sh step-ab), the graph tests, the cache-write A/B (cache-write-ab).
#   forms:   carry .devbin/on-device.sh .devbin/test-cuda_gpu .devbin/test-attention_correctness
#            .devbin/bin-polyattn .gl (one call, no archive): every form of the Hopper prefill.
# Each call leaves $OUT/summary-NAME.txt and $OUT/logs-NAME.tgz (its logs and JSON, packed
# after every step: a call returns only a few files, and one cut short still brings back what
# it did).
set -u
call=${1:?usage: h200_lease.sh kernels|model|hopper|forms}
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
bench() { # bench NAME: the goal rows with the environment given
  t "$1" 100 $B/bin-polyattn bench --backend cuda --shapes $sh --budget 0.3 \
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
# The Hopper prefill's goal rows beside cuDNN at 128 and 64 keys a tile, the tensor-copy form
# (`ws-tma`: its small test set, then its rows where that passed), then one launch of the
# default form under ncu.
hopper_rows() {
  t torch 120 env PYTHONUNBUFFERED=1 python3 benches/reference_sdpa.py --shapes $sh \
    --budget 0.3 --out "$OUT/torch.json"
  grep -E '^\[' "$OUT/torch.log" | head -8
  bench ws-bench
  t ws-tma-small 60 env POLYATTN_CUDA_WGMMA_FORM=ws-tma $B/test-cuda_gpu \
    prefill_kernel_sanitizer_set --test-threads=1
  if grep -q 'test result: ok' "$OUT/ws-tma-small.log"; then
    POLYATTN_CUDA_WGMMA_FORM=ws-tma bench ws-tma-bench
    t ws-tma-tests 150 env POLYATTN_CUDA_WGMMA_FORM=ws-tma $B/test-cuda_gpu prefill --test-threads=1
  fi
  POLYATTN_CUDA_WGMMA_KEYS=64 bench ws-k64-bench
  POLYATTN_CUDA_WGMMA_KEYS=64 POLYATTN_CUDA_WGMMA_FORM=ws-pingpong-overlap \
    bench ws-pingpong-overlap-k64-bench
  t ncu-ws 120 ncu --clock-control none -k regex:paged_attention_wgmma --launch-skip 5 \
    --launch-count 1 --section SpeedOfLight --section Occupancy --section SchedulerStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis \
    --metrics sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active \
    $B/bin-polyattn bench --backend cuda --shapes P2.b1s16k.p16 --budget 0.05 \
    --gpu-warmup-secs 0 --no-svg
}
case $call in
  kernels)
    { $B/bin-polyattn info | tail -3; phases defaults decode-cores gemv-mma attention
      hopper_rows; phases sanitize-decode-cores sanitize-gemv-mma graph-replay
      for tool in memcheck racecheck synccheck; do
        t $tool-ws-tma 120 env POLYATTN_CUDA_WGMMA_FORM=ws-tma compute-sanitizer --tool $tool \
          --error-exitcode 99 $B/test-cuda_gpu prefill_kernel_sanitizer_set --test-threads=1
      done; } 2>&1 |
      tee "$R/summary-$call.txt" ;;
  model)
    phases join identity step-ab graphs cache-write-ab 2>&1 | tee "$R/summary-$call.txt" ;;
  hopper)
    hopper_rows 2>&1 | tee "$R/summary-$call.txt" ;;
  # Every form of the Hopper prefill in one call, most useful first, every step under its own
  # time limit (a form that hangs costs its step, not the call): each form's small test set
  # (every modifier, both head sizes, GQA) and the SASS of what ran; the goal rows of each
  # passing form beside mma.sync and cuDNN, then at 64 keys a tile; the GPU tests and shared
  # bodies with the default form; then the sanitizers.
  forms)
    ok() { grep -q 'test result: ok' "$OUT/$1.log"; }
    STALLS=$(printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' barrier \
      long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait not_selected \
      dispatch_stall lg_throttle selected membar sleeping misc)
    STALLS=${STALLS%,}
    forms=(ws ws-tma ws-pingpong-overlap barrier ws-overlap ws-pingpong)
    small() { t $1-small 60 env POLYATTN_CUDA_WGMMA_FORM=$1 $B/test-cuda_gpu \
      prefill_kernel_sanitizer_set --test-threads=1; }
    {
      $B/bin-polyattn info | tail -2
      # The default and FlashAttention-3's schedule first, with cuDNN and mma.sync beside them.
      for f in "${forms[@]:0:2}"; do small $f; done
      for c in /tmp/polyattn-cache/paged_attention_wgmma*-sm_90a-*.cubin; do
        [ -f "$c" ] && echo "HGMMA in $(basename "$c"): $(cuobjdump --dump-sass "$c" | grep -c HGMMA)"
      done
      t torch 120 env PYTHONUNBUFFERED=1 python3 benches/reference_sdpa.py --shapes $sh \
        --budget 0.3 --out "$OUT/torch.json"
      grep -E '^\[' "$OUT/torch.log" | head -8
      for f in "${forms[@]:0:2}"; do ok $f-small && POLYATTN_CUDA_WGMMA_FORM=$f bench $f-bench; done
      t mma-bench 100 env POLYATTN_CUDA_MMA=1 $B/bin-polyattn bench --backend cuda \
        --shapes $sh --budget 0.3 --json "$OUT/mma-bench.json" --no-svg
      grep -E '^ *P[12]' "$OUT/mma-bench.log" | head -8
      for f in "${forms[@]:2}"; do small $f && ok $f-small && POLYATTN_CUDA_WGMMA_FORM=$f bench $f-bench; done
      for f in ws ws-pingpong-overlap ws-overlap; do
        ok $f-small && POLYATTN_CUDA_WGMMA_KEYS=64 POLYATTN_CUDA_WGMMA_FORM=$f bench $f-k64-bench
      done
      # One launch of the default form under Nsight Compute: where its time goes.
      t ncu-ws 120 ncu --clock-control none -k regex:paged_attention_wgmma --launch-skip 5 \
        --launch-count 1 --section SpeedOfLight --section Occupancy --section SchedulerStats \
        --section WarpStateStats --metrics "$STALLS,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active" \
        $B/bin-polyattn bench --backend cuda --shapes P2.b1s16k.p16 --budget 0.05 \
        --gpu-warmup-secs 0 --no-svg
      t cuda_gpu 200 $B/test-cuda_gpu --test-threads=1
      t attention 120 $B/test-attention_correctness
      for f in "${forms[@]}"; do
        ok $f-small && t $f-tests 150 env POLYATTN_CUDA_WGMMA_FORM=$f $B/test-cuda_gpu \
          prefill --test-threads=1
      done
      for tool in memcheck racecheck synccheck; do
        for f in "${forms[@]}"; do
          ok $f-small && t $tool-$f 150 env POLYATTN_CUDA_WGMMA_FORM=$f compute-sanitizer \
            --tool $tool --error-exitcode 99 $B/test-cuda_gpu prefill_kernel_sanitizer_set \
            --test-threads=1
        done
      done
    } 2>&1 | tee "$R/summary-$call.txt" ;;
  *) echo "unknown call $call"; exit 2 ;;
esac
