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
# or, where the lease has time for one call only (same carry):
#   call 6: bash benches/h200_lease.sh 6   (tests and SASS, P rows of the forms beside
#                                           mma.sync and cuDNN, then the sanitizers)
#   call 7: bash benches/h200_lease.sh 7   (a few minutes: each form's tests and goal rows,
#                                           the default first, beside mma.sync and cuDNN)
# Every call stashes its binaries in /tmp/b and its model part in /tmp (a carried path is gone
# in the next call), runs its phases of h200_model.sh with B=/tmp/b and logs in /tmp/h200, and
# leaves $OUT/summary-N.txt and $OUT/logs-N.tgz (the logs and the JSON lines so far).
set -u
call=${1:?usage: h200_lease.sh 1|2|3|4|5|6|7}
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
  # One call for the Hopper prefill when only one fits the lease: its tests (stop if every
  # form fails), the P rows of the three forms beside mma.sync and cuDNN, then the sanitizers.
  # Its logs and JSON go straight under the returned folder, so a call cut short by its time
  # limit still brings back what it did.
  6)
    export OUT=$R/h200
    mkdir -p "$OUT"
    { timeout 200 bash "$here/h200.sh" hopper-gate &&
      timeout 240 bash "$here/h200.sh" hopper-bench torch-p
      timeout 150 bash "$here/h200.sh" sanitize-hopper; } 2>&1 | tee "$R/summary-6.txt"
    exit 0 ;;
  # The shortest useful Hopper call (a lease with a few minutes left): the default form's
  # tests, its P rows beside mma.sync and cuDNN on the goal shapes, then the ping-pong form's
  # tests and rows, then the plain warp-specialised form's; logs under $OUT as they go.
  7)
    export OUT=$R/h200
    mkdir -p "$OUT"
    export POLYATTN_CACHE_DIR=/tmp/polyattn-cache
    sh=P2.b1s16k.p16,P2.b1s32k.p16,P2.b8s4k.p16,P1.d128.b16s1k.nc,P1.d128.b1s16k.c
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
    t() { # t NAME SECONDS CMD...: the command's log under $OUT, its summary lines here
      local n=$1 secs=$2; shift 2
      echo "== $n ($(date +%T))"
      timeout "$secs" "$@" >"$OUT/$n.log" 2>&1
      echo "-- $n rc=$? $(grep -E 'test result|panicked' "$OUT/$n.log" | head -3 | tr '\n' ' ')"
    }
    bench() { # bench NAME FORM: the goal rows with POLYATTN_CUDA_WGMMA_FORM=FORM
      t "$1" 90 env POLYATTN_CUDA_WGMMA_FORM=$2 .devbin/bin-polyattn bench --backend cuda \
        --shapes $sh --budget 0.3 --json "$OUT/$1.json" --no-svg
      grep -E '^ *P[12]' "$OUT/$1.log" | head -8
    }
    {
      # The small set first (every modifier, both head sizes, GQA), so even a cut-short call
      # says whether the default form computes the right thing.
      t barrier-small 60 .devbin/test-cuda_gpu prefill_kernel_sanitizer_set --test-threads=1
      t pp-small 60 env POLYATTN_CUDA_WGMMA_FORM=ws-pingpong .devbin/test-cuda_gpu \
        prefill_kernel_sanitizer_set --test-threads=1
      t barrier-tests 120 .devbin/test-cuda_gpu prefill --test-threads=1
      bench barrier-bench barrier
      t mma-bench 90 env POLYATTN_CUDA_MMA=1 .devbin/bin-polyattn bench --backend cuda \
        --shapes $sh --budget 0.3 --json "$OUT/mma-bench.json" --no-svg
      t torch 120 env PYTHONUNBUFFERED=1 python3 benches/reference_sdpa.py --shapes $sh \
        --budget 0.3 --out "$OUT/torch.json"
      t pp-tests 120 env POLYATTN_CUDA_WGMMA_FORM=ws-pingpong .devbin/test-cuda_gpu prefill --test-threads=1
      bench pp-bench ws-pingpong
      t ws-tests 120 env POLYATTN_CUDA_WGMMA_FORM=ws .devbin/test-cuda_gpu prefill --test-threads=1
      bench ws-bench ws
    } 2>&1 | tee "$R/summary-7.txt"
    exit 0 ;;
  *) echo "unknown call $call"; exit 2 ;;
esac
timeout 560 bash "$here/h200_model.sh" "${phases[@]}" 2>&1 | tee "$R/summary-$call.txt"
tar czf "$R/logs-$call.tgz" -C /tmp/h200 .
