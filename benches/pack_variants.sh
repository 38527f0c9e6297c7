#!/usr/bin/env bash
# Stages kernel variants from other branches for h200_lease.sh's `variants` call: for each
# NAME=BRANCH argument, a worktree of BRANCH (../wt-NAME) builds `polyattn` and the cuda_gpu
# test in release, and the two executables land, stripped, in .devbin as bin-polyattn-NAME and
# test-cuda_gpu-NAME; then .devbin (this tree's own binaries, from ../shared/gpu/pack.sh,
# included) is archived into .dz/b.tar.xz. The worktrees share this tree's target directory,
# so only the crate itself is rebuilt per branch.
# Usage, from the repository root after pack.sh: bash benches/pack_variants.sh k=hopper-k-release
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
for spec in "$@"; do
  name=${spec%%=*} branch=${spec#*=}
  wt="$root/../wt-$name"
  [ -d "$wt" ] || git worktree add -q "$wt" "$branch"
  (cd "$wt" && git checkout -q "$branch")
  exe=$(cd "$wt" && CARGO_TARGET_DIR="$wt/target" cargo build --release --bin polyattn --test cuda_gpu --message-format=json \
    2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        kind = "test" if m["profile"].get("test") else "bin"
        print(kind, m["executable"])
')
  while read -r kind path; do
    case $kind in
      bin) cp "$path" ".devbin/bin-polyattn-$name" ;;
      test) cp "$path" ".devbin/test-cuda_gpu-$name" ;;
    esac
  done <<<"$exe"
  strip ".devbin/bin-polyattn-$name" ".devbin/test-cuda_gpu-$name"
  echo "staged $name ($branch at $(git rev-parse --short "$branch"))"
done
mkdir -p .dz
tar cf - -C .devbin . | xz -9e -T2 >.dz/b.tar.xz
ls -l .dz/b.tar.xz
