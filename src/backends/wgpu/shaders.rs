//! WGSL generation: every pipeline the wgpu backend runs is one of the shaders in
//! `shaders/*.wgsl`, specialised by a generated header.
//!
//! The header holds the compile-time constants (head size, tile shape, workgroup size) and
//! the typed accessors of every buffer whose element type varies: `<name>_load4(e)` returns
//! the four elements starting at element `e` (a multiple of 4) as `vec4<f32>`, and
//! `<name>_store4(e, v)` (or `(e, v, scale)` for a cache) writes four. f32 buffers are
//! `array<vec4<f32>>`; f16 and bf16 buffers are `array<vec2<u32>>` (two elements per u32,
//! unpacked with integer arithmetic, so no adapter feature is needed); fp8 buffers are
//! `array<u32>` (four elements per u32). Every access therefore touches whole 32-bit words
//! owned by one thread: no two threads ever write halves of the same word. The one
//! exception is the tiled2h prefill form of the attention kernel ([`Tiled2::half`]), which
//! needs `SHADER_F16`: it binds an f16 KV source as `array<vec4<f16>>` (still whole words
//! of one thread) and is the only module that says `enable f16;`.
//!
//! A specialisation is a plain value ([`AttentionShader`], [`CombineShader`],
//! [`ReshapeShader`], [`MergeShader`], [`ModelShader`]); its
//! [`key`](AttentionShader::key) names the compiled pipeline in the device's cache and its
//! `source()` is the complete WGSL module.
//! [`catalog`] lists a representative set of every kind for the naga translation test.

use crate::dtype::DType;

const COMMON: &str = include_str!("../../../shaders/common.wgsl");
const ATTENTION_COMMON: &str = include_str!("../../../shaders/attention_common.wgsl");
const PAGED_ATTENTION: &str = include_str!("../../../shaders/paged_attention.wgsl");
const ATTENTION_CHUNKS: &str = include_str!("../../../shaders/attention_chunks.wgsl");
const PAGED_ATTENTION_COOP: &str = include_str!("../../../shaders/paged_attention_coop.wgsl");
const PAGED_DECODE: &str = include_str!("../../../shaders/paged_decode.wgsl");
const SOFTMAX_SERIAL: &str = include_str!("../../../shaders/softmax_serial.wgsl");
const SOFTMAX_SUBGROUP: &str = include_str!("../../../shaders/softmax_subgroup.wgsl");
const COMBINE_SPLITS: &str = include_str!("../../../shaders/combine_splits.wgsl");
const RESHAPE_AND_CACHE: &str = include_str!("../../../shaders/reshape_and_cache.wgsl");
const MERGE_ATTN_STATES: &str = include_str!("../../../shaders/merge_attn_states.wgsl");
const PROBE_COPY: &str = include_str!("../../../shaders/probe_copy.wgsl");
const PROBE_FMA: &str = include_str!("../../../shaders/probe_fma.wgsl");
const MODEL_OPS_COMMON: &str = include_str!("../../../shaders/model_ops_common.wgsl");
const MODEL_OPS_LINEAR: &str = include_str!("../../../shaders/model_ops_linear.wgsl");
const MODEL_OPS_GEMV: &str = include_str!("../../../shaders/model_ops_gemv.wgsl");
const MODEL_OPS_RMS_NORM: &str = include_str!("../../../shaders/model_ops_rms_norm.wgsl");
const MODEL_OPS_GATHER: &str = include_str!("../../../shaders/model_ops_gather.wgsl");
const MODEL_OPS_ROPE: &str = include_str!("../../../shaders/model_ops_rope.wgsl");
const MODEL_OPS_ELEMENTWISE: &str = include_str!("../../../shaders/model_ops_elementwise.wgsl");

/// Threads per workgroup of the attention kernel.
pub const ATTENTION_WORKGROUP: u32 = 128;
/// Threads per workgroup of the element-wise kernels (reshape, merge, combine).
pub const ELEMENTWISE_WORKGROUP: u32 = 64;

/// WGSL storage type, element count per array entry.
fn storage_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "vec4<f32>",
        DType::F16 | DType::Bf16 => "vec2<u32>",
        DType::Fp8E4m3 | DType::Fp8E5m2 => "u32",
        DType::I32 | DType::I64 => "u32",
    }
}

fn load_body(name: &str, dtype: DType) -> String {
    let buf = format!("{name}_buf[e >> 2u]");
    match dtype {
        DType::F32 => format!("    return {buf};\n"),
        DType::F16 => format!(
            "    let w = {buf};\n    return vec4<f32>(f16_bits_to_f32(w.x), f16_bits_to_f32(w.x >> 16u), \
             f16_bits_to_f32(w.y), f16_bits_to_f32(w.y >> 16u));\n"
        ),
        DType::Bf16 => format!(
            "    let w = {buf};\n    return vec4<f32>(bitcast<f32>(w.x << 16u), \
             bitcast<f32>(w.x & 0xffff0000u), bitcast<f32>(w.y << 16u), \
             bitcast<f32>(w.y & 0xffff0000u));\n"
        ),
        DType::Fp8E4m3 | DType::Fp8E5m2 => {
            format!("    let w = {buf};\n    return {};\n", fp8x4(dtype, "w"))
        }
        DType::I32 | DType::I64 => "    return vec4<f32>(0.0);\n".into(),
    }
}

/// Body of a function of `w` (the storage type of four elements) returning them as
/// `vec4<f32>`: `load_body`'s unpacking, for words already loaded.
fn cvt_body(dtype: DType) -> String {
    format!("    return {};\n", cvt_expr(dtype))
}

/// The expression of [`cvt_body`]: the four elements of the words `w` as `vec4<f32>`.
fn cvt_expr(dtype: DType) -> String {
    match dtype {
        DType::F32 => "w".into(),
        DType::F16 => "vec4<f32>(f16_bits_to_f32(w.x), f16_bits_to_f32(w.x >> 16u), \
                       f16_bits_to_f32(w.y), f16_bits_to_f32(w.y >> 16u))"
            .into(),
        DType::Bf16 => "vec4<f32>(bitcast<f32>(w.x << 16u), \
                        bitcast<f32>(w.x & 0xffff0000u), bitcast<f32>(w.y << 16u), \
                        bitcast<f32>(w.y & 0xffff0000u))"
            .into(),
        DType::Fp8E4m3 | DType::Fp8E5m2 => fp8x4(dtype, "w"),
        DType::I32 | DType::I64 => "vec4<f32>(0.0)".into(),
    }
}

/// Body of the tiled2h form's `kv_cvt4`: the four elements of `w` as `vec4<f16>`. An f16
/// cache is bound as `array<vec4<f16>>` ([`kv_buffer`]), so its words need no unpacking;
/// other dtypes are unpacked to f32 and rounded to f16 (the host never selects the form for
/// them, see `WgpuAttentionImpl::tile_shader`, but the module stays valid).
fn cvt_body_f16(dtype: DType) -> String {
    match dtype {
        DType::F16 => "    return w;\n".into(),
        _ => format!("    return vec4<f16>({});\n", cvt_expr(dtype)),
    }
}

/// The WGSL type of four elements of a `dtype` K / V source as the attention kernel reads
/// them: [`storage_type`], except for f16 in the tiled2h form (`half`), which binds f16
/// data as `array<vec4<f16>>` (8 bytes, one thread's whole words, as every other access).
fn kv_storage_type(dtype: DType, half: bool) -> &'static str {
    if half && dtype == DType::F16 {
        "vec4<f16>"
    } else {
        storage_type(dtype)
    }
}

/// Declaration and `<name>_load4` of a read-only K / V binding: [`buffer`], or for f16 in
/// the tiled2h form (`half`) an `array<vec4<f16>>` whose loads convert in hardware (naga
/// cannot bitcast a u32 to `vec2<f16>`, so the packed-u32 binding would need a round trip
/// through f32 per element).
fn kv_buffer(name: &str, binding: u32, dtype: DType, half: bool) -> String {
    if kv_storage_type(dtype, half) == storage_type(dtype) {
        return buffer(name, binding, dtype, Access::Read);
    }
    format!(
        "@group(0) @binding({binding}) var<storage, read> {name}_buf: array<vec4<f16>>;\n\
         fn {name}_load4(e: u32) -> vec4<f32> {{\n    return vec4<f32>({name}_buf[e >> 2u]);\n}}\n"
    )
}

fn store_body(name: &str, dtype: DType) -> String {
    let buf = format!("{name}_buf[e >> 2u]");
    match dtype {
        DType::F32 => format!("    {buf} = v;\n"),
        DType::F16 => format!(
            "    {buf} = vec2<u32>(f32_to_f16_bits(v.x) | (f32_to_f16_bits(v.y) << 16u), \
             f32_to_f16_bits(v.z) | (f32_to_f16_bits(v.w) << 16u));\n"
        ),
        DType::Bf16 => format!(
            "    {buf} = vec2<u32>(f32_to_bf16_bits(v.x) | (f32_to_bf16_bits(v.y) << 16u), \
             f32_to_bf16_bits(v.z) | (f32_to_bf16_bits(v.w) << 16u));\n"
        ),
        DType::Fp8E4m3 | DType::Fp8E5m2 => {
            let f = if dtype == DType::Fp8E4m3 {
                "f32_to_e4m3"
            } else {
                "f32_to_e5m2"
            };
            format!(
                "    {buf} = {f}(v.x, scale) | ({f}(v.y, scale) << 8u) | ({f}(v.z, scale) << 16u) \
                 | ({f}(v.w, scale) << 24u);\n"
            )
        }
        DType::I32 | DType::I64 => String::new(),
    }
}

/// How a generated buffer accessor is used.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    /// `<name>_load4(e)`.
    Read,
    /// `<name>_store4(e, v)`.
    Write,
    /// `<name>_store4(e, v, scale)`: the fp8 quantisation scale (ignored by other dtypes).
    WriteScaled,
}

/// Declaration and accessor of one typed buffer.
fn buffer(name: &str, binding: u32, dtype: DType, access: Access) -> String {
    let mode = if access == Access::Read {
        "read"
    } else {
        "read_write"
    };
    let mut s = format!(
        "@group(0) @binding({binding}) var<storage, {mode}> {name}_buf: array<{}>;\n",
        storage_type(dtype)
    );
    match access {
        Access::Read => {
            s += &format!("fn {name}_load4(e: u32) -> vec4<f32> {{\n");
            s += &load_body(name, dtype);
        }
        Access::Write => {
            s += &format!("fn {name}_store4(e: u32, v: vec4<f32>) {{\n");
            s += "    let scale = 1.0;\n";
            s += &store_body(name, dtype);
        }
        Access::WriteScaled => {
            s += &format!("fn {name}_store4(e: u32, v: vec4<f32>, scale: f32) {{\n");
            s += &store_body(name, dtype);
        }
    }
    s += "}\n";
    s
}

/// Expands the loops of a shader template marked `// @unroll`: the marked line must be
/// followed by `for (var X = 0u; X < N; X = X + 1u) {`, N a product (`*`) of integer
/// literals and names in `consts`, its body ending at the matching `}` line. The body is
/// repeated N times, each copy in its own `{ }` block with the identifier X replaced by
/// the literal `Ku`, so every array index that depends only on unrolled loop variables
/// is a constant expression: drivers keep such arrays in registers, where a loop the
/// driver does not unroll would leave them in (slow, per-thread) local memory. Marked
/// loops may nest; their bodies must not `break` or `continue`.
pub fn unroll(src: &str, consts: &[(&str, u32)]) -> String {
    let lines: Vec<&str> = src.lines().collect();
    let mut out = String::with_capacity(src.len() * 2);
    for l in expand_unrolled(&lines, consts) {
        out += &l;
        out.push('\n');
    }
    out
}

fn expand_unrolled(lines: &[&str], consts: &[(&str, u32)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "// @unroll" {
            out.push(lines[i].to_string());
            i += 1;
            continue;
        }
        let head = lines
            .get(i + 1)
            .unwrap_or_else(|| panic!("@unroll at line {i} has no loop"));
        let (var, count) = parse_unrolled_for(head, consts).unwrap_or_else(|| {
            panic!("@unroll needs `for (var X = 0u; X < N; X = X + 1u) {{`: {head}")
        });
        let mut depth = 0i32;
        let mut end = None;
        for (j, l) in lines.iter().enumerate().skip(i + 1) {
            depth += l.matches('{').count() as i32 - l.matches('}').count() as i32;
            if depth == 0 {
                end = Some(j);
                break;
            }
        }
        let end = end.unwrap_or_else(|| panic!("unbalanced loop after @unroll: {head}"));
        let body = expand_unrolled(&lines[i + 2..end], consts);
        let indent: String = head.chars().take_while(|c| c.is_whitespace()).collect();
        for k in 0..count {
            out.push(format!("{indent}{{"));
            let lit = format!("{k}u");
            for l in &body {
                out.push(replace_ident(l, &var, &lit));
            }
            out.push(format!("{indent}}}"));
        }
        i = end + 1;
    }
    out
}

fn parse_unrolled_for(line: &str, consts: &[(&str, u32)]) -> Option<(String, u32)> {
    let rest = line.trim().strip_prefix("for (var ")?;
    let (var, rest) = rest.split_once(" = 0u; ")?;
    let (cond_var, rest) = rest.split_once(" < ")?;
    let (bound, step) = rest.split_once("; ")?;
    if cond_var != var || step != format!("{var} = {var} + 1u) {{") {
        return None;
    }
    let mut n = 1u32;
    for f in bound.split('*').map(str::trim) {
        let v = match f.trim_end_matches('u').parse::<u32>() {
            Ok(v) => v,
            Err(_) => consts.iter().find(|(name, _)| *name == f)?.1,
        };
        n = n.checked_mul(v)?;
    }
    Some((var.to_string(), n))
}

/// `line` with every identifier token equal to `var` replaced by `with`.
fn replace_ident(line: &str, var: &str, with: &str) -> String {
    let mut out = String::with_capacity(line.len() + 8);
    let mut tok = String::new();
    let flush = |tok: &mut String, out: &mut String| {
        if tok == var {
            out.push_str(with);
        } else {
            out.push_str(tok);
        }
        tok.clear();
    };
    for ch in line.chars() {
        if ch.is_ascii_alphanumeric() || ch == '_' {
            tok.push(ch);
        } else {
            flush(&mut tok, &mut out);
            out.push(ch);
        }
    }
    flush(&mut tok, &mut out);
    out
}

/// WGSL for the four fp8 values (`dtype` E4M3 or E5M2) packed in the u32 `word`, lowest byte
/// first, as a `vec4<f32>` (not yet multiplied by the scale; `e4m3x4_to_f32` /
/// `e5m2x4_to_f32` of common.wgsl, exact and branch-free).
fn fp8x4(dtype: DType, word: &str) -> String {
    let f = if dtype == DType::Fp8E4m3 {
        "e4m3x4_to_f32"
    } else {
        "e5m2x4_to_f32"
    };
    format!("{f}({word})")
}

fn consts(pairs: &[(&str, u32)]) -> String {
    pairs
        .iter()
        .map(|(n, v)| format!("const {n}: u32 = {v}u;\n"))
        .collect()
}

fn short(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::Bf16 => "bf16",
        DType::Fp8E4m3 => "e4m3",
        DType::Fp8E5m2 => "e5m2",
        DType::I32 => "i32",
        DType::I64 => "i64",
    }
}

/// Which of the two work-item kinds a tile shape serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TileKind {
    /// Short queries (decode, speculative decode): few rows, split-KV.
    Decode,
    /// Long queries: many rows per tile, no split.
    Prefill,
}

/// Tile shapes tried in order (rows BM, keys BN); the first that fits the adapter's
/// workgroup memory is used.
fn tile_candidates(kind: TileKind) -> &'static [(u32, u32)] {
    match kind {
        TileKind::Prefill => &[
            (64, 32),
            (32, 32),
            (32, 16),
            (16, 16),
            (16, 8),
            (8, 8),
            (4, 8),
        ],
        TileKind::Decode => &[(16, 32), (16, 16), (8, 16), (8, 8), (4, 8)],
    }
}

/// Bytes of workgroup memory the attention kernel needs for a tile shape.
pub fn attention_shared_bytes(head_size: u32, block_m: u32, block_n: u32) -> u32 {
    let d4 = head_size / 4;
    block_m * d4 * 16 // queries
        + block_n * (d4 + 1) * 16 // keys, then values (rows padded by one vec4)
        + block_m * (block_n + 1) * 4 // scores / probabilities
        + block_m * 5 * 4 // m, l, alpha, position, head
        + block_n * 4 // key addresses
}

/// The first tile shape of `kind` whose workgroup memory fits `max_shared_bytes`.
pub fn choose_tile(head_size: u32, max_shared_bytes: u32, kind: TileKind) -> Option<(u32, u32)> {
    tile_candidates(kind)
        .iter()
        .copied()
        .find(|&(m, n)| attention_shared_bytes(head_size, m, n) <= max_shared_bytes)
}

/// How `paged_attention.wgsl` spreads a tile over its [`ATTENTION_WORKGROUP`] threads: in
/// phase A (scores) each thread computes `keys_per_thread` keys of `ceil(BM /
/// score_row_groups)` rows, in phase C (P·V) `cols_per_thread` vec4 columns of `ceil(BM /
/// out_row_groups)` rows. Why blocks: every shared-memory load then feeds several dot
/// products (a 4 × 4 block of a 64 × 32 tile loads 8 vec4s for 16 dot products, where one
/// key per thread loaded 17).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionBlocking {
    /// Keys per thread in phase A (divides BN).
    pub keys_per_thread: u32,
    /// Threads sharing a row group in phase A: BN / keys_per_thread.
    pub key_lanes: u32,
    /// Row groups in phase A: WG / key_lanes.
    pub score_row_groups: u32,
    /// vec4 output columns per thread in phase C (divides D / 4).
    pub cols_per_thread: u32,
    /// Threads sharing a row group in phase C: (D / 4) / cols_per_thread.
    pub col_lanes: u32,
    /// Row groups in phase C: WG / col_lanes.
    pub out_row_groups: u32,
}

impl AttentionBlocking {
    /// The blocking for `d4` vec4 columns and tiles of `block_n` keys.
    pub fn new(d4: u32, block_n: u32) -> Self {
        let wg = ATTENTION_WORKGROUP;
        let divisor = |n: u32| [4u32, 2, 1].into_iter().find(|k| n % k == 0).unwrap_or(1);
        let keys_per_thread = divisor(block_n);
        let key_lanes = block_n / keys_per_thread;
        let cols_per_thread = divisor(d4);
        let col_lanes = d4 / cols_per_thread;
        AttentionBlocking {
            keys_per_thread,
            key_lanes,
            score_row_groups: (wg / key_lanes).max(1),
            cols_per_thread,
            col_lanes,
            out_row_groups: (wg / col_lanes).max(1),
        }
    }

    /// The blocking of the tiled2 form ([`Tiled2`]) for `d4` vec4 columns, tiles of
    /// `block_n` keys and `wg` threads, whose phase-A row groups span at most
    /// `max_key_lanes` lanes (they reduce over them with subgroup shuffles; 1 without
    /// subgroups). Key lanes: the largest power of two that divides `block_n` and `wg`, is
    /// at most `max_key_lanes` and leaves at least 4 keys per thread (a 4-key block loads
    /// each query vec4 once for 4 dot products). `None` when `wg` is not a power of two or
    /// `block_n` is not a positive multiple of 4.
    pub fn tiled2(d4: u32, block_n: u32, wg: u32, max_key_lanes: u32) -> Option<Self> {
        Self::tiled2_with(d4, block_n, wg, max_key_lanes, TILED2_DEFAULT_BLOCK)
    }

    /// [`AttentionBlocking::tiled2`] with another per-thread block `(keys, cols)`
    /// ([`Tiled2::block`]): at least `keys` keys per thread in phase A where the lanes
    /// allow (4, 8 or 16), and `cols` vec4 output columns per thread in phase C (1, 2, 4 or
    /// 8; the largest of 4, 2, 1 dividing `d4` when `cols` does not, or when `d4 / cols`
    /// column lanes would outnumber the threads). `None` as `tiled2`, or for a `keys` that
    /// is not a power of two from 1 to 16.
    pub fn tiled2_with(
        d4: u32,
        block_n: u32,
        wg: u32,
        max_key_lanes: u32,
        (keys, cols): (u32, u32),
    ) -> Option<Self> {
        if !wg.is_power_of_two() || block_n == 0 || block_n % 4 != 0 || d4 == 0 {
            return None;
        }
        if !keys.is_power_of_two() || keys > 16 {
            return None;
        }
        let cap = max_key_lanes.max(1).min(wg).min((block_n / keys).max(1));
        let key_lanes = (0..=cap.ilog2())
            .rev()
            .map(|e| 1u32 << e)
            .find(|kl| block_n % kl == 0)
            .unwrap_or(1);
        let cols_per_thread = if cols > 0 && d4 % cols == 0 && d4 / cols <= wg {
            cols
        } else {
            [4u32, 2, 1].into_iter().find(|k| d4 % k == 0).unwrap_or(1)
        };
        let col_lanes = d4 / cols_per_thread;
        Some(AttentionBlocking {
            keys_per_thread: block_n / key_lanes,
            key_lanes,
            score_row_groups: wg / key_lanes,
            cols_per_thread,
            col_lanes,
            out_row_groups: (wg / col_lanes).max(1),
        })
    }
}

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
    pub block: (u32, u32),
    /// The cooperative-matrix form (`paged_attention_coop.wgsl`): with `half`, both matrix
    /// products on tensor cores through wgpu's experimental cooperative matrices
    /// ([`coop_supported`]); each 16-row tile shared by `workgroup` / (2·`block_m`) 32-lane
    /// subgroups ([`coop_shader_split`]); `block` is unused.
    pub coop: bool,
}

/// Replaces the coop form's arrays of cooperative matrices (`var NAME: array<T, N>;`,
/// indexed only by the literals the unroller leaves: `NAME[Ku]`) by N named variables
/// `NAME_K`, so no matrix goes through an array in function memory. (First suspected of
/// the coop form's wrong results on the H200; the cause was the workgroup layout, see
/// `coop_spirv`, and `tests/wgpu_coop.rs`'s kernel-shaped probe is exact with arrays. The
/// named form is what was measured and verified there.) A length that is neither a
/// header constant nor a literal leaves the array as it is.
fn coop_scalarise(src: &str, consts: &[(&str, u32)]) -> String {
    let mut out = String::with_capacity(src.len());
    let mut arrays: Vec<(String, u32)> = Vec::new();
    for line in src.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("var ") {
            if let Some((name, ty)) = rest.split_once(": array<coop_mat") {
                let ty = format!("coop_mat{ty}");
                if let Some((elem, n)) = ty.trim_end_matches(">;").rsplit_once(", ") {
                    let len = consts
                        .iter()
                        .find(|(c, _)| *c == n)
                        .map(|&(_, v)| v)
                        .or_else(|| n.trim_end_matches('u').parse().ok());
                    let Some(n) = len else {
                        out += line;
                        out.push('\n');
                        continue;
                    };
                    for k in 0..n {
                        out += &format!("    var {name}_{k}: {elem};\n");
                    }
                    arrays.push((name.to_string(), n));
                    continue;
                }
            }
        }
        let mut l = line.to_string();
        for (name, n) in &arrays {
            for k in 0..*n {
                l = l.replace(&format!("{name}[{k}u]"), &format!("{name}_{k}"));
            }
        }
        out += &l;
        out.push('\n');
    }
    out
}

/// Query rows per tile of the coop form by default (4 subgroups of 16 rows).
pub const COOP_ROWS: u32 = 64;
/// Keys per chunk of the coop form by default.
pub const COOP_KEYS: u32 = 64;

/// The cooperative-matrix configuration the coop form needs: 16 × 16 × 16, f16 A / B, f32
/// C (what NVIDIA's and AMD's Vulkan drivers offer for tensor cores / WMMA).
pub fn coop_supported(props: &[wgpu::CooperativeMatrixProperties]) -> bool {
    props.iter().any(|p| {
        p.m_size == 16
            && p.n_size == 16
            && p.k_size == 16
            && p.ab_type == wgpu::CooperativeScalarType::F16
            && p.cr_type == wgpu::CooperativeScalarType::F32
    })
}

/// Bytes of workgroup memory the coop form needs: kv_s (the Q tile, then K / V, f16 rows of
/// D + 8), s_s (f32 scores, rows of BN + 4; later the staging tiles), p_s (f16
/// probabilities, rows of BN + 8) and the per-row statistics.
pub fn coop_shared_bytes(head_size: u32, block_m: u32, block_n: u32) -> u32 {
    block_m.max(block_n) * (head_size + 8) * 2
        + block_m * (block_n + 4) * 4
        + block_m * (block_n + 8) * 2
        + block_m * 9 * 4
        + block_m / 16 * 4
}

/// The tiled2 forms' default per-thread block ([`Tiled2::block`]): ≥ 4 keys per thread in
/// phase A, 4 vec4 columns per thread in phase C.
pub const TILED2_DEFAULT_BLOCK: (u32, u32) = (4, 4);

/// Bytes of workgroup memory the tiled2 form needs for a tile shape: the tiled form's
/// ([`attention_shared_bytes`]) with score rows padded to a multiple of 4 floats (BN + 4,
/// so phase C loads four probabilities at once), no key addresses, and one more float per
/// row (the new running maxima).
pub fn tiled2_shared_bytes(head_size: u32, block_m: u32, block_n: u32) -> u32 {
    tiled2_bytes_with(head_size, block_m, block_n, 4)
}

/// Bytes of workgroup memory the tiled2h form ([`Tiled2::half`]) needs for a tile shape:
/// the tiled2 form's ([`tiled2_shared_bytes`]) with queries, keys / values and
/// probabilities stored as f16 (half of their bytes); the per-row statistics stay f32.
pub fn tiled2h_shared_bytes(head_size: u32, block_m: u32, block_n: u32) -> u32 {
    tiled2_bytes_with(head_size, block_m, block_n, 2)
}

/// The tiled2 forms' workgroup memory with `elem` bytes per query, key, value and
/// probability element.
fn tiled2_bytes_with(head_size: u32, block_m: u32, block_n: u32, elem: u32) -> u32 {
    let d4 = head_size / 4;
    block_m * d4 * 4 * elem // queries
        + block_n * (d4 + 1) * 4 * elem // keys, then values
        + block_m * (block_n + 4) * elem // probabilities
        + block_m * 6 * 4 // m (2 halves), l, alpha, position, head
        + 4 // the unused key-address slot
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
    pub unrolled: bool,
    /// The tiled2 form ([`Tiled2`]); `None`: the tiled form (phases A, B, C, 128 threads).
    pub tiled2: Option<Tiled2>,
}

impl AttentionShader {
    /// The pipeline-cache key.
    pub fn key(&self) -> String {
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
                [4u32, 2, 1].into_iter().find(|k| n % k == 0).unwrap_or(1)
            } else {
                1
            }
        };
        let mut s = format!("// generated: {}\n", self.key());
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
            kv_storage_type(self.kv_dtype, half),
            if half {
                cvt_body_f16(self.kv_dtype)
            } else {
                cvt_body(self.kv_dtype)
            }
        );
        if self.paged {
            s += &kv_buffer("kv", 2, self.kv_dtype, half);
            s += "@group(0) @binding(3) var<storage, read> block_table: array<i32>;\n";
            s += "fn key_base(pos: u32, kv_head: u32, kv_row: u32) -> u32 {\n\
                  \x20   let blk = u32(block_table[kv_row + pos / params.block_size]);\n\
                  \x20   return blk * params.block_stride + (pos % params.block_size) * params.tok_stride\n\
                  \x20       + kv_head * params.head_stride;\n}\n\
                  fn k_load4(e: u32) -> vec4<f32> {\n    return kv_load4(e);\n}\n\
                  fn v_load4(e: u32) -> vec4<f32> {\n    return kv_load4(e + params.kv_stride);\n}\n\
                  fn k_raw4(e: u32) -> KV_RAW {\n    return kv_buf[e >> 2u];\n}\n\
                  fn v_raw4(e: u32) -> KV_RAW {\n    return kv_buf[(e + params.kv_stride) >> 2u];\n}\n";
            // Power-of-two block sizes (params.block_shift < 32) take a shift and a mask.
            s += "fn key_base_fast(pos: u32, kv_head: u32, kv_row: u32) -> u32 {\n\
                  \x20   var b = pos / params.block_size;\n\
                  \x20   var off = pos % params.block_size;\n\
                  \x20   if params.block_shift < 32u {\n\
                  \x20       b = pos >> params.block_shift;\n\
                  \x20       off = pos & (params.block_size - 1u);\n\
                  \x20   }\n\
                  \x20   let blk = u32(block_table[kv_row + b]);\n\
                  \x20   return blk * params.block_stride + off * params.tok_stride + kv_head * params.head_stride;\n}\n";
        } else {
            s += &kv_buffer("k", 2, self.kv_dtype, half);
            s += &kv_buffer("v", 3, self.kv_dtype, half);
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
            || head_size % g != 0
            || max_rows == 0
            || max_rows > DECODE_MAX_ROWS
            || sg_min == 0
            || sg_max == 0
            || !workgroup.is_power_of_two()
            || workgroup % sg_max != 0
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
        let g = Self::granule(self.kv_dtype);
        let v4g = g / 4;
        let ng = self.head_size / g;
        let gpt = ng.div_ceil(self.lanes_per_key);
        let mut s = format!("// generated: {}\n", self.key());
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
            ("FULL", (ng % self.lanes_per_key == 0) as u32),
        ];
        s += &consts(&c);
        s += if Self::granule_bytes(self.kv_dtype) == 8 {
            "alias Gran = vec2<u32>;\n"
        } else {
            "alias Gran = vec4<u32>;\n"
        };
        s += &buffer("q", 1, self.q_dtype, Access::Read);
        s += &buffer("out", 8, self.q_dtype, Access::Write);
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

/// Body of `unpack4(w, i)` for a granule of `dtype`.
fn unpack_body(dtype: DType) -> String {
    match dtype {
        DType::F32 => "    return bitcast<vec4<f32>>(w);\n".into(),
        DType::Bf16 => "    let a = w[2u * i];\n    let b = w[2u * i + 1u];\n    \
                        return vec4<f32>(bitcast<f32>(a << 16u), bitcast<f32>(a & 0xffff0000u), \
                        bitcast<f32>(b << 16u), bitcast<f32>(b & 0xffff0000u));\n"
            .into(),
        DType::F16 => "    let a = w[2u * i];\n    let b = w[2u * i + 1u];\n    \
                       return vec4<f32>(f16_bits_to_f32(a), f16_bits_to_f32(a >> 16u), \
                       f16_bits_to_f32(b), f16_bits_to_f32(b >> 16u));\n"
            .into(),
        DType::Fp8E4m3 | DType::Fp8E5m2 => {
            format!("    let x = w[i];\n    return {};\n", fp8x4(dtype, "x"))
        }
        DType::I32 | DType::I64 => "    return vec4<f32>(0.0);\n".into(),
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

/// One specialisation of `reshape_and_cache.wgsl` (the head size is a run-time parameter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReshapeShader {
    /// dtype of the new keys and values.
    pub act_dtype: DType,
    /// dtype the cache stores.
    pub cache_dtype: DType,
}

impl ReshapeShader {
    /// The pipeline-cache key.
    pub fn key(&self) -> String {
        format!(
            "reshape {} -> {}",
            short(self.act_dtype),
            short(self.cache_dtype)
        )
    }

    /// The complete WGSL module.
    pub fn source(&self) -> String {
        let mut s = format!("// generated: {}\n", self.key());
        s += &consts(&[("WG", ELEMENTWISE_WORKGROUP)]);
        s += &buffer("key", 1, self.act_dtype, Access::Read);
        s += &buffer("value", 2, self.act_dtype, Access::Read);
        s += &buffer("cache", 4, self.cache_dtype, Access::WriteScaled);
        s += COMMON;
        s += RESHAPE_AND_CACHE;
        s
    }
}

/// One specialisation of `merge_attn_states.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MergeShader {
    /// dtype of the partial and merged outputs.
    pub dtype: DType,
}

impl MergeShader {
    /// The pipeline-cache key.
    pub fn key(&self) -> String {
        format!("merge {}", short(self.dtype))
    }

    /// The complete WGSL module.
    pub fn source(&self) -> String {
        let mut s = format!("// generated: {}\n", self.key());
        s += &consts(&[("WG", ELEMENTWISE_WORKGROUP)]);
        s += &buffer("po", 1, self.dtype, Access::Read);
        s += &buffer("so", 3, self.dtype, Access::Read);
        s += &buffer("out", 5, self.dtype, Access::Write);
        s += COMMON;
        s += MERGE_ATTN_STATES;
        s
    }
}

/// The ceiling probes of `polyattn bench` (`probe_copy.wgsl`, `probe_fma.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeShader {
    /// A vec4 buffer copy (bandwidth).
    Copy,
    /// An f32 FMA loop (compute).
    Fma,
}

impl ProbeShader {
    /// The pipeline-cache key.
    pub fn key(&self) -> String {
        match self {
            ProbeShader::Copy => "probe copy".into(),
            ProbeShader::Fma => "probe fma".into(),
        }
    }

    /// The complete WGSL module.
    pub fn source(&self) -> String {
        let body = match self {
            ProbeShader::Copy => PROBE_COPY,
            ProbeShader::Fma => PROBE_FMA,
        };
        format!("// generated: {}\n{COMMON}{body}", self.key())
    }
}

/// Threads per workgroup of the model operations' kernels (`model_ops_*.wgsl`).
pub const MODEL_WORKGROUP: u32 = 256;
/// Output rows (and features) of one tile of the tiled linear kernel.
pub const LINEAR_TILE: u32 = 64;
/// K step of the tiled linear kernel.
pub const LINEAR_TILE_K: u32 = 16;
/// Threads that reduce one output feature in the GEMV kernel.
pub const GEMV_LANES: u32 = 32;
/// Output features per workgroup of the GEMV kernel.
pub const GEMV_FEATURES_PER_GROUP: u32 = MODEL_WORKGROUP / GEMV_LANES;
/// Largest token count `linear` runs as a GEMV (`model_ops_gemv.wgsl` keeps one partial
/// sum per token in a vec4); more tokens take the tiled kernel.
pub const GEMV_MAX_TOKENS: usize = 4;

// model_ops_linear.wgsl: one thread per 4×4 outputs of the tile, and whole loads per thread
// (BM·BK / V a multiple of WG for V = 4, hence for V = 1); model_ops_gemv.wgsl: whole
// groups of lanes, a power of two for the tree reduction (as is WG for rms_norm's).
const _: () = assert!((LINEAR_TILE / 4) * (LINEAR_TILE / 4) == MODEL_WORKGROUP);
const _: () = assert!((LINEAR_TILE * LINEAR_TILE_K / 4) % MODEL_WORKGROUP == 0);
const _: () = assert!(MODEL_WORKGROUP % GEMV_LANES == 0 && GEMV_LANES.is_power_of_two());
const _: () = assert!(MODEL_WORKGROUP.is_power_of_two());

/// One specialisation of the model operations' shaders (`shaders/model_ops_*.wgsl`, used by
/// `crate::compute`). `vec4` selects loads of four f32 at a time, which needs the row
/// length (K, H, or the element count) to be a multiple of 4.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModelShader {
    /// `linear` for T > [`GEMV_MAX_TOKENS`]: the tiled GEMM (`model_ops_linear.wgsl`).
    LinearTiled {
        /// vec4 loads (K % 4 == 0).
        vec4: bool,
    },
    /// `linear` for T ≤ [`GEMV_MAX_TOKENS`] (`model_ops_gemv.wgsl`).
    LinearGemv {
        /// vec4 loads (K % 4 == 0).
        vec4: bool,
    },
    /// `rms_norm` (`model_ops_rms_norm.wgsl`).
    RmsNorm {
        /// vec4 loads (H % 4 == 0).
        vec4: bool,
    },
    /// `embedding` and `gather_rows` (`model_ops_gather.wgsl`).
    Gather {
        /// vec4 copies (H % 4 == 0).
        vec4: bool,
    },
    /// `rope` (`model_ops_rope.wgsl`).
    Rope {
        /// Pairs (2i, 2i+1) when true, (i, i + d/2) when false.
        interleaved: bool,
    },
    /// `silu_mul` (`model_ops_elementwise.wgsl`, OP 0).
    SiluMul {
        /// vec4 elements (element count % 4 == 0).
        vec4: bool,
    },
    /// `add_assign` (`model_ops_elementwise.wgsl`, OP 1).
    Add {
        /// vec4 elements (element count % 4 == 0).
        vec4: bool,
    },
}

impl ModelShader {
    /// Every specialisation (for the catalog).
    pub fn all() -> Vec<ModelShader> {
        let mut v = Vec::new();
        for vec4 in [true, false] {
            v.extend([
                ModelShader::LinearTiled { vec4 },
                ModelShader::LinearGemv { vec4 },
                ModelShader::RmsNorm { vec4 },
                ModelShader::Gather { vec4 },
                ModelShader::SiluMul { vec4 },
                ModelShader::Add { vec4 },
            ]);
        }
        v.extend([
            ModelShader::Rope { interleaved: true },
            ModelShader::Rope { interleaved: false },
        ]);
        v
    }

    fn vec4(&self) -> bool {
        match *self {
            ModelShader::LinearTiled { vec4 }
            | ModelShader::LinearGemv { vec4 }
            | ModelShader::RmsNorm { vec4 }
            | ModelShader::Gather { vec4 }
            | ModelShader::SiluMul { vec4 }
            | ModelShader::Add { vec4 } => vec4,
            ModelShader::Rope { .. } => false,
        }
    }

    /// The pipeline-cache key.
    pub fn key(&self) -> String {
        let v = if self.vec4() { "vec4" } else { "f32" };
        match self {
            ModelShader::LinearTiled { .. } => format!("model linear tiled {v}"),
            ModelShader::LinearGemv { .. } => format!("model linear gemv {v}"),
            ModelShader::RmsNorm { .. } => format!("model rms_norm {v}"),
            ModelShader::Gather { .. } => format!("model gather {v}"),
            ModelShader::SiluMul { .. } => format!("model silu_mul {v}"),
            ModelShader::Add { .. } => format!("model add {v}"),
            ModelShader::Rope { interleaved } => format!(
                "model rope {}",
                if *interleaved {
                    "interleaved"
                } else {
                    "half-split"
                }
            ),
        }
    }

    /// The complete WGSL module.
    pub fn source(&self) -> String {
        let mut s = format!("// generated: {}\n", self.key());
        s += &consts(&[("WG", MODEL_WORKGROUP)]);
        if self.vec4() {
            s += "const V: u32 = 4u;\nalias VT = vec4<f32>;\n\
                  fn vdot(a: VT, b: VT) -> f32 {\n    return dot(a, b);\n}\n\
                  fn lane(v: VT, j: u32) -> f32 {\n    return v[j];\n}\n";
        } else {
            s += "const V: u32 = 1u;\nalias VT = f32;\n\
                  fn vdot(a: VT, b: VT) -> f32 {\n    return a * b;\n}\n\
                  fn lane(v: VT, j: u32) -> f32 {\n    return v;\n}\n";
        }
        let body = match self {
            ModelShader::LinearTiled { .. } => {
                s += &consts(&[
                    ("BM", LINEAR_TILE),
                    ("BN", LINEAR_TILE),
                    ("BK", LINEAR_TILE_K),
                ]);
                MODEL_OPS_LINEAR
            }
            ModelShader::LinearGemv { .. } => {
                s += &consts(&[("LANES", GEMV_LANES)]);
                MODEL_OPS_GEMV
            }
            ModelShader::RmsNorm { .. } => MODEL_OPS_RMS_NORM,
            ModelShader::Gather { .. } => MODEL_OPS_GATHER,
            ModelShader::SiluMul { .. } => {
                s += &consts(&[("OP", 0)]);
                MODEL_OPS_ELEMENTWISE
            }
            ModelShader::Add { .. } => {
                s += &consts(&[("OP", 1)]);
                MODEL_OPS_ELEMENTWISE
            }
            ModelShader::Rope { interleaved } => {
                s += &format!("const INTERLEAVED: bool = {interleaved};\n");
                MODEL_OPS_ROPE
            }
        };
        s += MODEL_OPS_COMMON;
        s += body;
        s
    }
}

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
                    let s = coop_shader_split(d, m, n, split, paged);
                    out.push((s.key(), s.source()));
                }
            }
        }
    }
    out
}

/// The coop form ([`Tiled2::coop`]) for f16 activations and an f16 cache: `block_m` rows
/// (16 per 32-lane subgroup), `block_n` keys per chunk.
pub fn coop_shader(head_size: u32, block_m: u32, block_n: u32, paged: bool) -> AttentionShader {
    coop_shader_split(head_size, block_m, block_n, 1, paged)
}

/// Whether the coop form can give each 16-row tile `split` subgroups at this shape: the
/// split divides the key tiles of a chunk and the output tiles, the softmax lanes of a row
/// (2 · split) take a multiple of 4 keys, and the per-subgroup staging tiles (256 floats
/// each) fit in the score array.
pub fn coop_split_fits(head_size: u32, block_m: u32, block_n: u32, split: u32) -> bool {
    split.is_power_of_two()
        && split <= 8
        && (block_n / 16) % split == 0
        && (head_size / 16) % split == 0
        && (block_n / (2 * split)) % 4 == 0
        && (block_m / 16) * split * 256 <= block_m * (block_n + 4)
}

/// Subgroups per 16-row tile for the coop form at a shape: `asked` where it fits
/// ([`coop_split_fits`]), else the most that fit (4 at 64 rows × 64 keys, the fastest on the
/// H200: see `WgpuTuning::prefill_coop_split`).
pub fn coop_split(head_size: u32, block_m: u32, block_n: u32, asked: Option<u32>) -> u32 {
    asked
        .into_iter()
        .chain([4, 2])
        .find(|&q| coop_split_fits(head_size, block_m, block_n, q))
        .unwrap_or(1)
}

/// The coop form with `split` subgroups per 16-row tile (see [`coop_split_fits`]): more
/// subgroups per workgroup, fewer output matrices (registers) per subgroup.
pub fn coop_shader_split(
    head_size: u32,
    block_m: u32,
    block_n: u32,
    split: u32,
    paged: bool,
) -> AttentionShader {
    AttentionShader {
        head_size,
        block_m,
        block_n,
        q_dtype: DType::F16,
        kv_dtype: DType::F16,
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
/// row counts, step lengths and subgroup sizes in f32 and bf16), the two bench probes and
/// every model-operation shader ([`ModelShader::all`]).
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
                if let Some(s) = decode(d, rows, DType::F32, kv, sg, u, n % 2 == 0) {
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
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The coop split: what was asked where it fits, else the most that fit; its workgroup
    /// is 32 threads per subgroup.
    #[test]
    fn coop_split_takes_the_most_that_fit() {
        assert_eq!(coop_split(128, 64, 64, None), 4);
        assert_eq!(coop_split(128, 64, 64, Some(1)), 1);
        assert_eq!(coop_split(128, 64, 64, Some(2)), 2);
        // 8 does not divide 4 key tiles: the most that fit.
        assert_eq!(coop_split(128, 64, 64, Some(8)), 4);
        // 32-key chunks: two key tiles, 16 softmax keys per row.
        assert_eq!(coop_split(128, 48, 32, None), 2);
        // 16-key chunks: one key tile, no room for a split.
        assert_eq!(coop_split(128, 64, 16, Some(4)), 1);
        assert_eq!(coop_shader_split(128, 64, 64, 4, true).workgroup(), 512);
    }

    #[test]
    fn tiles_fit_the_limits() {
        assert_eq!(
            choose_tile(128, 32 * 1024, TileKind::Prefill),
            Some((32, 16))
        );
        assert_eq!(
            choose_tile(128, 48 * 1024, TileKind::Prefill),
            Some((32, 32))
        );
        assert_eq!(
            choose_tile(128, 32 * 1024, TileKind::Decode),
            Some((16, 32))
        );
        for d in (4..=512).step_by(4) {
            for kind in [TileKind::Decode, TileKind::Prefill] {
                let (m, n) = choose_tile(d, 32 * 1024, kind).expect("fits lavapipe");
                assert!(attention_shared_bytes(d, m, n) <= 32 * 1024);
            }
        }
    }

    #[test]
    fn unroll_repeats_marked_loops() {
        let src = "a\n    // @unroll\n    for (var u = 0u; u < N * 2u; u = u + 1u) {\n        \
                   // @unroll\n        for (var r = 0u; r < M; r = r + 1u) {\n            \
                   x[u * M + r] = u32(u) + ku;\n        }\n    }\nb";
        let out = unroll(src, &[("N", 2), ("M", 2)]);
        assert_eq!(out.matches("x[").count(), 8);
        assert!(out.contains("x[3u * M + 1u] = u32(3u) + ku;"), "{out}");
        assert!(out.starts_with("a\n") && out.ends_with("b\n"));
        assert!(!out.contains("for ("));
    }

    #[test]
    fn blocking_divides_the_tile_and_fits_the_workgroup() {
        let wg = ATTENTION_WORKGROUP;
        // The main GPU tile: 4 x 4 score blocks and 4 x 4 output blocks for D = 128, 64 x 32.
        let b = AttentionBlocking::new(32, 32);
        assert_eq!(
            (b.keys_per_thread, b.key_lanes, b.score_row_groups),
            (4, 8, 16)
        );
        assert_eq!(
            (b.cols_per_thread, b.col_lanes, b.out_row_groups),
            (4, 8, 16)
        );
        // Every tile choose_tile can pick (workgroup memory of lavapipe, most GPUs, NVIDIA).
        let limits = [16 * 1024, 32 * 1024, 48 * 1024];
        for d in (4..=512).step_by(4) {
            let d4 = d / 4;
            let tiles = limits.iter().flat_map(|&limit| {
                [TileKind::Prefill, TileKind::Decode]
                    .into_iter()
                    .filter_map(move |k| choose_tile(d, limit, k))
            });
            for (m, n) in tiles {
                let b = AttentionBlocking::new(d4, n);
                assert_eq!(b.keys_per_thread * b.key_lanes, n, "d{d} {m}x{n}");
                assert_eq!(b.cols_per_thread * b.col_lanes, d4, "d{d} {m}x{n}");
                assert!(b.key_lanes * b.score_row_groups <= wg, "d{d} {m}x{n}");
                assert!(b.col_lanes * b.out_row_groups <= wg, "d{d} {m}x{n}");
                // Per-thread blocks stay register-sized: at most 16 scores and 16 vec4
                // accumulators (what the 64 x 32 tile at D = 128 uses).
                let scores = m.div_ceil(b.score_row_groups) * b.keys_per_thread;
                let accs = m.div_ceil(b.out_row_groups) * b.cols_per_thread;
                assert!(
                    scores <= 16 && accs <= 16,
                    "d{d} {m}x{n}: {scores} scores, {accs} accs"
                );
            }
        }
    }

    #[test]
    fn tiled2_blocking_fits_lanes_and_threads() {
        // The H200's prefill tile at head size 128: 2 x 4 score and output blocks with 128
        // threads, 4 x 4 with 64.
        let b = AttentionBlocking::tiled2(32, 32, 128, 32).unwrap();
        assert_eq!(
            (b.keys_per_thread, b.key_lanes, b.score_row_groups),
            (4, 8, 16)
        );
        assert_eq!(32u32.div_ceil(b.out_row_groups) * b.cols_per_thread, 8);
        let b = AttentionBlocking::tiled2(32, 32, 64, 32).unwrap();
        assert_eq!(32u32.div_ceil(b.score_row_groups) * b.keys_per_thread, 16);
        assert_eq!(32u32.div_ceil(b.out_row_groups) * b.cols_per_thread, 16);
        assert_eq!(AttentionBlocking::tiled2(32, 32, 96, 32), None);
        assert_eq!(AttentionBlocking::tiled2(32, 30, 128, 32), None);
        for d4 in 1..=128u32 {
            for bn in [8u32, 16, 32, 64] {
                for wg in [32u32, 64, 128, 256] {
                    for max_kl in [1u32, 4, 8, 16, 32, 64, 128] {
                        let b = AttentionBlocking::tiled2(d4, bn, wg, max_kl).unwrap();
                        let kl = b.key_lanes;
                        assert!(kl.is_power_of_two() && kl <= max_kl, "{b:?}");
                        assert_eq!(kl * b.keys_per_thread, bn, "{b:?}");
                        assert_eq!(kl * b.score_row_groups, wg, "{b:?}");
                        assert_eq!(b.cols_per_thread * b.col_lanes, d4, "{b:?}");
                        assert!(b.col_lanes * b.out_row_groups <= wg.max(b.col_lanes));
                    }
                }
            }
        }
        // Other per-thread blocks: at least `keys` keys per thread where the lanes allow,
        // `cols` columns where they divide the head and fit the threads.
        let b = AttentionBlocking::tiled2_with(32, 64, 256, 32, (8, 2)).unwrap();
        assert_eq!(
            (b.keys_per_thread, b.key_lanes, b.score_row_groups),
            (8, 8, 32)
        );
        assert_eq!(
            (b.cols_per_thread, b.col_lanes, b.out_row_groups),
            (2, 16, 16)
        );
        let b = AttentionBlocking::tiled2_with(32, 16, 64, 32, (16, 8)).unwrap();
        assert_eq!((b.keys_per_thread, b.cols_per_thread), (16, 8));
        let b = AttentionBlocking::tiled2_with(6, 16, 32, 32, (4, 8)).unwrap();
        assert_eq!(
            b.cols_per_thread, 2,
            "8 does not divide 6 columns: the default rule"
        );
        assert_eq!(AttentionBlocking::tiled2_with(32, 16, 64, 32, (3, 4)), None);
        for block in [(4u32, 1u32), (8, 2), (8, 8), (16, 4)] {
            for d4 in [1u32, 16, 20, 32, 64, 128] {
                for bn in [8u32, 16, 32, 64] {
                    for wg in [32u32, 128, 512] {
                        let b = AttentionBlocking::tiled2_with(d4, bn, wg, 32, block).unwrap();
                        assert_eq!(b.key_lanes * b.keys_per_thread, bn, "{b:?}");
                        assert!(b.keys_per_thread >= block.0.min(bn), "{b:?}");
                        assert_eq!(b.key_lanes * b.score_row_groups, wg, "{b:?}");
                        assert_eq!(b.cols_per_thread * b.col_lanes, d4, "{b:?}");
                        assert!(b.col_lanes <= wg, "{b:?}");
                    }
                }
            }
        }
        // The tiled2 form fits wherever the tiled form's prefill tile does at 48 KiB
        // (NVIDIA) for the common head sizes.
        for d in [64u32, 80, 96, 128, 256] {
            let (m, n) = choose_tile(d, 48 * 1024, TileKind::Prefill).unwrap();
            assert!(tiled2_shared_bytes(d, m, n) <= 48 * 1024, "d{d} {m}x{n}");
        }
    }

    #[test]
    fn tiled2h_halves_the_tiles() {
        // Queries, keys / values and probabilities at 2 bytes instead of 4; the per-row
        // statistics (6 words per row) and the key-address slot unchanged.
        for (d, m, n) in [
            (128u32, 64u32, 16u32),
            (128, 32, 32),
            (64, 64, 64),
            (4, 4, 8),
        ] {
            let f32_tiles = tiled2_shared_bytes(d, m, n) - m * 24 - 4;
            assert_eq!(tiled2h_shared_bytes(d, m, n) - m * 24 - 4, f32_tiles / 2);
        }
        // The H200's 64 x 16 tile at head size 128: 24.1 KiB instead of 46.8 (of 48), so
        // 64 x 32 or 128 x 16 tiles would fit as well.
        assert_eq!(tiled2h_shared_bytes(128, 64, 16), 24_708);
        assert_eq!(tiled2_shared_bytes(128, 64, 16), 47_876);
        assert!(tiled2h_shared_bytes(128, 64, 32) <= 48 * 1024);
        assert!(tiled2h_shared_bytes(128, 128, 16) <= 48 * 1024);
    }

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
