//! The catalogues the tests translate: a representative set of every specialisation the
//! family generates ([`catalog`]) and the cooperative-matrix form's ([`coop_catalog`]), so
//! that naga validates every code path of the generator without a GPU.

use crate::dtype::DType;

use super::attention::{
    coop_shader_typed, AttentionShader, CombineShader, DecodeShader, Tiled2, DECODE_KEYS_PER_STEP,
    DECODE_WORKGROUP,
};
use super::elementwise::{MergeShader, ProbeShader, ReshapeShader};
use super::mla::MlaShader;
use super::model_ops::ModelShader;
use super::tiles::{
    choose_tile, coop_split_fits, TileKind, ATTENTION_WORKGROUP, TILED2_DEFAULT_BLOCK,
};

/// Activation dtypes.
pub const ACTIVATION_DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];

/// Storage dtypes of a KV cache.
pub const CACHE_DTYPES: [DType; 5] = [
    DType::F32,
    DType::F16,
    DType::Bf16,
    DType::Fp8E4m3,
    DType::Fp8E5m2,
];

/// The coop form's specialisations the tests translate (SPIR-V only: naga's MSL backend
/// knows 8 × 8 simdgroup matrices, its HLSL backend none), with their keys.
pub fn coop_catalog() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (d, (m, n)) in [
        (128, (64, 64)),
        (128, (64, 32)),
        (64, (64, 64)),
        (96, (32, 64)),
    ] {
        for paged in [true, false] {
            for split in [1, 2, 4] {
                if coop_split_fits(d, m, n, split) {
                    for dtype in [DType::F16, DType::Bf16] {
                        let s = coop_shader_typed(d, m, n, split, paged, dtype);
                        out.push((s.key(), s.source()));
                    }
                }
            }
        }
    }
    out
}

/// A representative set of the specialisations the backend generates, as
/// `(key, source, needs_subgroups)`. The dtype accessors do not depend on the tile shape and
/// the tile constants do not depend on the dtypes, so the set crosses them separately:
/// every dtype pairing of the attention kernel at head size 128 (both tile kinds, with and
/// without subgroups), every tile shape chosen for 16, 32 and 48 KiB of workgroup memory at
/// head sizes 4, 36, 64, 80, 128, 256 and 512 (f32, paged and dense, with and without
/// subgroups), the tiled2 and tiled2h prefill forms (see the comments below; the tiled2h
/// modules say `enable f16;` and need `SHADER_FLOAT16` to validate), every variant of the
/// element-wise kernels (they take the head size at run time), the split-KV decode kernel's
/// variants (dtype pairings at head size 128; head sizes,
/// row counts, step lengths and subgroup sizes in f32 and bf16), the two bench probes,
/// every model-operation shader ([`ModelShader::all`]) and the MLA kernels
/// ([`MlaShader::catalog`]).
///
/// [`ModelShader::all`]: super::ModelShader::all
pub fn catalog() -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut push = |key: String, source: String, sg: bool| {
        if seen.insert(key.clone()) {
            out.push((key, source, sg));
        }
    };
    let attn =
        |d: u32, (m, n): (u32, u32), q: DType, kv: DType, paged: bool, sg: bool| AttentionShader {
            head_size: d,
            block_m: m,
            block_n: n,
            q_dtype: q,
            kv_dtype: kv,
            paged,
            subgroups: sg,
            // The GPU form (unrolled) for the subgroup variants, loops for the others:
            // both forms are translated without doubling the catalogue.
            unrolled: sg,
            tiled2: None,
        };
    // The tiled2 form: every dtype pairing at head size 128 in the prefill tile of 48 KiB
    // (the H200's) with subgroups of 32, unrolled; head sizes 4 to 512 in f32 at 32 KiB,
    // paged and dense, with subgroups of 8 (lavapipe) and without, 64 and 128 threads.
    let t2 = |s: AttentionShader, workgroup: u32, max_key_lanes: u32| AttentionShader {
        tiled2: Some(Tiled2 {
            workgroup,
            max_key_lanes,
            half: false,
            block: TILED2_DEFAULT_BLOCK,
            coop: false,
        }),
        ..s
    };
    let half = |s: AttentionShader| AttentionShader {
        tiled2: s.tiled2.map(|t| Tiled2 { half: true, ..t }),
        ..s
    };
    let tile48 = choose_tile(128, 48 * 1024, TileKind::Prefill).expect("d128 fits 48 KiB");
    for q in ACTIVATION_DTYPES {
        for kv in CACHE_DTYPES {
            let s = t2(
                attn(128, tile48, q, kv, true, true),
                ATTENTION_WORKGROUP,
                32,
            );
            push(s.key(), s.source(), true);
        }
        let s = t2(attn(128, tile48, q, q, false, true), 64, 32);
        push(s.key(), s.source(), true);
    }
    // The tiled2h form (f16 activations and cache only): the 48 KiB prefill tile at head
    // size 128, paged and dense, unrolled with subgroups of 32, 128 and 64 threads.
    for (paged, wg) in [(true, ATTENTION_WORKGROUP), (false, 64)] {
        let s = half(t2(
            attn(128, tile48, DType::F16, DType::F16, paged, true),
            wg,
            32,
        ));
        push(s.key(), s.source(), true);
    }
    // The GPU defaults of tiled2h (64 rows x 64 keys, 512 threads, 4 x 1 blocks) and 64 x 32
    // tiles, paged and dense, and tiled2 in f32 in the 32 KiB tile with loops.
    let shaped = |s: AttentionShader, (m, n): (u32, u32), wg: u32, block| AttentionShader {
        block_m: m,
        block_n: n,
        tiled2: s.tiled2.map(|t| Tiled2 {
            workgroup: wg,
            block,
            ..t
        }),
        ..s
    };
    for paged in [true, false] {
        let h = half(t2(
            attn(128, tile48, DType::F16, DType::F16, paged, true),
            ATTENTION_WORKGROUP,
            32,
        ));
        let s = shaped(h, (64, 64), 512, (4, 1));
        push(s.key(), s.source(), true);
        let s = shaped(h, (64, 32), 512, (4, 1));
        push(s.key(), s.source(), true);
    }
    let tile32 = choose_tile(128, 32 * 1024, TileKind::Prefill).expect("d128 fits 32 KiB");
    let f = t2(
        attn(128, tile32, DType::F32, DType::F32, true, false),
        ATTENTION_WORKGROUP,
        1,
    );
    let s = AttentionShader {
        unrolled: false,
        ..shaped(f, tile32, 128, TILED2_DEFAULT_BLOCK)
    };
    push(s.key(), s.source(), false);
    // tiled2h (f16) and tiled2 (f32): head sizes 4 to 512 at 32 KiB with subgroups of 8 and
    // without, loops, paged and dense (for tiled2h: FA partials that end before D4 and
    // several partials per score).
    for d in [4u32, 36, 64, 80, 128, 256, 512] {
        let Some(tile) = choose_tile(d, 32 * 1024, TileKind::Prefill) else {
            continue;
        };
        for (dtype, f16_form) in [(DType::F16, true), (DType::F32, false)] {
            for (sg, kl) in [(false, 1u32), (true, 8)] {
                for (paged, wg) in [(true, ATTENTION_WORKGROUP), (false, 64)] {
                    let base = t2(attn(d, tile, dtype, dtype, paged, sg), wg, kl);
                    let s = AttentionShader {
                        unrolled: false,
                        ..if f16_form { half(base) } else { base }
                    };
                    if s.blocking().is_some() && s.shared_bytes() <= 32 * 1024 {
                        push(s.key(), s.source(), sg);
                    }
                }
            }
        }
    }
    for kind in [TileKind::Decode, TileKind::Prefill] {
        let tile = choose_tile(128, 32 * 1024, kind).expect("d128 fits 32 KiB");
        for sg in [false, true] {
            for q in ACTIVATION_DTYPES {
                for kv in CACHE_DTYPES {
                    let s = attn(128, tile, q, kv, true, sg);
                    push(s.key(), s.source(), sg);
                }
                let s = attn(128, tile, q, q, false, sg);
                push(s.key(), s.source(), sg);
            }
        }
    }
    for d in [4u32, 36, 64, 80, 128, 256, 512] {
        for limit in [16 * 1024u32, 32 * 1024, 48 * 1024] {
            for kind in [TileKind::Decode, TileKind::Prefill] {
                let Some(tile) = choose_tile(d, limit, kind) else {
                    continue;
                };
                for sg in [false, true] {
                    for paged in [true, false] {
                        let s = attn(d, tile, DType::F32, DType::F32, paged, sg);
                        push(s.key(), s.source(), sg);
                    }
                }
            }
        }
    }
    // The split-KV decode kernel: every dtype pairing at head size 128, unrolled for
    // subgroups of 32 (NVIDIA) and with loops for 8 (lavapipe); other head sizes, row
    // counts, step lengths and subgroup sizes (4 to 64) in f32 and bf16 caches, alternately
    // unrolled and not (the unrolled modules are large: naga takes ~1 s for each in debug).
    let decode = |d: u32, rows: u32, q: DType, kv: DType, sg: u32, u: u32, unrolled: bool| {
        let limit = if sg >= 32 { 48 * 1024 } else { 32 * 1024 };
        DecodeShader::choose(d, rows, q, kv, (sg, sg), limit, u, DECODE_WORKGROUP)
            .map(|s| DecodeShader { unrolled, ..s })
    };
    for (sg, unrolled) in [(32u32, true), (8, false)] {
        for q in ACTIVATION_DTYPES {
            for kv in CACHE_DTYPES {
                if let Some(s) = decode(128, 4, q, kv, sg, DECODE_KEYS_PER_STEP, unrolled) {
                    push(s.key(), s.source(), true);
                }
            }
        }
    }
    let mut n = 0usize;
    for sg in [4u32, 16, 64] {
        for d in [4u32, 64, 80, 100, 256, 512] {
            for kv in [DType::F32, DType::Bf16] {
                n += 1;
                let (rows, u) = ([1u32, 8, 2][n % 3], [1u32, 2, 8][n % 3]);
                if let Some(s) = decode(d, rows, DType::F32, kv, sg, u, n.is_multiple_of(2)) {
                    push(s.key(), s.source(), true);
                }
            }
        }
    }
    for q in ACTIVATION_DTYPES {
        let c = CombineShader { out_dtype: q };
        push(c.key(), c.source(), false);
        for cache in CACHE_DTYPES {
            let r = ReshapeShader {
                act_dtype: q,
                cache_dtype: cache,
            };
            push(r.key(), r.source(), false);
        }
        let m = MergeShader { dtype: q };
        push(m.key(), m.source(), false);
    }
    for p in [ProbeShader::Copy, ProbeShader::Fma] {
        push(p.key(), p.source(), false);
    }
    for m in ModelShader::all() {
        push(m.key(), m.source(), false);
    }
    for m in MlaShader::catalog() {
        push(m.key(), m.source(), false);
    }
    out
}
