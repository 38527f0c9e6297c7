#!/usr/bin/env bash
# One lease for the decode-step kernels and the model runner: three calls on one warm
# machine, because SmolLM2's GGUF (93 MB) and the binaries do not fit one transfer (64 MiB).
# Build here first:
#   ../shared/gpu/pack.sh --test cuda_gpu --test attention_correctness --test compute \
#       --example generate
#   plus the example's test harness as .devbin/test-generate (cargo test --release --no-run
#   -p polyattn-tools --example generate --message-format=json: its test executable).
# Then, each within the machine's idle window of the one before:
#   call 1: carry .devbin/on-device.sh .devbin/test-cuda_gpu .devbin/test-attention_correctness
#           .devbin/test-compute .devbin/test-generate .m3
#           command: . .devbin/on-device.sh; bash benches/h200_lease.sh 1
#   call 2: carry .devbin/on-device.sh .devbin/example-generate .m1
#           command: . .devbin/on-device.sh; bash benches/h200_lease.sh 2
#   call 3: carry .devbin/on-device.sh .m2 .gl
#           command: . .devbin/on-device.sh; bash benches/h200_lease.sh 3
# The Hopper prefill (wgmma), independent of calls 1-3; these two do not source on-device.sh
# first (compute-sanitizer runs before the Vulkan loader is installed), and each carries
# .devbin/on-device.sh .devbin/test-cuda_gpu .devbin/test-attention_correctness
# .devbin/bin-polyattn .gl:
#   call 4: bash benches/h200_lease.sh 4   (its tests and SASS, stopping there if they fail;
#                                           then compute-sanitizer on it)
#   call 5: bash benches/h200_lease.sh 5   (tests at 64 keys, shared bodies, P rows, cuDNN,
#                                           one launch under ncu)
# or, where the lease has time for one call only (same carry, sourcing on-device.sh first):
#   call 7: bash benches/h200_lease.sh 7   (each form's small test set and SASS, goal rows
#                                           beside mma.sync and cuDNN, 64-key rows, the GPU
#                                           tests and shared bodies, sanitizers)
# Every call stashes its binaries in /tmp/b and its model part in /tmp (a carried path is gone
# in the next call), runs its phases of h200_model.sh with B=/tmp/b and logs in /tmp/h200, and
# leaves $OUT/summary-N.txt and $OUT/logs-N.tgz (the logs and the JSON lines so far).
set -u
call=${1:?usage: h200_lease.sh 1|2|3|4|5|7}
R=${OUT:?run on the GPU machine, where \$OUT is set}
here=$(dirname "$0")
mkdir -p /tmp/b /tmp/h200
cp .devbin/* /tmp/b/ 2>/dev/null
export OUT=/tmp/h200 B=/tmp/b
case $call in
  # The kernels' tests and sanitizers (no model needed): the CUDA-core decode kernel, the
  # tensor-core linear layers and the projection's cache write.
  1) phases=(stash decode-cores gemv-mma) ;;
  # With call 1's binaries from /tmp/b: the shared attention bodies, one launch of each
  # decode kernel under ncu.
  2) phases=(stash attention decode-cores-ncu) ;;
  # The graph tests and the greedy-token identity with everything on (the defaults) first,
  # then SmolLM2 with the two kernels on and off and the projection's cache write on and off.
  3) phases=(join graphs identity step-ab cache-write-ab) ;;
  # The Hopper prefill through h200.sh's phases (its own phase list, same folders).
  4|5)
    [ "$call" = 4 ] && hp=(hopper-gate sanitize-hopper) || hp=(hopper torch ncu-hopper)
    timeout 580 bash "$here/h200.sh" "${hp[@]}" 2>&1 | tee "$R/summary-$call.txt"
    cp /tmp/h200/*.json "$R/" 2>/dev/null
    tar czf "$R/logs-$call.tgz" -C /tmp/h200 .
    exit 0 ;;
  # The Hopper prefill in one call, most useful first, every step under its own time limit
  # (a form that hangs costs its step, not the call): each form's small test set (every
  # modifier, both head sizes, GQA) and the SASS of what ran; the goal rows of each passing form
  # beside mma.sync and cuDNN, then at 64 keys a tile; the GPU tests and shared bodies with the
  # default form; then the sanitizers. The logs and JSON are packed into $R/logs-7.tgz after
  # every step (a call returns only a few files), so a call cut short still brings back what
  # it did.
  7)
    export OUT=/tmp/h200-7
    mkdir -p "$OUT"
    export POLYATTN_CACHE_DIR=/tmp/polyattn-cache
    sh=P2.b1s16k.p16,P2.b1s32k.p16,P2.b8s4k.p16,P1.d128.b16s1k.nc,P1.d128.b1s16k.c,P2.b1s4k.p16
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
    t() { # t NAME SECONDS CMD...: the command's log under $OUT, its summary lines here
      local n=$1 secs=$2; shift 2
      echo "== $n ($(date +%T))"
      timeout "$secs" "$@" >"$OUT/$n.log" 2>&1
      echo "-- $n rc=$? $(grep -E 'test result|panicked|ERROR SUMMARY' "$OUT/$n.log" | head -3 | tr '\n' ' ')"
      tar czf "$R/logs-7.tgz" -C "$OUT" . 2>/dev/null
    }
    ok() { grep -q 'test result: ok' "$OUT/$1.log"; }
    bench() { # bench NAME FORM: the goal rows with POLYATTN_CUDA_WGMMA_FORM=FORM
      t "$1" 100 env POLYATTN_CUDA_WGMMA_FORM=$2 .devbin/bin-polyattn bench --backend cuda \
        --shapes $sh --budget 0.3 --json "$OUT/$1.json" --no-svg
      grep -E '^ *P[12]' "$OUT/$1.log" | head -8
    }
    STALLS=$(printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' barrier \
      long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait not_selected \
      dispatch_stall lg_throttle selected membar sleeping misc)
    STALLS=${STALLS%,}
    forms=(ws ws-pingpong-overlap barrier ws-overlap ws-pingpong)
    small() { t $1-small 60 env POLYATTN_CUDA_WGMMA_FORM=$1 .devbin/test-cuda_gpu \
      prefill_kernel_sanitizer_set --test-threads=1; }
    {
      .devbin/bin-polyattn info | tail -2
      # The default and FlashAttention-3's schedule first, with cuDNN and mma.sync beside them.
      for f in "${forms[@]:0:2}"; do small $f; done
      for c in /tmp/polyattn-cache/paged_attention_wgmma*-sm_90a-*.cubin; do
        [ -f "$c" ] && echo "HGMMA in $(basename "$c"): $(cuobjdump --dump-sass "$c" | grep -c HGMMA)"
      done
      t torch 120 env PYTHONUNBUFFERED=1 python3 benches/reference_sdpa.py --shapes $sh \
        --budget 0.3 --out "$OUT/torch.json"
      grep -E '^\[' "$OUT/torch.log" | head -8
      for f in "${forms[@]:0:2}"; do ok $f-small && bench $f-bench $f; done
      t mma-bench 100 env POLYATTN_CUDA_MMA=1 .devbin/bin-polyattn bench --backend cuda \
        --shapes $sh --budget 0.3 --json "$OUT/mma-bench.json" --no-svg
      grep -E '^ *P[12]' "$OUT/mma-bench.log" | head -8
      for f in "${forms[@]:2}"; do small $f && ok $f-small && bench $f-bench $f; done
      for f in ws ws-pingpong-overlap ws-overlap; do
        ok $f-small && (export POLYATTN_CUDA_WGMMA_KEYS=64; bench $f-k64-bench $f)
      done
      # One launch of the default form under Nsight Compute: where its time goes.
      t ncu-ws 120 ncu --clock-control none -k regex:paged_attention_wgmma --launch-skip 5 \
        --launch-count 1 --section SpeedOfLight --section Occupancy --section SchedulerStats \
        --section WarpStateStats --metrics "$STALLS,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active" \
        .devbin/bin-polyattn bench --backend cuda --shapes P2.b1s16k.p16 --budget 0.05 \
        --gpu-warmup-secs 0 --no-svg
      t cuda_gpu 200 .devbin/test-cuda_gpu --test-threads=1
      t attention 120 .devbin/test-attention_correctness
      for f in "${forms[@]}"; do
        ok $f-small && t $f-tests 150 env POLYATTN_CUDA_WGMMA_FORM=$f .devbin/test-cuda_gpu \
          prefill --test-threads=1
      done
      for tool in memcheck racecheck synccheck; do
        for f in "${forms[@]}"; do
          ok $f-small && t $tool-$f 150 env POLYATTN_CUDA_WGMMA_FORM=$f compute-sanitizer \
            --tool $tool --error-exitcode 99 .devbin/test-cuda_gpu prefill_kernel_sanitizer_set \
            --test-threads=1
        done
      done
    } 2>&1 | tee "$R/summary-7.txt"
    exit 0 ;;
  *) echo "unknown call $call"; exit 2 ;;
esac
timeout 560 bash "$here/h200_model.sh" "${phases[@]}" 2>&1 | tee "$R/summary-$call.txt"
tar czf "$R/logs-$call.tgz" -C /tmp/h200 .
