#!/usr/bin/env bash
# Speed A/B of two builds on one GPU in one lease: the rows issue 17 names (P2, P1 d128, D1,
# D4, K, G on CUDA and WGPU, and the WGPU f16 prefill rows, which take the cooperative-matrix
# form on the H200), old and new alternating PASSES times, then benches/ab_compare.py (each
# side's fastest median per row; a row slower than 3 % fails).
#
#   OLD=.devbin/old-polyattn NEW=.devbin/bin-polyattn OUT=/tmp/ab bash benches/h200_ab.sh
#
# Both binaries are `polyattn` release builds (`polyattn bench`); logs and JSON go to $OUT.
set -u
OUT=${OUT:-/tmp/ab}
OLD=${OLD:?the old polyattn binary}
NEW=${NEW:?the new polyattn binary}
PASSES=${PASSES:-2}
BUDGET=${BUDGET:-0.2}
mkdir -p "$OUT"
export POLYATTN_CACHE_DIR=/tmp/polyattn-cache
# AB_SHAPES / AB_SHAPES_F16 replace the row lists (an empty AB_SHAPES_F16 skips the f16 rows);
# AB_BACKENDS the backends of the bf16 rows (default cuda,wgpu).
ALL=P2.b1s1k.p16,P2.b1s4k.p16,P2.b1s16k.p16,P2.b1s32k.p16,P2.b8s4k.p16
ALL=$ALL,P1.d128.b16s1k.nc,P1.d128.b4s4k.nc,P1.d128.b4s4k.c,P1.d128.b1s16k.c
ALL=$ALL,D1.b1s4k,D1.b8s4k,D1.b64s4k,D1.b16s16k,D4.b1s32k
ALL=$ALL,K.t1.h8.hnd,K.t4096.h8.hnd,K.t65536.h8.hnd,G.t1024.h32.d128,G.t65536.h32.d128
SHAPES=${AB_SHAPES:-$ALL}
BACKENDS=${AB_BACKENDS:-cuda,wgpu}
SHAPES_F16=${AB_SHAPES_F16-P2.b1s4k.p16,P2.b1s16k.p16,P2.b8s4k.p16}
say() { echo "== $* ($(date +%T))"; }
for pass in $(seq 1 "$PASSES"); do
  for side in old new; do
    bin=$OLD
    [ "$side" = new ] && bin=$NEW
    say "$side pass $pass"
    timeout 400 "$bin" bench --backend "$BACKENDS" --shapes "$SHAPES" --budget "$BUDGET" \
      --json "$OUT/$side-$pass.json" --no-svg --quiet >"$OUT/$side-$pass.log" 2>&1
    echo "-- rc=$? rows=$(grep -c '^|' "$OUT/$side-$pass.log")"
    [ -n "$SHAPES_F16" ] || continue
    timeout 200 "$bin" bench --backend wgpu --dtype f16 --shapes "$SHAPES_F16" --budget "$BUDGET" \
      --json "$OUT/$side-f16-$pass.json" --no-svg --quiet >"$OUT/$side-f16-$pass.log" 2>&1
    echo "-- f16 rc=$?"
  done
done
say compare
python3 benches/ab_compare.py --old "$OUT"/old-*.json --new "$OUT"/new-*.json | tee "$OUT/compare.md"
