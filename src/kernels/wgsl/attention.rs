//! The attention kernels' specialisations: [`AttentionShader`] (`paged_attention.wgsl` in its
//! three-phase, fused-softmax (`Tiled2`), fused-softmax f16 and cooperative-matrix forms),
//! [`DecodeShader`] (the split-KV decode kernel, `paged_decode.wgsl`) and [`CombineShader`]
//! (the split-KV combine, `combine_splits.wgsl`). Each is a plain value whose `key()` names
//! its pipeline and whose `source()` is the complete module.

use crate::dtype::DType;

use super::preprocess::{
    buffer, cache_binding, consts, coop_scalarise, cvt_body, cvt_body_f16, kv_buffer,
    kv_storage_type, short, unpack_body, unroll, Access, CacheChunks,
};
use super::sources::{
    ATTENTION_CHUNKS, ATTENTION_COMMON, COMBINE_SPLITS, COMMON, PAGED_ATTENTION,
    PAGED_ATTENTION_COOP, PAGED_DECODE, SOFTMAX_SERIAL, SOFTMAX_SUBGROUP,
};
use super::tiles::{
    attention_shared_bytes, coop_shared_bytes, tiled2_shared_bytes, tiled2h_shared_bytes,
    AttentionBlocking, ATTENTION_WORKGROUP, TILED2_DEFAULT_BLOCK,
};

/// The tiled2 form of `paged_attention.wgsl` (see its header): the next chunk's K and V are
/// loaded into registers while the current chunk computes, key addresses stay in
/// registers, phase B (softmax) is fused into phase A (row max and sum reduced over the
/// row group's lanes with subgroup shuffles), phase C runs whole chunks (zero-padded) with
/// unrolled key steps: 4 barriers per chunk instead of 5 and no serial softmax phase.
/// The shader of [`crate::backends::wgpu::PrefillForm::FusedSoftmax`] and, with `half` /
/// `coop`, of the f16 and cooperative-matrix forms (`POLYATTN_WGPU_PREFILL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tiled2 {
    /// Threads per workgroup (a power of two).
    pub workgroup: u32,
    /// Most lanes a phase-A row group may span: the adapter's smallest subgroup size with
    /// subgroups, 1 without.
    pub max_key_lanes: u32,
    /// The tiled2h form: Q, K, V and P in workgroup memory as f16, Q·K^T and P·V with
    /// `vec4<f16>` FMAs into f16 partial sums flushed into f32 (softmax statistics and the
    /// output accumulators stay f32). Needs the adapter's `SHADER_F16`; the host selects it
    /// for f16 activations and an f16 cache only
    /// ([`crate::backends::wgpu::PrefillForm::FusedSoftmaxF16`]).
    pub half: bool,
    /// Per-thread register block `(keys, cols)`: at least `keys` keys per thread in phase
    /// A and `cols` vec4 output columns per thread in phase C
    /// ([`AttentionBlocking::tiled2_with`]); [`TILED2_DEFAULT_BLOCK`] unless tuned
    /// (`POLYATTN_WGPU_PREFILL_BLOCK`).
    ///
    /// [`AttentionBlocking::tiled2_with`]: super::AttentionBlocking::tiled2_with
    /// [`TILED2_DEFAULT_BLOCK`]: super::TILED2_DEFAULT_BLOCK
    pub block: (u32, u32),
    /// The cooperative-matrix form (`paged_attention_coop.wgsl`): with `half`, both matrix
    /// products on tensor cores through wgpu's experimental cooperative matrices
    /// (16 × 16 × 16 f16 / f32, which the runtime requests only where the adapter offers
    /// them); each 16-row tile shared by `workgroup` / (2·`block_m`) 32-lane subgroups
    /// ([`coop_shader_split`]); `block` is unused.
    pub coop: bool,
}

/// vec4 columns of Q·K^T summed in one f16 partial accumulator of the tiled2h form (`FA`
/// in `shaders/paged_attention.wgsl`): each of its four lanes sums at most this many
/// products before the partial is added to the f32 score, so the score is an f32 sum of
/// short f16 partials and its rounding error stays a fixed fraction of Σ|q_i·k_i| whatever
/// the head size and the logit range (see the shader header for the bound). A multiple of
/// every phase-A step (`DU`: 1, 2 or 4).
pub const TILED2H_PARTIAL_COLUMNS: u32 = 4;

/// vec4 columns per unrolled phase-A step of the tiled2h form (`DU` in
/// `shaders/paged_attention.wgsl`; the f32 forms take the largest of 4, 2, 1 dividing D / 4).
pub const TILED2H_SCORE_STEP: u32 = 2;

/// One specialisation of `paged_attention.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionShader {
    /// Head size (a multiple of 4, at most 512).
    pub head_size: u32,
    /// Query rows per tile.
    pub block_m: u32,
    /// Keys per chunk.
    pub block_n: u32,
    /// dtype of queries and outputs.
    pub q_dtype: DType,
    /// dtype of keys and values as stored (the cache dtype, or the activation dtype for
    /// dense encoder inputs).
    pub kv_dtype: DType,
    /// Keys from the paged cache (`true`) or dense K/V tensors (`false`).
    pub paged: bool,
    /// Phase B with subgroup reductions.
    pub subgroups: bool,
    /// Unroll the loops marked `// @unroll` ([`unroll`]), as GPU drivers need (see
    /// [`DecodeShader::unrolled`]).
    ///
    /// [`unroll`]: super::unroll
    pub unrolled: bool,
    /// The tiled2 form ([`Tiled2`]); `None`: the tiled form (phases A, B, C, 128 threads).
    pub tiled2: Option<Tiled2>,
}

impl AttentionShader {
    /// The pipeline-cache key.
    pub fn key(&self) -> String {
        self.key_for(CacheChunks::ONE)
    }

    /// The key of [`AttentionShader::source_for`].
    pub fn key_for(&self, cache_chunks: CacheChunks) -> String {
        cache_chunks.key(self.plain_key())
    }

    fn plain_key(&self) -> String {
        format!(
            "attention d{} m{} n{} q{} kv{} {} {}{}{}",
            self.head_size,
            self.block_m,
            self.block_n,
            short(self.q_dtype),
            short(self.kv_dtype),
            if self.paged { "paged" } else { "dense" },
            if self.subgroups {
                "subgroups"
            } else {
                "serial"
            },
            if self.unrolled { " unrolled" } else { "" },
            match self.tiled2 {
                Some(t) => format!(
                    " tiled2{} wg{} kl{}{}",
                    if t.half { "h" } else { "" },
                    t.workgroup,
                    t.max_key_lanes,
                    if t.block == TILED2_DEFAULT_BLOCK {
                        String::new()
                    } else {
                        format!(" b{}x{}", t.block.0, t.block.1)
                    },
                )
                .replace(" tiled2h", if t.coop { " coop" } else { " tiled2h" }),
                None => String::new(),
            }
        )
    }

    /// Workgroup memory it uses, in bytes.
    pub fn shared_bytes(&self) -> u32 {
        match self.tiled2 {
            Some(t) if t.coop => coop_shared_bytes(self.head_size, self.block_m, self.block_n),
            Some(t) if t.half => tiled2h_shared_bytes(self.head_size, self.block_m, self.block_n),
            Some(_) => tiled2_shared_bytes(self.head_size, self.block_m, self.block_n),
            None => attention_shared_bytes(self.head_size, self.block_m, self.block_n),
        }
    }

    /// Threads per workgroup.
    pub fn workgroup(&self) -> u32 {
        self.tiled2.map_or(ATTENTION_WORKGROUP, |t| t.workgroup)
    }

    /// The register blocking, or `None` when the tiled2 form cannot run this shape
    /// ([`AttentionBlocking::tiled2`]).
    ///
    /// [`AttentionBlocking::tiled2`]: super::AttentionBlocking::tiled2
    pub fn blocking(&self) -> Option<AttentionBlocking> {
        let d4 = self.head_size / 4;
        match self.tiled2 {
            // The coop form blocks by matrix tiles, not per thread: the tiled form's blocking
            // only fills the header's (unused) per-thread constants.
            Some(t) if t.coop => Some(AttentionBlocking::new(d4, self.block_n)),
            Some(t) => AttentionBlocking::tiled2_with(
                d4,
                self.block_n,
                t.workgroup,
                t.max_key_lanes,
                t.block,
            ),
            None => Some(AttentionBlocking::new(d4, self.block_n)),
        }
    }

    /// The complete WGSL module.
    ///
    /// Panics when [`AttentionShader::blocking`] is `None` (a tiled2 shape the host must
    /// not pick: it checks `blocking()` first).
    pub fn source(&self) -> String {
        self.source_for(CacheChunks::ONE)
    }

    /// The module for a paged cache bound as `cache_chunks` says. Dense K / V ignore it.
    pub fn source_for(&self, cache_chunks: CacheChunks) -> String {
        let cache_chunks = if self.paged {
            cache_chunks
        } else {
            CacheChunks::ONE
        };
        let wg = self.workgroup();
        let d4 = self.head_size / 4;
        let b = self
            .blocking()
            .unwrap_or_else(|| panic!("{}: no register blocking", self.key()));
        let t2 = self.tiled2.is_some();
        let half = self.tiled2.is_some_and(|t| t.half);
        let coop = self.tiled2.is_some_and(|t| t.coop);
        let s_row = self.block_n + if t2 { 4 } else { 1 };
        // tiled2: DU vec4 columns per phase-A step, JU keys per phase-C step (the tiled
        // form keeps one of each, as before the tiled2 form existed).
        let unroll_by = |n: u32| {
            if t2 {
                [4u32, 2, 1]
                    .into_iter()
                    .find(|k| n.is_multiple_of(*k))
                    .unwrap_or(1)
            } else {
                1
            }
        };
        let mut s = format!("// generated: {}\n", self.key_for(cache_chunks));
        s += cache_chunks.enable();
        // The bf16 coop form is the f16 one over bf16 bits: its K / V binding and workgroup
        // tiles are typed f16 here, and the runtime retypes every f16 as bfloat16 in the
        // SPIR-V (the module does no arithmetic in that type: it loads, stores, converts
        // from f32 and feeds the matrix products).
        let bf16_tiles = coop && self.kv_dtype == DType::Bf16;
        let tile_kv = if bf16_tiles {
            DType::F16
        } else {
            self.kv_dtype
        };
        if bf16_tiles {
            s += BF16_TILES_MARKER;
            s += "\n";
        }
        // `enable f16;` only where f16 is used: adapters without SHADER_F16 reject it.
        if half {
            s += "enable f16;\n";
        }
        if coop {
            s += "enable wgpu_cooperative_matrix;\n";
        }
        // Coop form: NQ subgroups per 16-row tile (workgroup = 32 · BM / 16 · NQ), each with
        // NKQ of the chunk's key tiles in phase A and NTQ of the output tiles in phase C; the
        // softmax gives each row LPR = 2 · NQ lanes (RPW rows per subgroup).
        let nq = (wg / (2 * self.block_m)).max(1);
        let coop_c = [
            ("NSG", wg / 32),
            ("NQ", nq),
            ("NT", self.head_size / 16),
            ("NK", self.block_n / 16),
            ("NTQ", self.head_size / 16 / nq),
            ("NKQ", self.block_n / 16 / nq),
            ("RPW", 16 / nq),
            ("LPR", 2 * nq),
            ("LOG_LPR", (2 * nq).ilog2()),
            ("KH", self.block_n / (2 * nq)),
            ("KS", self.head_size + 8),
            ("KV_ROWS", self.block_m.max(self.block_n)),
            ("SS", self.block_n + 4),
            ("PS", self.block_n + 8),
        ];
        let c = [
            ("D", self.head_size),
            ("D4", d4),
            ("BM", self.block_m),
            ("BN", self.block_n),
            ("WG", wg),
            ("KV_ROW", d4 + 1),
            ("S_ROW", s_row),
            ("KPT", b.keys_per_thread),
            ("KL", b.key_lanes),
            ("LOG_KL", b.key_lanes.ilog2()),
            ("RGA", b.score_row_groups),
            ("RPT_A", self.block_m.div_ceil(b.score_row_groups)),
            ("CPT", b.cols_per_thread),
            ("CL", b.col_lanes),
            ("RGC", b.out_row_groups),
            ("RPT_C", self.block_m.div_ceil(b.out_row_groups)),
            // tiled2h steps 2 vec4 columns at a time (faster than 4 or 1 on large GPUs);
            // the f32 form keeps 4.
            (
                "DU",
                if half {
                    TILED2H_SCORE_STEP.min(unroll_by(d4))
                } else {
                    unroll_by(d4)
                },
            ),
            ("JU", unroll_by(self.block_n)),
            ("LPT", (self.block_n * d4).div_ceil(wg)),
            ("KB_LEN", if t2 { 1 } else { self.block_n }),
            // A multiple of every DU (1, 2 or 4).
            ("FA", TILED2H_PARTIAL_COLUMNS),
            // Both tiled2 forms keep two halves of running maxima.
            ("M_BUFS", if t2 { 2 } else { 1 }),
        ];
        s += &consts(&c);
        if coop {
            s += &consts(&coop_c);
            // The lazy rescale's threshold (see paged_attention_coop.wgsl).
            s += "const COOP_TAU: f32 = 8.0;\n";
            // Where the softmax scale goes (see paged_attention_coop.wgsl).
            s += if bf16_tiles {
                "fn q_scale() -> f32 {\n    return 1.0;\n}\nfn s_scale() -> f32 {\n    return params.scale;\n}\n"
            } else {
                "fn q_scale() -> f32 {\n    return params.scale;\n}\nfn s_scale() -> f32 {\n    return 1.0;\n}\n"
            };
        }
        s += &format!("const TILED2: bool = {t2};\nconst F16: bool = {half};\n");
        // The element type of the query, key / value and probability tiles in workgroup
        // memory (SH, SH4): f16 in the tiled2h form, f32 otherwise.
        s += if half {
            "alias SH = f16;\nalias SH4 = vec4<f16>;\n"
        } else {
            "alias SH = f32;\nalias SH4 = vec4<f32>;\n"
        };
        // K / V scales other than 1 exist for fp8 caches only (`WgpuAttentionImpl::kv_scales`).
        s += &format!(
            "const KV_SCALED: bool = {};\n",
            matches!(self.kv_dtype, DType::Fp8E4m3 | DType::Fp8E5m2)
        );
        // Scores / probabilities, row r at r·S_ROW: scalars in the tiled form, vec4s in the
        // tiled2 form (its phase C loads four probabilities of a row at once).
        s += if coop {
            // paged_attention_coop.wgsl declares its own score and probability arrays.
            ""
        } else if half {
            "var<workgroup> s_s: array<vec4<f16>, BM * S_ROW / 4u>;\n\
             fn s_get(i: u32) -> f32 {\n    return f32(s_s[i >> 2u][i & 3u]);\n}\n\
             fn s_set(i: u32, v: f32) {\n    s_s[i >> 2u][i & 3u] = f16(v);\n}\n\
             fn s_get4(i: u32) -> vec4<f16> {\n    return s_s[i >> 2u];\n}\n"
        } else if t2 {
            "var<workgroup> s_s: array<vec4<f32>, BM * S_ROW / 4u>;\n\
             fn s_get(i: u32) -> f32 {\n    return s_s[i >> 2u][i & 3u];\n}\n\
             fn s_set(i: u32, v: f32) {\n    s_s[i >> 2u][i & 3u] = v;\n}\n\
             fn s_get4(i: u32) -> vec4<f32> {\n    return s_s[i >> 2u];\n}\n"
        } else {
            "var<workgroup> s_s: array<f32, BM * S_ROW>;\n\
             fn s_get(i: u32) -> f32 {\n    return s_s[i];\n}\n\
             fn s_set(i: u32, v: f32) {\n    s_s[i] = v;\n}\n\
             fn s_get4(i: u32) -> vec4<f32> {\n    \
             return vec4<f32>(s_s[i], s_s[i + 1u], s_s[i + 2u], s_s[i + 3u]);\n}\n"
        };
        s += &buffer("q", 1, self.q_dtype, Access::Read);
        s += &buffer("out", 8, self.q_dtype, Access::Write);
        // Raw words of four keys' or values' elements, unpacked by kv_cvt4 into the tile
        // type SH4 (tiled2 keeps the raw words in registers while their loads are in flight).
        s += &format!(
            "alias KV_RAW = {};\nfn kv_cvt4(w: KV_RAW) -> SH4 {{\n{}}}\n",
            kv_storage_type(tile_kv, half),
            if half {
                cvt_body_f16(tile_kv)
            } else {
                cvt_body(tile_kv)
            }
        );
        if self.paged {
            // The cache's words (`kv_word`) unpacked to f32 as `kv_load4` (f16 words of the
            // tiled2h form convert in hardware).
            let raw = kv_storage_type(tile_kv, half);
            s += &cache_binding("kv", 2, raw, 4, cache_chunks, None);
            s += "fn kv_load4(a: KB) -> vec4<f32> {\n    let w = kv_word(a);\n";
            s += &if raw == "vec4<f16>" {
                "    return vec4<f32>(w);\n".to_string()
            } else {
                cvt_body(tile_kv)
            };
            s += "}\n";
            s += "@group(0) @binding(3) var<storage, read> block_table: array<i32>;\n";
            s += "fn key_base(pos: u32, kv_head: u32, kv_row: u32) -> KB {\n\
                  \x20   let blk = u32(block_table[kv_row + pos / params.block_size]);\n\
                  \x20   return kv_addr(blk, (pos % params.block_size) * params.tok_stride\n\
                  \x20       + kv_head * params.head_stride);\n}\n\
                  fn k_load4(a: KB) -> vec4<f32> {\n    return kv_load4(a);\n}\n\
                  fn v_load4(a: KB) -> vec4<f32> {\n    return kv_load4(kb_add(a, params.kv_stride));\n}\n\
                  fn k_raw4(a: KB) -> KV_RAW {\n    return kv_word(a);\n}\n\
                  fn v_raw4(a: KB) -> KV_RAW {\n    return kv_word(kb_add(a, params.kv_stride));\n}\n";
            // Power-of-two block sizes (params.block_shift < 32) take a shift and a mask.
            s += "fn key_base_fast(pos: u32, kv_head: u32, kv_row: u32) -> KB {\n\
                  \x20   var b = pos / params.block_size;\n\
                  \x20   var off = pos % params.block_size;\n\
                  \x20   if params.block_shift < 32u {\n\
                  \x20       b = pos >> params.block_shift;\n\
                  \x20       off = pos & (params.block_size - 1u);\n\
                  \x20   }\n\
                  \x20   let blk = u32(block_table[kv_row + b]);\n\
                  \x20   return kv_addr(blk, off * params.tok_stride + kv_head * params.head_stride);\n}\n";
        } else {
            s += &kv_buffer("k", 2, tile_kv, half);
            s += &kv_buffer("v", 3, tile_kv, half);
            // Dense K / V are addressed by a plain element index.
            s += "alias KB = u32;\nfn kb_add(a: KB, d: u32) -> KB {\n    return a + d;\n}\n";
            s += "fn key_base(pos: u32, kv_head: u32, kv_row: u32) -> u32 {\n\
                  \x20   return ((kv_row + pos) * params.num_kv_heads + kv_head) * D;\n}\n\
                  fn key_base_fast(pos: u32, kv_head: u32, kv_row: u32) -> u32 {\n\
                  \x20   return key_base(pos, kv_head, kv_row);\n}\n\
                  fn k_raw4(e: u32) -> KV_RAW {\n    return k_buf[e >> 2u];\n}\n\
                  fn v_raw4(e: u32) -> KV_RAW {\n    return v_buf[e >> 2u];\n}\n";
        }
        s += COMMON;
        s += ATTENTION_COMMON;
        if coop {
            let all: Vec<(&str, u32)> = c.iter().chain(coop_c.iter()).copied().collect();
            s += &unroll(ATTENTION_CHUNKS, &all);
            s += &coop_scalarise(&unroll(PAGED_ATTENTION_COOP, &all), &all);
            return s;
        }
        let softmax = if self.subgroups {
            SOFTMAX_SUBGROUP
        } else {
            SOFTMAX_SERIAL
        };
        if self.unrolled {
            s += &unroll(softmax, &c);
            s += &unroll(ATTENTION_CHUNKS, &c);
            s += &unroll(PAGED_ATTENTION, &c);
        } else {
            s += softmax;
            s += ATTENTION_CHUNKS;
            s += PAGED_ATTENTION;
        }
        s
    }
}

/// The coop form ([`Tiled2::coop`]) for f16 activations and an f16 cache: `block_m` rows
/// (16 per 32-lane subgroup), `block_n` keys per chunk.
pub fn coop_shader(head_size: u32, block_m: u32, block_n: u32, paged: bool) -> AttentionShader {
    coop_shader_split(head_size, block_m, block_n, 1, paged)
}

/// The first line after the key of a coop module whose f16 types stand for bfloat16: the
/// runtime retypes them (`SPV_KHR_bfloat16`, [`crate::device::coop_spirv::retype_f16_as_bf16`]);
/// only a device with bf16 cooperative matrices runs it.
pub const BF16_TILES_MARKER: &str = "// bf16 tiles: every f16 type of this module is bfloat16";

/// The coop form with `split` subgroups per 16-row tile (see [`coop_split_fits`]): more
/// subgroups per workgroup, fewer output matrices (registers) per subgroup.
///
/// [`coop_split_fits`]: super::coop_split_fits
pub fn coop_shader_split(
    head_size: u32,
    block_m: u32,
    block_n: u32,
    split: u32,
    paged: bool,
) -> AttentionShader {
    coop_shader_typed(head_size, block_m, block_n, split, paged, DType::F16)
}

/// The coop form for `dtype` activations with a same-dtype cache: f16, or bf16 on devices
/// with bf16 cooperative matrices (the module is the f16 one over bf16 bits, marked with
/// [`BF16_TILES_MARKER`]).
pub fn coop_shader_typed(
    head_size: u32,
    block_m: u32,
    block_n: u32,
    split: u32,
    paged: bool,
    dtype: DType,
) -> AttentionShader {
    AttentionShader {
        head_size,
        block_m,
        block_n,
        q_dtype: dtype,
        kv_dtype: dtype,
        paged,
        subgroups: true,
        unrolled: true,
        tiled2: Some(Tiled2 {
            workgroup: block_m * 2 * split,
            max_key_lanes: 32,
            half: true,
            block: TILED2_DEFAULT_BLOCK,
            coop: true,
        }),
    }
}

/// Threads per workgroup of the split-KV decode kernel (`paged_decode.wgsl`).
pub const DECODE_WORKGROUP: u32 = 128;

/// Most query rows one item of the decode kernel takes: queries and accumulators of every
/// row live in registers.
pub const DECODE_MAX_ROWS: u32 = 8;

/// Keys each key group loads per step (`U`): 2·U granule loads per lane and step (twice
/// that in flight: the next step's loads are issued before this step computes).
pub const DECODE_KEYS_PER_STEP: u32 = 4;

/// One specialisation of `paged_decode.wgsl`, the split-KV decode kernel (needs subgroup
/// operations).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecodeShader {
    /// Head size (a multiple of [`DecodeShader::granule`]).
    pub head_size: u32,
    /// Query rows per item (a power of two ≤ [`DECODE_MAX_ROWS`]).
    pub rows: u32,
    /// Lanes that share one key (`TPK`: a power of two dividing the subgroup size).
    pub lanes_per_key: u32,
    /// Keys per key group per step (`U`).
    pub keys_per_step: u32,
    /// Threads per workgroup (a multiple of the subgroup size).
    pub workgroup: u32,
    /// dtype of queries and outputs.
    pub q_dtype: DType,
    /// dtype of the cache as stored.
    pub kv_dtype: DType,
    /// Unroll the loops marked `// @unroll` ([`unroll`]): what GPU drivers need to keep the
    /// per-thread arrays in registers. CPU adapters (lavapipe) run the loops as written:
    /// LLVM compiles the unrolled kernel several times slower and runs it no faster.
    ///
    /// [`unroll`]: super::unroll
    pub unrolled: bool,
}

fn prev_pow2(x: u32) -> u32 {
    if x == 0 {
        0
    } else {
        1 << (31 - x.leading_zeros())
    }
}

impl DecodeShader {
    /// Bytes of one granule, the unit every load moves: 16 (a `vec4<u32>`), 8 (a
    /// `vec2<u32>`) for fp8 caches, so that every cache dtype but f32 has 8 elements per
    /// granule and the same per-lane register footprint (16-byte fp8 granules would double
    /// the query and accumulator registers of a lane and halve the lanes per key).
    pub fn granule_bytes(kv_dtype: DType) -> u32 {
        if kv_dtype.size_in_bytes() == 1 {
            8
        } else {
            16
        }
    }

    /// Elements of `kv_dtype` in one granule.
    pub fn granule(kv_dtype: DType) -> u32 {
        Self::granule_bytes(kv_dtype) / kv_dtype.size_in_bytes() as u32
    }

    /// The specialisation for items of up to `max_rows` rows, or `None` when this kernel
    /// cannot run them: a head size that is not a whole number of granules, more rows than
    /// [`DECODE_MAX_ROWS`], subgroup sizes that do not divide the workgroup, or workgroup
    /// memory beyond `max_shared_bytes`.
    #[allow(clippy::too_many_arguments)]
    pub fn choose(
        head_size: u32,
        max_rows: u32,
        q_dtype: DType,
        kv_dtype: DType,
        subgroup_sizes: (u32, u32),
        max_shared_bytes: u32,
        keys_per_step: u32,
        workgroup: u32,
    ) -> Option<DecodeShader> {
        let g = Self::granule(kv_dtype);
        let (sg_min, sg_max) = subgroup_sizes;
        if head_size == 0
            || !head_size.is_multiple_of(g)
            || max_rows == 0
            || max_rows > DECODE_MAX_ROWS
            || sg_min == 0
            || sg_max == 0
            || !workgroup.is_power_of_two()
            || !workgroup.is_multiple_of(sg_max)
            || !(1..=16).contains(&keys_per_step)
        {
            return None;
        }
        let tpk = prev_pow2(head_size / g).min(prev_pow2(sg_min)).min(32);
        if tpk == 0 || workgroup < tpk {
            return None;
        }
        let s = DecodeShader {
            head_size,
            rows: max_rows.next_power_of_two(),
            lanes_per_key: tpk,
            keys_per_step,
            workgroup,
            q_dtype,
            kv_dtype,
            unrolled: true,
        };
        (s.shared_bytes() <= max_shared_bytes).then_some(s)
    }

    /// Key groups per workgroup.
    pub fn key_groups(&self) -> u32 {
        self.workgroup / self.lanes_per_key
    }

    /// Workgroup memory it uses, in bytes.
    pub fn shared_bytes(&self) -> u32 {
        self.key_groups() * (self.head_size / 4 * 16 + self.rows * 8)
    }

    /// The pipeline-cache key.
    pub fn key(&self) -> String {
        self.key_for(CacheChunks::ONE)
    }

    /// The key of [`DecodeShader::source_for`].
    pub fn key_for(&self, cache_chunks: CacheChunks) -> String {
        cache_chunks.key(self.plain_key())
    }

    fn plain_key(&self) -> String {
        format!(
            "decode d{} r{} t{} u{} w{} q{} kv{}{}",
            self.head_size,
            self.rows,
            self.lanes_per_key,
            self.keys_per_step,
            self.workgroup,
            short(self.q_dtype),
            short(self.kv_dtype),
            if self.unrolled { " unrolled" } else { "" }
        )
    }

    /// The complete WGSL module.
    pub fn source(&self) -> String {
        self.source_for(CacheChunks::ONE)
    }

    /// The module for a cache bound as `cache_chunks` says.
    pub fn source_for(&self, cache_chunks: CacheChunks) -> String {
        let g = Self::granule(self.kv_dtype);
        let v4g = g / 4;
        let ng = self.head_size / g;
        let gpt = ng.div_ceil(self.lanes_per_key);
        let mut s = format!("// generated: {}\n", self.key_for(cache_chunks));
        s += cache_chunks.enable();
        let c = [
            ("D", self.head_size),
            ("D4", self.head_size / 4),
            ("G", g),
            ("V4G", v4g),
            ("NG", ng),
            ("TPK", self.lanes_per_key),
            ("LOG_TPK", self.lanes_per_key.trailing_zeros()),
            ("GPT", gpt),
            ("QV", gpt * v4g),
            ("WG", self.workgroup),
            ("NKG", self.key_groups()),
            ("U", self.keys_per_step),
            ("ROWS", self.rows),
            ("FULL", ng.is_multiple_of(self.lanes_per_key) as u32),
        ];
        s += &consts(&c);
        s += if Self::granule_bytes(self.kv_dtype) == 8 {
            "alias Gran = vec2<u32>;\n"
        } else {
            "alias Gran = vec4<u32>;\n"
        };
        s += &buffer("q", 1, self.q_dtype, Access::Read);
        s += &buffer("out", 8, self.q_dtype, Access::Write);
        s += &cache_binding("kv", 2, "Gran", g, cache_chunks, None);
        s += "// Elements 4i..4i+3 of a 16-byte granule of the cache, as f32.\n\
              fn unpack4(w: Gran, i: u32) -> vec4<f32> {\n";
        s += &unpack_body(self.kv_dtype);
        s += "}\n";
        s += COMMON;
        s += ATTENTION_COMMON;
        if self.unrolled {
            s += &unroll(PAGED_DECODE, &c);
        } else {
            s += PAGED_DECODE;
        }
        s
    }
}

/// One specialisation of `combine_splits.wgsl` (head size and decode rows are run-time
/// parameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CombineShader {
    /// Output dtype.
    pub out_dtype: DType,
}

/// Threads per workgroup of the split-KV combine (at least a quarter of the largest head
/// size: one column of four elements per thread and split lane).
pub const COMBINE_WORKGROUP: u32 = 128;

/// Partials a split lane of the combine loads before it merges them (loads in flight).
pub const COMBINE_BATCH: u32 = 4;

impl CombineShader {
    /// The pipeline-cache key.
    pub fn key(&self) -> String {
        format!("combine {}", short(self.out_dtype))
    }

    /// The complete WGSL module.
    pub fn source(&self) -> String {
        let mut s = format!("// generated: {}\n", self.key());
        let c = [("WG", COMBINE_WORKGROUP), ("BATCH", COMBINE_BATCH)];
        s += &consts(&c);
        s += &buffer("out", 3, self.out_dtype, Access::Write);
        s += COMMON;
        s += &unroll(COMBINE_SPLITS, &c);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_every_field() {
        let a = AttentionShader {
            head_size: 64,
            block_m: 16,
            block_n: 32,
            q_dtype: DType::Bf16,
            kv_dtype: DType::Fp8E5m2,
            paged: true,
            subgroups: true,
            unrolled: true,
            tiled2: None,
        };
        assert_eq!(
            a.key(),
            "attention d64 m16 n32 qbf16 kve5m2 paged subgroups unrolled"
        );
        let b = AttentionShader {
            tiled2: Some(Tiled2 {
                workgroup: 64,
                max_key_lanes: 32,
                half: false,
                block: TILED2_DEFAULT_BLOCK,
                coop: false,
            }),
            ..a
        };
        assert_eq!(
            b.key(),
            "attention d64 m16 n32 qbf16 kve5m2 paged subgroups unrolled tiled2 wg64 kl32"
        );
        assert!(b.source().contains("const TILED2: bool = true;"));
        assert!(a.source().contains("const D4: u32 = 16u;"));
        let h = AttentionShader {
            q_dtype: DType::F16,
            kv_dtype: DType::F16,
            tiled2: b.tiled2.map(|t| Tiled2 { half: true, ..t }),
            ..b
        };
        assert_eq!(
            h.key(),
            "attention d64 m16 n32 qf16 kvf16 paged subgroups unrolled tiled2h wg64 kl32"
        );
        // `enable f16;` only in the tiled2h form, before any declaration.
        let src = h.source();
        assert!(src.lines().nth(1) == Some("enable f16;"), "{src}");
        assert!(src.contains("const F16: bool = true;"));
        for other in [a, b] {
            let src = other.source();
            assert!(
                !src.lines().any(|l| l.starts_with("enable")),
                "{}",
                other.key()
            );
        }
    }
}
