//! The model operations' specialisations ([`ModelShader`]: embedding / gather, RMSNorm, the
//! linear GEMV and tiled GEMM with what they fold in ([`LinearFusion`]: an input RMSNorm,
//! SwiGLU, the Q/K/V split with RoPE), RoPE, the fused Q/K/V split with RoPE, SiLU·mul,
//! SwiGLU over a fused gate/up projection, add, argmax), used by `crate::compute` on either
//! runtime of the family, and their launch-shape constants.

use super::bindings::Bindings;
use super::preprocess::consts;
use super::sources::{
    MODEL_OPS_COMMON, MODEL_OPS_ELEMENTWISE, MODEL_OPS_GATHER, MODEL_OPS_GEMV, MODEL_OPS_LINEAR,
    MODEL_OPS_LINEAR_OUT, MODEL_OPS_RMS_NORM, MODEL_OPS_ROPE, MODEL_OPS_ROPE_SPLIT,
    MODEL_OPS_SAMPLE,
};

/// Threads per workgroup of the model operations' kernels (`model_ops_*.wgsl`).
pub const MODEL_WORKGROUP: u32 = 256;

/// Output rows (and features) of one tile of the tiled linear kernel.
pub const LINEAR_TILE: u32 = 64;

/// K step of the tiled linear kernel.
pub const LINEAR_TILE_K: u32 = 16;

/// Threads that reduce one output unit (a weight row, or a pair of rows) in the GEMV kernel.
pub const GEMV_LANES: u32 = 32;

/// Output units (weight rows, or row pairs) per workgroup of the GEMV kernel.
pub const GEMV_FEATURES_PER_GROUP: u32 = MODEL_WORKGROUP / GEMV_LANES;

/// Largest token count `linear` runs as a GEMV (`model_ops_gemv.wgsl` keeps one partial
/// sum per token, four tokens per vec4); more tokens take the tiled kernel.
pub const GEMV_MAX_TOKENS: usize = 16;

// model_ops_linear.wgsl: one thread per 4×4 outputs of the tile, and whole loads per thread
// (BM·BK / V a multiple of WG for V = 4, hence for V = 1); model_ops_gemv.wgsl: whole
// groups of lanes, a power of two for the tree reduction (as is WG for rms_norm's).
const _: () = assert!((LINEAR_TILE / 4) * (LINEAR_TILE / 4) == MODEL_WORKGROUP);

const _: () = assert!((LINEAR_TILE * LINEAR_TILE_K / 4).is_multiple_of(MODEL_WORKGROUP));

const _: () = assert!(MODEL_WORKGROUP.is_multiple_of(GEMV_LANES) && GEMV_LANES.is_power_of_two());

const _: () = assert!(MODEL_WORKGROUP.is_power_of_two());

// model_ops_linear.wgsl's norm prologue: four threads per tile row (its partial sums are
// added as two pairs); its pair forms: two pairs per thread (TX = PAIRS / 2).
const _: () = assert!(4 * LINEAR_TILE == MODEL_WORKGROUP && LINEAR_TILE.is_multiple_of(4));

/// What becomes of a linear kernel's product `p = x·Wᵀ` (`model_ops_linear_out.wgsl`'s
/// `OUT`; `crate::compute::linear_fused` says what each form computes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinearEpilogue {
    /// Stored into `y [T, N]` or added into it (a run-time flag): `linear`,
    /// `linear_accumulate`.
    Plain,
    /// SwiGLU of a gate/up weight stacked as `[2I, K]`: `y [T, I]`.
    SwiGlu,
    /// The split of a fused Q/K/V projection, query and key heads rotated (either pairing:
    /// a run-time flag), into `q`, `k`, `v`.
    RopeSplit,
    /// [`LinearEpilogue::RopeSplit`] with the keys and values written into an f32 paged KV
    /// cache at the tokens' slots (block size and layout: run-time words).
    RopeSplitCache,
}

/// The element type of a linear kernel's weight: f32, or 16-bit weights widened to f32 as
/// they are read (`wload` in the generated header), so a GEMV streams half the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinearWeights {
    /// f32 weights.
    F32,
    /// IEEE half weights (widened by bit arithmetic, [`F16_TO_F32`]; no `shader-f16` feature
    /// needed).
    F16,
    /// bfloat16 weights (the high half of an f32: a shift).
    Bf16,
}

/// What a linear kernel folds in around its product: an RMSNorm of its input rows, and its
/// output step; and the type of its weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LinearFusion {
    /// The input rows are RMS-normed inside the kernel.
    pub norm: bool,
    /// What becomes of the product.
    pub epilogue: LinearEpilogue,
    /// The weight's element type.
    pub weights: LinearWeights,
}

impl LinearFusion {
    /// No norm, the product stored or added, f32 weights: what [`ModelShader::LinearTiled`]
    /// and [`ModelShader::LinearGemv`] run.
    pub const PLAIN: LinearFusion = LinearFusion {
        norm: false,
        epilogue: LinearEpilogue::Plain,
        weights: LinearWeights::F32,
    };

    /// Every fusion with f32 weights, [`LinearFusion::PLAIN`] first.
    pub fn all() -> Vec<LinearFusion> {
        let mut v = Vec::new();
        for epilogue in [
            LinearEpilogue::Plain,
            LinearEpilogue::SwiGlu,
            LinearEpilogue::RopeSplit,
            LinearEpilogue::RopeSplitCache,
        ] {
            for norm in [false, true] {
                v.push(LinearFusion {
                    norm,
                    epilogue,
                    weights: LinearWeights::F32,
                });
            }
        }
        v
    }

    /// Whether the kernel is the plain linear layer.
    pub fn is_plain(self) -> bool {
        self == LinearFusion::PLAIN
    }

    /// Whether the unit of work is a pair of weight rows (SwiGLU, RoPE split).
    pub fn pairs(self) -> bool {
        self.epilogue != LinearEpilogue::Plain
    }

    /// Output units of a weight of `n` rows: one per row, or one per row pair.
    pub fn units(self, n: usize) -> usize {
        if self.pairs() {
            n / 2
        } else {
            n
        }
    }

    /// Units per workgroup of the tiled kernel: its columns, or their pairs.
    pub fn tile_units(self) -> u32 {
        if self.pairs() {
            LINEAR_TILE / 2
        } else {
            LINEAR_TILE
        }
    }

    /// The binding set: [`Bindings::Model`] (x, W, y) for the plain form, which declares no
    /// other, else [`Bindings::LinearFused`].
    pub fn bindings(self) -> Bindings {
        if self.is_plain() {
            Bindings::Model
        } else {
            Bindings::LinearFused
        }
    }

    /// The key's suffix ("" for the plain form).
    fn key(self) -> String {
        let norm = if self.norm { " norm" } else { "" };
        let out = match self.epilogue {
            LinearEpilogue::Plain => "",
            LinearEpilogue::SwiGlu => " swiglu",
            LinearEpilogue::RopeSplit => " rope_split",
            LinearEpilogue::RopeSplitCache => " rope_split_cache",
        };
        let w = match self.weights {
            LinearWeights::F32 => "",
            LinearWeights::F16 => " w-f16",
            LinearWeights::Bf16 => " w-bf16",
        };
        format!("{norm}{out}{w}")
    }

    /// The weight binding (2) and its reader `wload(i) -> VT` (vector `i` of V elements).
    fn weight_header(self, vec4: bool) -> String {
        let decl = |ty: &str| format!("@group(0) @binding(2) var<storage, read> w: array<{ty}>;\n");
        match (self.weights, vec4) {
            (LinearWeights::F32, _) => {
                decl("VT") + "fn wload(i: u32) -> VT {\n    return w[i];\n}\n"
            }
            // bf16 → f32: the 16 bits become the f32's high half.
            (LinearWeights::Bf16, true) => {
                decl("vec2<u32>")
                    + "fn wload(i: u32) -> VT {\n    let p = w[i];\n    return vec4<f32>(\
                       bitcast<f32>(p.x << 16u), bitcast<f32>(p.x & 0xffff0000u), \
                       bitcast<f32>(p.y << 16u), bitcast<f32>(p.y & 0xffff0000u));\n}\n"
            }
            (LinearWeights::Bf16, false) => {
                decl("u32")
                    + "fn wload(i: u32) -> VT {\n    let p = w[i >> 1u];\n    return \
                       bitcast<f32>(select(p << 16u, p & 0xffff0000u, (i & 1u) == 1u));\n}\n"
            }
            (LinearWeights::F16, true) => {
                decl("vec2<u32>")
                    + F16_TO_F32
                    + "fn wload(i: u32) -> VT {\n    let p = w[i];\n    return vec4<f32>(\
                       h2f(p.x & 0xffffu), h2f(p.x >> 16u), h2f(p.y & 0xffffu), \
                       h2f(p.y >> 16u));\n}\n"
            }
            (LinearWeights::F16, false) => {
                decl("u32")
                    + F16_TO_F32
                    + "fn wload(i: u32) -> VT {\n    let p = w[i >> 1u];\n    return \
                       h2f(select(p & 0xffffu, p >> 16u, (i & 1u) == 1u));\n}\n"
            }
        }
    }

    /// The header lines of `model_ops_linear_out.wgsl`: NORM, OUT, and the optional
    /// bindings 4-7, each declared where the form uses it and as a private one-element
    /// stand-in elsewhere.
    fn header(self) -> String {
        let split = self.epilogue == LinearEpilogue::RopeSplit;
        let cache = self.epilogue == LinearEpilogue::RopeSplitCache;
        let out = match self.epilogue {
            LinearEpilogue::Plain => 0,
            LinearEpilogue::SwiGlu => 1,
            LinearEpilogue::RopeSplit => 2,
            LinearEpilogue::RopeSplitCache => 3,
        };
        let mut s = format!("const NORM: bool = {};\n", self.norm);
        s += &consts(&[("OUT", out)]);
        // The slots are only read; binding 7 is read-write in the set (v in the split).
        for (used, binding, name, access, ty) in [
            (self.norm, 4, "norm_w", "read", "VT"),
            (split || cache, 5, "positions", "read", "i32"),
            (split, 6, "k_out", "read_write", "f32"),
            (split, 7, "v_out", "read_write", "f32"),
            (cache, 6, "kv_cache", "read_write", "f32"),
            (cache, 7, "slots", "read_write", "vec2<i32>"),
        ] {
            s += &if used {
                format!(
                    "@group(0) @binding({binding}) var<storage, {access}> {name}: array<{ty}>;\n"
                )
            } else {
                format!("var<private> {name}: array<{ty}, 1>;\n")
            };
        }
        s
    }
}

/// An IEEE half's bits as f32, by bit arithmetic. Why not `unpack2x16float`: naga validates it
/// only with the `SHADER_FLOAT16_IN_FLOAT32` capability, which adapters without f16 lack.
/// Normal numbers move exponent and mantissa into place; subnormals (exponent 0) are
/// `m · 2⁻²⁴` (the literal is 2⁻²⁴ exactly in f32), exact in f32; exponent 31 is ±inf / NaN.
pub const F16_TO_F32: &str = "fn h2f(h: u32) -> f32 {\n    let s = (h & 0x8000u) << 16u;\n    \
    let e = (h >> 10u) & 0x1fu;\n    let m = h & 0x3ffu;\n    \
    let normal = s | ((e + 112u) << 23u) | (m << 13u);\n    \
    let special = s | 0x7f800000u | (m << 13u);\n    \
    let sub = s | bitcast<u32>(f32(m) * 5.9604645e-8);\n    \
    return bitcast<f32>(select(select(normal, special, e == 31u), sub, e == 0u));\n}\n";

/// One specialisation of the model operations' shaders (`shaders/model_ops_*.wgsl`, used by
/// `crate::compute`). `vec4` selects loads of four f32 at a time, which needs the row
/// length (K, H, or the element count) to be a multiple of 4.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModelShader {
    /// `linear` and `linear_accumulate` for T > [`GEMV_MAX_TOKENS`] (and the MLA prefill's
    /// `kv_b_proj` expansion): the tiled GEMM (`model_ops_linear.wgsl`) in its plain form,
    /// [`LinearFusion::PLAIN`] ([`Bindings::Model`]).
    LinearTiled {
        /// vec4 loads (K % 4 == 0).
        vec4: bool,
    },
    /// `linear` and `linear_accumulate` for T ≤ [`GEMV_MAX_TOKENS`] (`model_ops_gemv.wgsl`)
    /// in its plain form.
    LinearGemv {
        /// vec4 loads (K % 4 == 0).
        vec4: bool,
        /// vec4 accumulators per thread and row (1, 2 or 4: up to 4, 8 or 16 tokens); see
        /// [`ModelShader::gemv`].
        tok4: u32,
    },
    /// `linear_fused` for T > [`GEMV_MAX_TOKENS`]: the tiled GEMM with `fusion` folded in
    /// (with [`LinearFusion::PLAIN`] it is [`ModelShader::LinearTiled`]: the same key and
    /// module).
    LinearFusedTiled {
        /// vec4 loads (K % 4 == 0).
        vec4: bool,
        /// The input norm and output step.
        fusion: LinearFusion,
    },
    /// `linear_fused` for T ≤ [`GEMV_MAX_TOKENS`]: the GEMV with `fusion` folded in (with
    /// [`LinearFusion::PLAIN`] it is [`ModelShader::LinearGemv`]).
    LinearFusedGemv {
        /// vec4 loads (K % 4 == 0).
        vec4: bool,
        /// vec4 accumulators per thread and row (1, 2 or 4).
        tok4: u32,
        /// The input norm and output step.
        fusion: LinearFusion,
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
    /// `swiglu` over a fused gate/up projection (`model_ops_elementwise.wgsl`, OP 2).
    Swiglu {
        /// vec4 elements (the intermediate size % 4 == 0).
        vec4: bool,
    },
    /// One output of `rope_split_qkv` (`model_ops_rope_split.wgsl`).
    RopeSplit {
        /// Pairs (2i, 2i+1) when true, (i, i + d/2) when false.
        interleaved: bool,
        /// Rotate (query and key heads) or copy (value heads).
        rotate: bool,
    },
    /// `argmax` (`model_ops_sample.wgsl` without SAMPLING), scalar loads.
    Argmax,
    /// `sample` (`model_ops_sample.wgsl` with SAMPLING), scalar loads.
    Sample,
}

impl ModelShader {
    /// The GEMV for `t` (1 ≤ t ≤ [`GEMV_MAX_TOKENS`]) tokens: the narrowest accumulator
    /// width that holds them.
    pub fn gemv(vec4: bool, t: usize) -> ModelShader {
        ModelShader::LinearGemv {
            vec4,
            tok4: gemv_tok4(t),
        }
    }

    /// The linear kernel for `t` ≥ 1 tokens with `fusion` folded in: the GEMV up to
    /// [`GEMV_MAX_TOKENS`], the tiled GEMM above; the plain variants for
    /// [`LinearFusion::PLAIN`].
    pub fn linear(vec4: bool, t: usize, fusion: LinearFusion) -> ModelShader {
        match (t <= GEMV_MAX_TOKENS, fusion.is_plain()) {
            (true, true) => ModelShader::gemv(vec4, t),
            (true, false) => ModelShader::LinearFusedGemv {
                vec4,
                tok4: gemv_tok4(t),
                fusion,
            },
            (false, true) => ModelShader::LinearTiled { vec4 },
            (false, false) => ModelShader::LinearFusedTiled { vec4, fusion },
        }
    }

    /// A linear kernel's form: vec4 loads, the GEMV's tok4 (`None`: tiled) and its fusion.
    fn linear_form(&self) -> Option<(bool, Option<u32>, LinearFusion)> {
        match *self {
            ModelShader::LinearTiled { vec4 } => Some((vec4, None, LinearFusion::PLAIN)),
            ModelShader::LinearGemv { vec4, tok4 } => Some((vec4, Some(tok4), LinearFusion::PLAIN)),
            ModelShader::LinearFusedTiled { vec4, fusion } => Some((vec4, None, fusion)),
            ModelShader::LinearFusedGemv { vec4, tok4, fusion } => Some((vec4, Some(tok4), fusion)),
            _ => None,
        }
    }

    /// The binding set of its kernel: [`Bindings::Model`], or [`Bindings::LinearFused`] for
    /// a linear kernel with a norm, a pair output or 16-bit weights.
    pub fn bindings(&self) -> Bindings {
        match self.linear_form() {
            Some((_, _, fusion)) => fusion.bindings(),
            None => Bindings::Model,
        }
    }

    /// Every specialisation (for the catalog): each linear kernel once (the plain forms
    /// under their plain variants), with 16-bit weights in the GEMV and the tiled form.
    pub fn all() -> Vec<ModelShader> {
        let mut v = Vec::new();
        for vec4 in [true, false] {
            for fusion in LinearFusion::all() {
                for t in [GEMV_MAX_TOKENS + 1, 1, 5, GEMV_MAX_TOKENS] {
                    v.push(ModelShader::linear(vec4, t, fusion));
                }
                for weights in [LinearWeights::F16, LinearWeights::Bf16] {
                    for t in [GEMV_MAX_TOKENS + 1, 1] {
                        v.push(ModelShader::linear(
                            vec4,
                            t,
                            LinearFusion { weights, ..fusion },
                        ));
                    }
                }
            }
            v.extend([
                ModelShader::RmsNorm { vec4 },
                ModelShader::Gather { vec4 },
                ModelShader::SiluMul { vec4 },
                ModelShader::Add { vec4 },
                ModelShader::Swiglu { vec4 },
            ]);
        }
        for interleaved in [true, false] {
            for rotate in [true, false] {
                v.push(ModelShader::RopeSplit {
                    interleaved,
                    rotate,
                });
            }
        }
        v.extend([
            ModelShader::Rope { interleaved: true },
            ModelShader::Rope { interleaved: false },
            ModelShader::Argmax,
            ModelShader::Sample,
        ]);
        v
    }

    fn vec4(&self) -> bool {
        match *self {
            ModelShader::LinearTiled { vec4 }
            | ModelShader::LinearGemv { vec4, .. }
            | ModelShader::LinearFusedTiled { vec4, .. }
            | ModelShader::LinearFusedGemv { vec4, .. }
            | ModelShader::RmsNorm { vec4 }
            | ModelShader::Gather { vec4 }
            | ModelShader::SiluMul { vec4 }
            | ModelShader::Add { vec4 }
            | ModelShader::Swiglu { vec4 } => vec4,
            ModelShader::Rope { .. }
            | ModelShader::RopeSplit { .. }
            | ModelShader::Argmax
            | ModelShader::Sample => false,
        }
    }

    /// The pipeline-cache key.
    pub fn key(&self) -> String {
        let v = if self.vec4() { "vec4" } else { "f32" };
        match self {
            ModelShader::LinearTiled { .. } => format!("model linear tiled {v}"),
            ModelShader::LinearGemv { tok4, .. } => {
                format!("model linear gemv {v} t{}", 4 * tok4)
            }
            ModelShader::LinearFusedTiled { fusion, .. } => {
                format!("model linear tiled {v}{}", fusion.key())
            }
            ModelShader::LinearFusedGemv { tok4, fusion, .. } => {
                format!("model linear gemv {v} t{}{}", 4 * tok4, fusion.key())
            }
            ModelShader::RmsNorm { .. } => format!("model rms_norm {v}"),
            ModelShader::Gather { .. } => format!("model gather {v}"),
            ModelShader::SiluMul { .. } => format!("model silu_mul {v}"),
            ModelShader::Add { .. } => format!("model add {v}"),
            ModelShader::Swiglu { .. } => format!("model swiglu {v}"),
            ModelShader::RopeSplit {
                interleaved,
                rotate,
            } => format!(
                "model rope_split {} {}",
                if *interleaved {
                    "interleaved"
                } else {
                    "half-split"
                },
                if *rotate { "rotate" } else { "copy" }
            ),
            ModelShader::Argmax => "model argmax".into(),
            ModelShader::Sample => "model sample".into(),
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
            ModelShader::LinearTiled { vec4 } => {
                linear_header(&mut s, *vec4, None, LinearFusion::PLAIN)
            }
            ModelShader::LinearGemv { vec4, tok4 } => {
                linear_header(&mut s, *vec4, Some(*tok4), LinearFusion::PLAIN)
            }
            ModelShader::LinearFusedTiled { vec4, fusion } => {
                linear_header(&mut s, *vec4, None, *fusion)
            }
            ModelShader::LinearFusedGemv { vec4, tok4, fusion } => {
                linear_header(&mut s, *vec4, Some(*tok4), *fusion)
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
            ModelShader::Swiglu { .. } => {
                s += &consts(&[("OP", 2)]);
                MODEL_OPS_ELEMENTWISE
            }
            ModelShader::RopeSplit {
                interleaved,
                rotate,
            } => {
                s += &format!(
                    "const INTERLEAVED: bool = {interleaved};\nconst ROTATE: bool = {rotate};\n"
                );
                MODEL_OPS_ROPE_SPLIT
            }
            ModelShader::Argmax | ModelShader::Sample => {
                s += &format!(
                    "const SAMPLING: bool = {};\n",
                    matches!(self, ModelShader::Sample)
                );
                MODEL_OPS_SAMPLE
            }
        };
        s += MODEL_OPS_COMMON;
        if self.linear_form().is_some() {
            s += MODEL_OPS_LINEAR_OUT;
        }
        s += body;
        s
    }
}

/// The header of a linear kernel (its fusion, weight type and tile or GEMV constants) and its
/// body: the tiled GEMM (`tok4` `None`) or the GEMV with `tok4` vec4 accumulators.
fn linear_header(
    s: &mut String,
    vec4: bool,
    tok4: Option<u32>,
    fusion: LinearFusion,
) -> &'static str {
    *s += &fusion.header();
    *s += &fusion.weight_header(vec4);
    match tok4 {
        None => {
            *s += &consts(&[
                ("BM", LINEAR_TILE),
                ("BN", LINEAR_TILE),
                ("BK", LINEAR_TILE_K),
            ]);
            MODEL_OPS_LINEAR
        }
        Some(tok4) => {
            let rows = if fusion.pairs() { 2 } else { 1 };
            *s += &consts(&[("LANES", GEMV_LANES), ("TOK4", tok4), ("ROWS", rows)]);
            MODEL_OPS_GEMV
        }
    }
}

/// vec4 accumulators per thread and row of the GEMV for `t` ≤ [`GEMV_MAX_TOKENS`] tokens:
/// the narrowest width that holds them.
fn gemv_tok4(t: usize) -> u32 {
    match t {
        0..=4 => 1,
        5..=8 => 2,
        _ => 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(binding, read_only)` of every storage binding a module declares.
    fn declared(source: &str) -> Vec<(u32, bool)> {
        let mut v: Vec<(u32, bool)> = source
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix("@group(0) @binding(")?;
                let (n, decl) = rest.split_once(')')?;
                let read_only = if decl.contains("var<storage, read>") {
                    true
                } else if decl.contains("var<storage, read_write>") {
                    false
                } else {
                    return None;
                };
                Some((n.parse().ok()?, read_only))
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn modules_declare_the_bindings_of_their_set() {
        for s in ModelShader::all() {
            let set = s.bindings().storage();
            let got = declared(&s.source());
            for b in &got {
                assert!(set.contains(b), "{}: {b:?} is not in {set:?}", s.key());
            }
            let Some((_, _, fusion)) = s.linear_form() else {
                continue;
            };
            // What each form binds: x, W, y; the norm weight; positions, k, v.
            let mut want = vec![(1, true), (2, true), (3, false)];
            if fusion.norm {
                want.push((4, true));
            }
            if matches!(
                fusion.epilogue,
                LinearEpilogue::RopeSplit | LinearEpilogue::RopeSplitCache
            ) {
                want.extend([(5, true), (6, false), (7, false)]);
            }
            assert_eq!(got, want, "{}", s.key());
        }
    }

    #[test]
    fn linear_kernels_are_named_once() {
        let all = ModelShader::all();
        let keys: std::collections::HashSet<String> = all.iter().map(|s| s.key()).collect();
        assert_eq!(keys.len(), all.len());
        // Every fusion in both kernels and load widths, each GEMV width; with f16 and bf16
        // weights, one GEMV and the tiled form.
        let linear = all.iter().filter(|s| s.linear_form().is_some()).count();
        assert_eq!(linear, 2 * LinearFusion::all().len() * (4 + 2 * 2));
        // The fused variants with nothing folded in are the plain kernels.
        for vec4 in [true, false] {
            let pairs = [
                (
                    ModelShader::LinearFusedTiled {
                        vec4,
                        fusion: LinearFusion::PLAIN,
                    },
                    ModelShader::LinearTiled { vec4 },
                ),
                (
                    ModelShader::LinearFusedGemv {
                        vec4,
                        tok4: 2,
                        fusion: LinearFusion::PLAIN,
                    },
                    ModelShader::LinearGemv { vec4, tok4: 2 },
                ),
            ];
            for (fused, plain) in pairs {
                assert_eq!(fused.key(), plain.key());
                assert_eq!(fused.source(), plain.source());
                assert_eq!(fused.bindings(), Bindings::Model);
            }
            assert_eq!(
                ModelShader::linear(vec4, GEMV_MAX_TOKENS + 1, LinearFusion::PLAIN),
                ModelShader::LinearTiled { vec4 }
            );
            assert_eq!(
                ModelShader::linear(vec4, 3, LinearFusion::PLAIN),
                ModelShader::gemv(vec4, 3)
            );
        }
    }
}
