#!/usr/bin/env bash
# The model runner on the H200: the compute operations and the generate example on every
# backend (CPU on the host's cores, CUDA, WGPU through Vulkan), then tokens/s of SmolLM2.
# Binaries (built on the CI-like machine, see ../shared/gpu/pack.sh) in $B:
#   test-compute, test-generate (the example's tests), example-generate.
# The speed phase appends one JSON line per run to $OUT/generate-h200.jsonl (the source of the
# "Model generation" section of benches/RESULTS.md).
# SmolLM2's GGUF is too large for one transfer (94 MiB > 64 MiB): it travels in parts
# (.m1/p, .m2/p, ...), one per call on one warm machine. A path carried by one call is gone in
# the next, so each call runs `stash` (its part to /tmp) and the last runs `join`.
# Usage: bash benches/h200_model.sh PHASE... (phases: stash, join, compute, sanitize, graphs,
# identity, attention, tiny, smollm2, speed, weights, profile, profile-graphs, gpu-tests,
# graph-replay, decode-cores, sanitize-decode-cores, decode-cores-ncu, cache-write-ab). `profile` writes $OUT/ncu-smollm2-{1,8}.csv: every kernel of a short eager run with
# its duration (ncu), for benches/ncu_steps.py to split into steps and sum by kernel.
set -u
. "$(dirname "$0")/h200_common.sh"
for p in "$@"; do
  case $p in
    stash)
      for i in 1 2 3; do [ -f .m$i/p ] && cp .m$i/p /tmp/m$i; done; ls -la /tmp/m? ;;
    join)
      for i in 1 2 3; do [ -f .m$i/p ] && cp .m$i/p /tmp/m$i; done
      cat /tmp/m[1-3] >"$GGUF" && sha256sum "$GGUF" ;;
    compute)
      run compute 200 $B/test-compute --nocapture ;;
    sanitize)
      # The linear kernels under memcheck and racecheck (the tiled form's shared memory), and
      # the sampler (model_sample: its scan and bisection share shared memory across rows).
      run memcheck-linear 240 compute-sanitizer --tool memcheck --error-exitcode 3 $B/test-compute linear
      run racecheck-linear 240 compute-sanitizer --tool racecheck --error-exitcode 3 $B/test-compute linear_fused
      run memcheck-sample 240 compute-sanitizer --tool memcheck --error-exitcode 3 $B/test-compute sample
      run racecheck-sample 240 compute-sanitizer --tool racecheck --error-exitcode 3 $B/test-compute sample
      run synccheck-sample 240 compute-sanitizer --tool synccheck --error-exitcode 3 $B/test-compute sample ;;
    graphs)
      # Replayed steps against eager ones, and the cache written by the projection or by
      # attention (greedy tokens equal).
      run graph-tests 200 $B/test-generate --nocapture graph_tests tiny_model_cache ;;
    identity)
      run smollm2-identity 300 $B/test-generate --nocapture smollm2_says_paris ;;
    attention)
      run attention 240 $B/test-attention_correctness ;;
    tiny)
      run tiny 300 $B/test-generate --nocapture tiny
      for be in cpu cuda wgpu; do
        run "gen-tiny-$be" 60 env POLYATTN_BACKEND=$be $B/example-generate --max-tokens 32
      done ;;
    smollm2)
      run smollm2-tests 400 $B/test-generate --nocapture smollm2 ;;
    speed)
      P=("The capital of France is" "def fibonacci(n):" "Once upon a time, in a small village," "The three primary colors are" \
         "import numpy as np" "The Eiffel Tower is located in" "My favourite food is" "In 1969, Neil Armstrong")
      # CUDA and VULKAN capture decode steps by default; their eager rows come with --eager.
      # cuda-serial: dependent launches off (the A/B of POLYATTN_CUDA_DEPENDENT_LAUNCH).
      for run_as in cuda cuda:--eager cuda-serial vulkan vulkan:--eager wgpu cpu; do
        tag=${run_as/:--eager/-eager}; be=${tag%%-*}; flag=${run_as#*:}; [ "$flag" = "$run_as" ] && flag=
        dl=1; json="$OUT/generate-h200.jsonl"
        [ "$tag" = cuda-serial ] && dl=0 && json="$OUT/generate-h200-serial.jsonl"
        for n in 1 8; do
          run "smollm2-$tag-$n" 180 env POLYATTN_BACKEND=$be POLYATTN_CUDA_DEPENDENT_LAUNCH=$dl $B/example-generate --model smollm2 --max-tokens 128 --roofline $flag --json "$json" "${P[@]:0:$n}"
        done
      done ;;
    weights)
      # The projections in bf16 / f16 (half the bytes a decode step reads) against f32, same
      # lease, interleaved, on every backend that runs them.
      P=("The capital of France is" "def fibonacci(n):" "Once upon a time, in a small village," "The three primary colors are" \
         "import numpy as np" "The Eiffel Tower is located in" "My favourite food is" "In 1969, Neil Armstrong")
      for be in cuda vulkan wgpu cpu; do
        for n in 1 8; do
          for w in f32 bf16 f16; do
            run "smollm2-$be-$w-$n" 180 env POLYATTN_BACKEND=$be $B/example-generate --model smollm2 --max-tokens 128 --roofline --weights $w --json "$OUT/generate-h200-weights.jsonl" "${P[@]:0:$n}"
          done
        done
      done ;;
    gpu-tests)
      # The CUDA GPU tests (on sm_90 the Hopper prefill) and the shared attention bodies.
      run cuda-gpu 200 $B/test-cuda_gpu --test-threads=1
      run attention 200 $B/test-attention_correctness ;;
    graph-replay)
      run graph-replay 120 $B/test-graph_replay --nocapture ;;
    decode-cores)
      # The CUDA-core decode kernel (paged_decode_cores.cu): its test (CUDA only); the shared
      # attention bodies are the attention phase, the sanitizers sanitize-decode-cores, its ncu
      # A/B decode-cores-ncu.
      run decode-cores 120 $B/test-cuda_gpu --nocapture decode_cores ;;
    sanitize-decode-cores)
      run memcheck-decode-cores 120 compute-sanitizer --tool memcheck --error-exitcode 3 $B/test-cuda_gpu decode_cores
      run racecheck-decode-cores 200 compute-sanitizer --tool racecheck --error-exitcode 3 $B/test-cuda_gpu decode_cores ;;
    decode-cores-ncu)
      # One launch of each decode kernel under ncu for the decode_cores test's batches
      # (POLYATTN_CUDA_DECODE=1: paged_decode_cores.cu; 0: paged_attention.cu).
      for dec in 1 0; do
        say "ncu decode $dec"
        POLYATTN_CUDA_DECODE=$dec timeout 120 ncu --clock-control none \
          --kernel-name regex:'paged_decode_cores|paged_attention_dpl2|combine_splits' \
          --metrics gpu__time_duration.sum --csv --print-units base $B/test-cuda_gpu decode_cores \
          >"$OUT/ncu-decode$dec.csv" 2>&1
        echo "-- rc=$?"
      done ;;
    cache-write-ab)
      # The KV cache written by the Q/K/V projection (the default) or by the attention layer's
      # own launch (--separate-cache-write), CUDA and VULKAN with graphs, WGPU eager, one and
      # eight prompts, twice, interleaved: $OUT/generate-h200-cache-{fused,separate}.jsonl.
      P=("The capital of France is" "def fibonacci(n):" "Once upon a time, in a small village," "The three primary colors are" \
         "import numpy as np" "The Eiffel Tower is located in" "My favourite food is" "In 1969, Neil Armstrong")
      for rep in 1 2; do
        for be in cuda vulkan wgpu; do
          for n in 1 8; do
            for cw in fused separate; do
              flag=; [ $cw = separate ] && flag=--separate-cache-write
              run "smollm2-cache-$cw-$be-$n-$rep" 120 env POLYATTN_BACKEND=$be $B/example-generate --model smollm2 \
                --max-tokens 128 --roofline $flag --json "$OUT/generate-h200-cache-$cw.jsonl" "${P[@]:0:$n}"
            done
          done
        done
      done ;;
    profile-graphs)
      # Every kernel of replayed decode steps (ncu profiles each graph node), 1 and 8 prompts,
      # 48 tokens: $OUT/ncu-graphs-{1,8}.csv for benches/ncu_steps.py; then the 8-token GEMV
      # bodies in detail (speed of light, warp states, occupancy): $OUT/ncu-gemv8.log.
      PR=("The capital of France is" "def fibonacci(n):" "Once upon a time, in a small village," "The three primary colors are" \
          "import numpy as np" "The Eiffel Tower is located in" "My favourite food is" "In 1969, Neil Armstrong")
      for n in 1 8; do
        say "ncu graphs smollm2 $n"
        POLYATTN_BACKEND=cuda timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum \
          --csv --print-units base $B/example-generate --model smollm2 --no-warmup --max-tokens 48 \
          "${PR[@]:0:$n}" >"$OUT/ncu-graphs-$n.csv" 2>"$OUT/ncu-graphs-$n.log"
        echo "-- rc=$? $(wc -l <"$OUT/ncu-graphs-$n.csv") lines"
      done
      say "ncu gemv8"
      POLYATTN_BACKEND=cuda timeout 300 ncu --clock-control none --kernel-name regex:'model_linear_gemv(8|1)_' \
        --launch-skip 400 --launch-count 12 --section SpeedOfLight --section WarpStateStats \
        --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats \
        $B/example-generate --model smollm2 --eager --no-warmup --max-tokens 12 "${PR[@]}" >"$OUT/ncu-gemv8.log" 2>&1
      echo "-- rc=$?" ;;
    profile)
      for n in 1 8; do
        PR=("The capital of France is" "def fibonacci(n):" "Once upon a time, in a small village," "The three primary colors are" \
            "import numpy as np" "The Eiffel Tower is located in" "My favourite food is" "In 1969, Neil Armstrong")
        say "ncu smollm2 $n"
        POLYATTN_BACKEND=cuda timeout 300 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum \
          --csv --print-units base $B/example-generate --model smollm2 --eager --no-warmup --max-tokens 4 \
          "${PR[@]:0:$n}" >"$OUT/ncu-smollm2-$n.csv" 2>"$OUT/ncu-smollm2-$n.log"
        echo "-- rc=$? $(wc -l <"$OUT/ncu-smollm2-$n.csv") lines"
      done ;;
  esac
done
say done
