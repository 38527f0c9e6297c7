#!/usr/bin/env bash
# Attention across ranks on the H200 (one GPU): decode context parallelism's one-device form
# on every backend, NCCL over one rank, the sharded forms under compute-sanitizer, and the
# example Llama split into tensor-parallel shards (tiny; SmolLM2 when its GGUF was joined, as
# benches/h200_model.sh does): every shard on the one device, and every rank with its own
# residual stream and caches summed by a RankGroup (host sums for ranks sharing the GPU; NCCL
# over one rank); on a machine with N GPUs, `--rank-devices each` puts rank r on GPU r.
# Binaries (../shared/gpu/pack.sh --test dcp --test nccl --example generate --bin polyattn,
# plus the example's test harness as test-generate) in $B.
# Usage: bash benches/h200_parallel.sh PHASE... (phases: dcp, nccl, sanitize, tp, generate,
# dcp-bench: the DCP benchmark group on CUDA — with N GPUs and NCCL its rN rows run rank r
# on GPU r, with fewer the ranks share GPU 0 — JSON in $OUT/dcp-bench.json)
set -u
. "$(dirname "$0")/h200_common.sh"
# PyTorch's NCCL wheel (nvidia-nccl-cu13) holds libnccl.so.2; NVLink multicast stays off.
nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
[ -n "$nccl_lib" ] && export LD_LIBRARY_PATH="$nccl_lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
for p in "$@"; do
  case $p in
    dcp) run dcp 300 $B/test-dcp --nocapture ;;
    nccl)
      # NCCL_DEBUG=INFO: the log says which transport NCCL picked; a log without "NCCL ... found"
      # means every NCCL test skipped.
      run nccl 300 env NCCL_DEBUG=INFO $B/test-nccl --nocapture --test-threads 1
      grep -q "\[nccl\] NCCL .* found" "$OUT/nccl.log" || echo "WARNING: NCCL was not found: its tests skipped" ;;
    sanitize)
      run memcheck-dcp 300 compute-sanitizer --tool memcheck --error-exitcode 3 $B/test-dcp sharded
      # One GPU visible: collectives over several ranks may hang under the sanitizer.
      # NCCL's own runtime probes report API errors (kernels not built for this GPU), not ours.
      run memcheck-nccl 200 env CUDA_VISIBLE_DEVICES=0 compute-sanitizer --tool memcheck \
        --report-api-errors no --error-exitcode 3 $B/test-nccl dcp_across rank_groups ;;
    tp) run tp 400 $B/test-generate --nocapture tensor_parallel ranks_on ;;
    generate)
      for n in 1 3; do
        # One rank is one placement.
        places="one each"; [ $n = 1 ] && places=one
        for place in $places; do
          run "generate-tp$n-$place" 200 env POLYATTN_BACKEND=cuda $B/example-generate \
            --model smollm2 --max-tokens 48 --tensor-parallel $n --rank-devices $place \
            "The capital of France is"
          sed -n '1,3p' "$OUT/generate-tp$n-$place.log"
        done
      done ;;
    dcp-bench)
      run dcp-bench 560 $B/bin-polyattn bench --shapes DCP --backend cuda --no-svg --quiet \
        --json "$OUT/dcp-bench.json" ;;
    *) echo "unknown phase $p" ;;
  esac
done
