#!/usr/bin/env bash
# One GPU session on the project's H200: correctness of every backend, the benchmarks with the
# same-run PyTorch reference, and compute-sanitizer. Binaries come from
#   ../shared/gpu/pack.sh --test attention_correctness --test kv_cache --test merge_states \
#       --test validation --test cuda_gpu --test wgpu_kernels --bin polyattn
# and the command on the GPU machine is `bash benches/h200.sh PHASE...` (carry .devbin, .gl).
# Phases: check, tests, wgpu, wgpu-f16, bench, torch, mma, sanitize, sanitize-mma, sanitize-prefill,
# hopper-gate, sanitize-hopper and hopper (the wgmma prefill: its prefill tests and SASS,
# stopping the script if they fail; compute-sanitizer on its test set; the shared bodies and
# the P / P1 rows beside the mma.sync kernel; add torch for the cuDNN rows (torch-p: the
# prefill rows only); hopper-bench: the P / P1 rows alone; ncu-hopper for one launch through
# Nsight Compute),
# vulkan-chunks (build with --test cache_chunks --test mla),
# sanitize-fp8, fp8-bench, decode-sanitize, decode-splits, subk64, ... (default: check tests
# bench); prefill: P2 rows of the tensor-core prefill kernel alone, at 128 rows per CTA (the
# default) and at POLYATTN_CUDA_MMA_ROWS=64; ncu: one launch of that
# kernel (P2.b1s4k) through Nsight Compute (speed of light, warp states, occupancy, source
# counters) into $OUT/ncu-prefill.log; ncu-p2: the same kernel on P2.b8s4k beside P2.b1s32k
# (instructions, tensor-pipe activity, active warps, stalls); wgpu-modes: the large WGPU decode rows in a WGPU-only
# process and after CUDA, traced per repetition; wgpu-unroll: WGPU rows
# with the unrolled kernels (the default on GPUs) beside POLYATTN_WGPU_UNROLL=0;
# sanitize-fp8: fp8 caches on the tensor-core decode kernel (memcheck / racecheck of the fp8
# decode test); fp8-bench: the D rows with an fp8 cache; mma-shapes: every CTA shape of the tensor-core
# prefill kernel (POLYATTN_CUDA_MMA_ROWS / _WARPS): long_prefill and the P2 rows each;
# decode-splits: D4 / D1.b1s4k with forced decode split counts (POLYATTN_CUDA_DECODE_SPLITS);
# ncu-decode: the decode kernel of D4 through Nsight Compute; decode-sanitize: the decode
# kernel's tests, graph tests and memcheck / racecheck of its sanitizer set, then the D rows;
# subk64: the 128-row
# prefill with 64-key softmax steps (POLYATTN_CUDA_MMA_SUBK=64, spills registers);
# sanitize-prefill: racecheck of every CTA shape, memcheck / synccheck of the 128-row form
# on the prefill sanitizer set, memcheck of large_prefill;
# wgpu-prefill: the fused-softmax WGPU prefill form (POLYATTN_WGPU_PREFILL=fused-softmax)
# checked by the shared suite at 128 and 64 threads, then the P2 rows with the default form
# beside fused-softmax at 128, 64 and 32 threads and with 64x16 tiles; wgpu-f16: the
# fused-softmax f16 form (POLYATTN_WGPU_PREFILL=fused-softmax-f16) checked by the shared suite
# and wgpu_kernels, then P2 at 4k and 16k with f16 activations (f16 cache) for fused-softmax
# beside fused-softmax-f16 at 128 and 64 threads; wgpu-f16-sweep: fused-softmax-f16 shapes
# through POLYATTN_WGPU_PREFILL_ROWS_H / _KEYS_H / _WG_H / _BLOCK_H (P2 f16 at 4k and 16k, with
# register counts); wgpu-splits: the small-batch WGPU decode rows traced, then with shorter partials / more
# splits (POLYATTN_WGPU_SPLIT_MIN_KEYS 32 / 64, _MAX_SPLITS 128 / 256).
# Logs go to $OUT.
set -u
OUT=${OUT:-/tmp/h200}
mkdir -p "$OUT"
export POLYATTN_CACHE_DIR=/tmp/polyattn-cache
B=${B:-.devbin}
SHAPES_P=P2.b1s1k.p16,P2.b1s4k.p16,P2.b1s16k.p16,P2.b1s32k.p16,P2.b8s4k.p16
# P1 at head size 128 (issue #4 names these rows for the WGPU backend): MHA 16 heads, paged.
SHAPES_P1=P1.d128.b16s1k.nc,P1.d128.b4s4k.nc,P1.d128.b4s4k.c,P1.d128.b1s16k.c
# P2 rows of the wgpu-f16 phase (f16 activations).
SHAPES_PH=P2.b1s4k.p16,P2.b1s16k.p16
SHAPES_D=D1.b1s4k,D1.b8s4k,D1.b64s4k,D1.b16s16k,D4.b1s32k
SHAPES_KG=K.t1.h8.hnd,K.t4096.h8.hnd,K.t65536.h8.hnd,G.t1024.h32.d128,G.t65536.h32.d128
# Warp stall reasons (warps per issue slot) for the ncu phase.
STALLS=$(printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' barrier \
  long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait not_selected \
  no_instruction dispatch_stall lg_throttle selected branch_resolving drain membar sleeping \
  tex_throttle imc_miss misc)
STALLS=${STALLS%,}
say() { echo "== $* ($(date +%T))"; }
run() { # run NAME SECONDS CMD...: logs to $OUT/NAME.log, prints its summary lines
  local name=$1 secs=$2; shift 2
  say "$name"
  timeout "$secs" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  grep -E '^\[|test result|panicked|FAIL|ERROR|error|Selected|within tolerance|^(CPU|CUDA|WGPU) ' "$OUT/$name.log" | head -60
  echo "-- $name rc=$rc"
}
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(check tests bench)
# compute-sanitizer first, while no Vulkan loader is installed (keeps wgpu out of it).
for p in "${phases[@]}"; do
  [ "$p" = sanitize ] || continue
  run memcheck-kv_cache 90 compute-sanitizer --tool memcheck --error-exitcode 99 $B/test-kv_cache --test-threads=1
  run memcheck-merge_states 60 compute-sanitizer --tool memcheck --error-exitcode 99 $B/test-merge_states --test-threads=1
  run memcheck-cuda_gpu 150 compute-sanitizer --tool memcheck --error-exitcode 99 $B/test-cuda_gpu --test-threads=1
  run racecheck-split 90 compute-sanitizer --tool racecheck --error-exitcode 99 $B/test-cuda_gpu split_kv --test-threads=1
done
for p in "${phases[@]}"; do
  [ "$p" = sanitize-mma ] || continue
  run memcheck-mma 150 env POLYATTN_CUDA_MMA=1 compute-sanitizer --tool memcheck --error-exitcode 99 $B/test-cuda_gpu --test-threads=1
  run racecheck-mma 150 env POLYATTN_CUDA_MMA=1 compute-sanitizer --tool racecheck --error-exitcode 99 $B/test-cuda_gpu long_prefill --test-threads=1
  run synccheck-mma 150 env POLYATTN_CUDA_MMA=1 compute-sanitizer --tool synccheck --error-exitcode 99 $B/test-cuda_gpu long_prefill --test-threads=1
  # The 128-row form (two m16 tiles per warp): racecheck needs more than 100 s here.
  run racecheck-mma128 300 env POLYATTN_CUDA_MMA=1 POLYATTN_CUDA_MMA_ROWS=128 compute-sanitizer --tool racecheck --error-exitcode 99 $B/test-cuda_gpu long_prefill --test-threads=1
done
for p in "${phases[@]}"; do
  [ "$p" = sanitize-prefill ] || continue
  # The tensor-core prefill kernel's small test set, with the two CTA shapes the host picks
  # by default (64 rows on 4 warps, 128 rows on 4 warps) and the 8-warp forms.
  for rw in 64:4 128:4 128:8 256:8; do
    r=${rw%:*} w=${rw#*:}
    run racecheck-prefill$r-$w 150 env POLYATTN_CUDA_MMA=1 POLYATTN_CUDA_MMA_ROWS=$r POLYATTN_CUDA_MMA_WARPS=$w \
      compute-sanitizer --tool racecheck --error-exitcode 99 $B/test-cuda_gpu prefill_kernel_sanitizer_set --test-threads=1
  done
  for tool in memcheck synccheck; do
    run $tool-prefill128 150 env POLYATTN_CUDA_MMA=1 POLYATTN_CUDA_MMA_ROWS=128 compute-sanitizer --tool $tool \
      --error-exitcode 99 $B/test-cuda_gpu prefill_kernel_sanitizer_set --test-threads=1
  done
  run memcheck-large_prefill 150 env POLYATTN_CUDA_MMA=1 compute-sanitizer --tool memcheck --error-exitcode 99 \
    $B/test-cuda_gpu large_prefill --test-threads=1
done
for p in "${phases[@]}"; do
  [ "$p" = hopper-gate ] || continue
  # The wgmma prefill's own tests first (no Vulkan needed) and its SASS; a failure ends the
  # script here, so a broken kernel costs one short call.
  run hopper-cuda_gpu 200 $B/test-cuda_gpu prefill --test-threads=1 --nocapture
  grep -q 'test result: ok' "$OUT"/hopper-cuda_gpu.log || { say "hopper tests failed: stop"; exit 1; }
  for k in paged_attention_wgmma_ws; do
    cubin=$(ls /tmp/polyattn-cache/$k-sm_90a-*.cubin 2>/dev/null | head -1)
    if [ -n "$cubin" ]; then
      echo "HGMMA in $cubin: $(cuobjdump --dump-sass "$cubin" | grep -c HGMMA)"
    else
      echo "no $k cubin in /tmp/polyattn-cache: the kernel did not run"
    fi
  done
done
for p in "${phases[@]}"; do
  [ "$p" = sanitize-hopper ] || continue
  # The wgmma prefill (sm_90, d64 / d128): its small test set under every tool; memcheck of
  # the long prefills.
  for tool in memcheck racecheck synccheck; do
    run $tool-hopper 200 compute-sanitizer --tool $tool --error-exitcode 99 \
      $B/test-cuda_gpu prefill_kernel_sanitizer_set --test-threads=1
  done
  run memcheck-hopper-long 200 compute-sanitizer --tool memcheck --error-exitcode 99 \
    $B/test-cuda_gpu long_prefill --test-threads=1
done
for p in "${phases[@]}"; do
  [ "$p" = sanitize-fp8 ] || continue
  for tool in memcheck racecheck; do
    run $tool-fp8 150 compute-sanitizer --tool $tool --error-exitcode 99 $B/test-cuda_gpu fp8_decode --test-threads=1
  done
done
. $B/on-device.sh
export WGPU_BACKEND=vulkan
for p in "${phases[@]}"; do
  case $p in
    check)
      run info 60 $B/bin-polyattn info
      run check 120 $B/bin-polyattn check ;;
    tests)
      run cuda_gpu 150 $B/test-cuda_gpu --test-threads=1 --nocapture
      for t in attention_correctness kv_cache merge_states validation; do run "$t" 150 $B/test-$t --nocapture; done ;;
    wgpu)
      run wgpu_kernels 150 $B/test-wgpu_kernels --test-threads=1 --nocapture ;;
    mma)
      run mma-cuda_gpu 100 env POLYATTN_CUDA_MMA=1 $B/test-cuda_gpu --test-threads=1 --nocapture
      run mma-attention 60 env POLYATTN_CUDA_MMA=1 $B/test-attention_correctness --nocapture
      run mma-bench 90 env POLYATTN_CUDA_MMA=1 $B/bin-polyattn bench --backend cuda --shapes P2.b1s4k.p16,P2.b8s4k.p16 \
        --budget 0.3 --json "$OUT/cuda-mma.json" --no-svg ;;
    prefill)
      run prefill-bench 90 env POLYATTN_CUDA_MMA=1 $B/bin-polyattn bench --backend cuda --shapes $SHAPES_P --budget 0.3 \
        --json "$OUT/cuda-prefill.json" --no-svg
      run prefill64-cuda_gpu 100 env POLYATTN_CUDA_MMA=1 POLYATTN_CUDA_MMA_ROWS=64 $B/test-cuda_gpu long_prefill --test-threads=1
      run prefill64-bench 90 env POLYATTN_CUDA_MMA=1 POLYATTN_CUDA_MMA_ROWS=64 $B/bin-polyattn bench --backend cuda \
        --shapes $SHAPES_P --budget 0.3 --no-svg ;;
    ncu)
      run ncu-prefill 240 env POLYATTN_CUDA_MMA=1 ncu --clock-control none -k regex:paged_attention_mma --launch-skip 20 \
        --launch-count 1 --section SpeedOfLight --section WarpStateStats --section Occupancy \
        --section LaunchStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section InstructionStats --section SchedulerStats --metrics "$STALLS" \
        $B/bin-polyattn bench --backend cuda --shapes P2.b1s4k.p16 --budget 0.05 --no-svg ;;
    ncu-hopper)
      # One launch of the wgmma prefill on P2.b1s16k: speed of light, tensor-pipe activity,
      # warp states and stalls (where the next Hopper step should go).
      run ncu-hopper 200 ncu --clock-control none -k regex:paged_attention_wgmma \
        --launch-skip 5 --launch-count 1 --section SpeedOfLight --section Occupancy --section SchedulerStats \
        --section WarpStateStats --section LaunchStats --metrics "$STALLS,smsp__inst_executed.sum,sm__cycles_elapsed.avg,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active" \
        $B/bin-polyattn bench --backend cuda --shapes P2.b1s16k.p16 --budget 0.05 --gpu-warmup-secs 0 --no-svg ;;
    ncu-p2)
      # Why P2 at 4k tokens per request runs slower per FLOP than at 32k: one launch each of b8s4k and b1s32k, instructions, tensor
      # pipe activity, active warps and stall reasons side by side.
      for sh in P2.b8s4k.p16 P2.b1s32k.p16; do
        run ncu-$sh 200 env POLYATTN_CUDA_MMA=1 ncu --clock-control none -k regex:paged_attention_mma --launch-skip 5 \
          --launch-count 1 --section SpeedOfLight --section Occupancy --section SchedulerStats \
          --section WarpStateStats --metrics "$STALLS,smsp__inst_executed.sum,sm__cycles_elapsed.avg,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__thread_inst_executed_per_inst_executed.ratio" \
          $B/bin-polyattn bench --backend cuda --shapes $sh --budget 0.05 --gpu-warmup-secs 0 --no-svg
      done ;;
    mma-shapes)
      for rw in 64:4 128:4 128:8 256:8; do
        r=${rw%:*} w=${rw#*:}
        run "mma$r-$w-test" 100 env POLYATTN_CUDA_MMA=1 POLYATTN_CUDA_MMA_ROWS=$r POLYATTN_CUDA_MMA_WARPS=$w \
          $B/test-cuda_gpu long_prefill --test-threads=1
        run "mma$r-$w-bench" 90 env POLYATTN_CUDA_MMA=1 POLYATTN_CUDA_MMA_ROWS=$r POLYATTN_CUDA_MMA_WARPS=$w \
          $B/bin-polyattn bench --backend cuda --shapes $SHAPES_P --budget 0.3 \
          --json "$OUT/mma$r-$w.json" --no-svg
      done ;;
    decode-splits)
      for n in 0 16 24 32 48 64 96 128; do
        if [ $n = 0 ]; then e=(env); else e=(env POLYATTN_CUDA_DECODE_SPLITS=$n); fi
        run "splits$n" 60 "${e[@]}" $B/bin-polyattn bench --backend cuda \
          --shapes D4.b1s32k,D1.b1s4k,D1.b8s4k --budget 0.3 --no-svg
      done ;;
    decode-sanitize)
      # The decode kernel: tests, graph replays, memcheck / racecheck of its sanitizer set,
      # then the decode rows.
      run decode-test 150 $B/test-cuda_gpu decode
      run decode-graph 100 $B/test-cuda_gpu graph
      for tool in memcheck racecheck; do
        run decode-$tool 150 compute-sanitizer --tool $tool \
          --error-exitcode 99 $B/test-cuda_gpu decode_kernel_sanitizer_set --test-threads=1
      done
      run decode-bench 90 $B/bin-polyattn bench --backend cuda \
        --shapes $SHAPES_D --budget 0.3 --json "$OUT/cuda-decode.json" --no-svg ;;
    ncu-decode)
      # The decode kernel of a D4 step (splits merged inside it), two launches.
      run ncu-decode 120 ncu --clock-control none -k regex:paged_decode --launch-skip 20 \
        --launch-count 2 --section SpeedOfLight --section LaunchStats --section Occupancy \
        $B/bin-polyattn bench --backend cuda --shapes D4.b1s32k --budget 0.05 --no-svg ;;
    subk64)
      run subk64-test 100 env POLYATTN_CUDA_MMA=1 POLYATTN_CUDA_MMA_ROWS=128 POLYATTN_CUDA_MMA_SUBK=64 \
        $B/test-cuda_gpu long_prefill --test-threads=1
      run subk64-bench 90 env POLYATTN_CUDA_MMA=1 POLYATTN_CUDA_MMA_ROWS=128 POLYATTN_CUDA_MMA_SUBK=64 \
        $B/bin-polyattn bench --backend cuda --shapes $SHAPES_P --budget 0.3 --no-svg ;;
    fp8-bench)
      run fp8-bench 120 $B/bin-polyattn bench --backend cuda --shapes $SHAPES_D \
        --kv-dtype fp8_e4m3 --budget 0.3 --json "$OUT/cuda-fp8.json" --no-svg ;;
    wgpu-unroll)
      run wgpu-unrolled 150 $B/bin-polyattn bench --backend wgpu --shapes $SHAPES_P,$SHAPES_D --budget 0.3 \
        --json "$OUT/wgpu-unrolled.json" --no-svg
      run wgpu-loops 90 env POLYATTN_WGPU_UNROLL=0 $B/bin-polyattn bench --backend wgpu \
        --shapes P2.b1s4k.p16,D1.b8s4k,D4.b1s32k --budget 0.3 --no-svg ;;
    wgpu-modes)
      # WGPU-only processes have timed the >= 1 GB decode rows several times slower (and
      # bimodal) than a process that ran CUDA first: the same rows both ways,
      # each repetition traced (device region, host time of the call) to stderr in the log.
      run wgpu-only 120 env POLYATTN_BENCH_TRACE=1 $B/bin-polyattn bench --backend wgpu \
        --shapes D1.b8s4k,D1.b16s16k,D1.b64s4k --budget 0.3 --no-svg
      run wgpu-after-cuda 150 env POLYATTN_BENCH_TRACE=1 $B/bin-polyattn bench --backend cuda,wgpu \
        --shapes D1.b8s4k,D1.b16s16k,D1.b64s4k --budget 0.3 --no-svg ;;
    wgpu-f16-sweep)
      # fused-softmax-f16 shapes through its own knobs (rows, keys, threads, register block),
      # each with the specialisation that actually compiled (a shape that does not fit falls
      # back) and the driver's register count (needs the pipeline_stats example: pack.sh
      # --example pipeline_stats).
      for cfg in 64:64:512:4x1 64:64:256:4x4 64:32:512:4x1 48:64:512:4x1; do
        IFS=: read -r rows keys wg blk <<<"$cfg"
        [ -x $B/example-pipeline_stats ] && $B/example-pipeline_stats \
          "${rows}x${keys}:$wg:$blk" 2>&1 | grep -o "Register Count=[0-9]*"
        run f16-r$rows-k$keys-wg$wg-b$blk 60 env POLYATTN_WGPU_LOG_PIPELINES=1 \
          POLYATTN_WGPU_PREFILL=fused-softmax-f16 \
          POLYATTN_WGPU_PREFILL_ROWS_H=$rows POLYATTN_WGPU_PREFILL_KEYS_H=$keys \
          POLYATTN_WGPU_PREFILL_WG_H=$wg POLYATTN_WGPU_PREFILL_BLOCK_H=$blk \
          $B/bin-polyattn bench --backend wgpu --shapes $SHAPES_PH --dtype f16 --budget 0.3 --no-svg
        grep -o "pipeline .attention.*" "$OUT/f16-r$rows-k$keys-wg$wg-b$blk.log" | sort -u
      done ;;
    wgpu-splits)
      # WGPU decode at small batch is latency-bound (D1.b1s4k reads 16.7 MB in
      # 256 workgroups of 128 keys each, ~2 per SM): the rows traced (host call vs device
      # region), then shorter partials / more splits through the tuning knobs.
      run wgpu-trace 60 env POLYATTN_BENCH_TRACE=1 $B/bin-polyattn bench --backend wgpu \
        --shapes D1.b1s4k,D4.b1s32k --budget 0.2 --no-svg
      for mk in 32 64; do
        for ms in 128 256; do
          run wgpu-split$mk-$ms 60 env POLYATTN_WGPU_SPLIT_MIN_KEYS=$mk POLYATTN_WGPU_MAX_SPLITS=$ms \
            POLYATTN_WGPU_TARGET_WORKGROUPS=16384 $B/bin-polyattn bench --backend wgpu \
            --shapes D1.b1s4k,D1.b8s4k,D4.b1s32k --budget 0.3 --no-svg
        done
      done ;;
    wgpu-prefill)
      run t2-attention 150 env POLYATTN_WGPU_PREFILL=fused-softmax $B/test-attention_correctness --nocapture
      run t2wg64-attention 150 env POLYATTN_WGPU_PREFILL=fused-softmax POLYATTN_WGPU_PREFILL_WG=64 \
        $B/test-attention_correctness --nocapture
      run t1-bench 90 $B/bin-polyattn bench --backend wgpu --shapes $SHAPES_P --budget 0.3 \
        --json "$OUT/wgpu-default.json" --no-svg
      for v in 128 64 32; do
        run t2wg$v-bench 90 env POLYATTN_WGPU_PREFILL=fused-softmax POLYATTN_WGPU_PREFILL_WG=$v \
          $B/bin-polyattn bench --backend wgpu --shapes $SHAPES_P --budget 0.3 \
          --json "$OUT/wgpu-fused-wg$v.json" --no-svg
      done
      run t2tile64x16-bench 90 env POLYATTN_WGPU_PREFILL=fused-softmax POLYATTN_WGPU_PREFILL_TILE=64x16 \
        $B/bin-polyattn bench --backend wgpu --shapes $SHAPES_P --budget 0.3 --no-svg ;;
    wgpu-f16)
      run t2h-attention 150 env POLYATTN_WGPU_PREFILL=fused-softmax-f16 $B/test-attention_correctness --nocapture
      run t2h-wgpu_kernels 150 $B/test-wgpu_kernels --test-threads=1 --nocapture
      run t2-f16-bench 90 env POLYATTN_WGPU_PREFILL=fused-softmax $B/bin-polyattn bench --backend wgpu \
        --shapes $SHAPES_PH --dtype f16 --budget 0.3 --json "$OUT/wgpu-fused-f16.json" --no-svg
      for v in 128 64; do
        run t2h-wg$v-bench 90 env POLYATTN_WGPU_PREFILL=fused-softmax-f16 POLYATTN_WGPU_PREFILL_WG=$v \
          $B/bin-polyattn bench --backend wgpu --shapes $SHAPES_PH --dtype f16 --budget 0.3 \
          --json "$OUT/wgpu-fused-f16-wg$v.json" --no-svg
      done
      # the f16 form's own chunk length (its f16 tiles leave room for more keys per chunk).
      for n in 32 64; do
        run t2h-keys$n-bench 90 env POLYATTN_WGPU_PREFILL=fused-softmax-f16 POLYATTN_WGPU_PREFILL_KEYS_H=$n \
          $B/bin-polyattn bench --backend wgpu --shapes $SHAPES_PH --dtype f16 --budget 0.3 --no-svg
      done ;;
    bench)
      run bench 300 $B/bin-polyattn bench --backend cuda,wgpu --shapes $SHAPES_P,$SHAPES_P1,$SHAPES_D,$SHAPES_KG \
        --budget 0.3 --json "$OUT/ours.json" --no-svg ;;
    vulkan-chunks)
      # KV caches past one binding on VULKAN (stored in chunks; indexed per lane on NVIDIA):
      # the chunked tests (caches of 2.5 × 4 GiB) and the D1 row whose cache needs two chunks,
      # beside CUDA's.
      run cache-chunks 300 $B/test-cache_chunks --nocapture
      run mla-chunks 300 $B/test-mla --nocapture latent_caches_past_one_binding
      # (with the D rows: VULKAN's decode now pushes its descriptors)
      run chunks-bench 200 $B/bin-polyattn bench --backend cuda,vulkan --shapes D1.b256s4k,$SHAPES_D \
        --budget 0.3 --json "$OUT/vulkan-chunks.json" --no-svg
      # the MLA rows whose latent caches exceed one binding (4.8 and 2.4 GB), beside CUDA_MLA.
      run chunks-mla-bench 200 $B/bin-polyattn bench --backend CUDA_MLA,VULKAN_MLA \
        --shapes M.h16.b128s32k.q1,M.h128.b64s32k.q1 --budget 0.3 \
        --json "$OUT/vulkan-mla-chunks.json" --no-svg ;;
    hopper)
      # The wgmma prefill after hopper-gate: the shared bodies, then the P rows beside the
      # mma.sync kernel, same lease.
      run hopper-attention 150 $B/test-attention_correctness --nocapture
      run hopper-bench 150 $B/bin-polyattn bench --backend cuda --shapes "$SHAPES_P,$SHAPES_P1" \
        --budget 0.3 --json "$OUT/cuda-wgmma.json" --no-svg
      run hopper-mma-bench 150 env POLYATTN_CUDA_MMA=1 $B/bin-polyattn bench --backend cuda \
        --shapes "$SHAPES_P,$SHAPES_P1" --budget 0.3 --json "$OUT/cuda-mma-sync.json" --no-svg ;;
    hopper-bench)
      # The P / P1 rows of the wgmma prefill beside the mma.sync kernel, same lease.
      run hopper-bench 150 $B/bin-polyattn bench --backend cuda --shapes "$SHAPES_P,$SHAPES_P1" \
        --budget 0.3 --json "$OUT/cuda-wgmma.json" --no-svg
      run hopper-mma-bench 150 env POLYATTN_CUDA_MMA=1 $B/bin-polyattn bench --backend cuda \
        --shapes "$SHAPES_P,$SHAPES_P1" --budget 0.3 --json "$OUT/cuda-mma-sync.json" --no-svg ;;
    torch-p)
      run torch-p 150 env PYTHONUNBUFFERED=1 python3 benches/reference_sdpa.py \
        --shapes "$SHAPES_P,$SHAPES_P1" --budget 0.3 --out "$OUT/torch-p.json" ;;
    torch)
      run torch 150 env PYTHONUNBUFFERED=1 python3 benches/reference_sdpa.py \
        --shapes "$SHAPES_P,$SHAPES_P1,$SHAPES_D" --budget 0.3 --out "$OUT/torch.json" ;;
  esac
done
say done
