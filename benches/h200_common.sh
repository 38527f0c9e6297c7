# Sourced by the H200 phase scripts (h200_model.sh, h200_parallel.sh): output folder, binary
# folder, the environment every phase runs in, and `run`, which runs one step under a time
# limit, keeps its whole log in $OUT and prints the lines that say what happened.
OUT=${OUT:-/tmp/h200}
B=${B:-.devbin}
mkdir -p "$OUT"
export POLYATTN_CACHE_DIR=/tmp/polyattn-cache WGPU_BACKEND=vulkan
GGUF=/tmp/SmolLM2-135M-Instruct.Q4_1.gguf
export POLYATTN_SMOLLM2_GGUF=$GGUF
say() { echo "== $* ($(date +%T))"; }
run() { # run NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  say "$name"
  timeout "$secs" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  grep -E 'ran on|identical|equal|SKIP|test result|panicked|FAIL|error|ERROR|\[nccl|\[dcp|\[polyattn\]' "$OUT/$name.log" | head -40
  echo "-- $name rc=$rc"
}
