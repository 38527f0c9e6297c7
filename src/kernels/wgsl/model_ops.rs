//! The model operations' specialisations ([`ModelShader`]: embedding / gather, RMSNorm, the
//! linear GEMV and tiled GEMM, RoPE, the fused Q/K/V split with RoPE, SiLU·mul, SwiGLU over a
//! fused gate/up projection, add, argmax), used by `crate::compute` on wgpu, and
//! their launch-shape constants.

use super::preprocess::consts;
use super::sources::{
    MODEL_OPS_ARGMAX, MODEL_OPS_COMMON, MODEL_OPS_ELEMENTWISE, MODEL_OPS_GATHER, MODEL_OPS_GEMV,
    MODEL_OPS_LINEAR, MODEL_OPS_RMS_NORM, MODEL_OPS_ROPE, MODEL_OPS_ROPE_SPLIT,
};

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
/// sum per token, four tokens per vec4); more tokens take the tiled kernel.
pub const GEMV_MAX_TOKENS: usize = 16;

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
        /// vec4 accumulators per thread (1, 2 or 4: up to 4, 8 or 16 tokens); see
        /// [`ModelShader::gemv`].
        tok4: u32,
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
    /// `argmax` (`model_ops_argmax.wgsl`), scalar loads.
    Argmax,
}

impl ModelShader {
    /// The GEMV for `t` (1 ≤ t ≤ [`GEMV_MAX_TOKENS`]) tokens: the narrowest accumulator
    /// width that holds them.
    pub fn gemv(vec4: bool, t: usize) -> ModelShader {
        let tok4 = match t {
            0..=4 => 1,
            5..=8 => 2,
            _ => 4,
        };
        ModelShader::LinearGemv { vec4, tok4 }
    }

    /// Every specialisation (for the catalog).
    pub fn all() -> Vec<ModelShader> {
        let mut v = Vec::new();
        for vec4 in [true, false] {
            v.extend([
                ModelShader::LinearTiled { vec4 },
                ModelShader::LinearGemv { vec4, tok4: 1 },
                ModelShader::LinearGemv { vec4, tok4: 2 },
                ModelShader::LinearGemv { vec4, tok4: 4 },
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
        ]);
        v
    }

    fn vec4(&self) -> bool {
        match *self {
            ModelShader::LinearTiled { vec4 }
            | ModelShader::LinearGemv { vec4, .. }
            | ModelShader::RmsNorm { vec4 }
            | ModelShader::Gather { vec4 }
            | ModelShader::SiluMul { vec4 }
            | ModelShader::Add { vec4 }
            | ModelShader::Swiglu { vec4 } => vec4,
            ModelShader::Rope { .. } | ModelShader::RopeSplit { .. } | ModelShader::Argmax => false,
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
            ModelShader::LinearGemv { tok4, .. } => {
                s += &consts(&[("LANES", GEMV_LANES), ("TOK4", *tok4)]);
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
            ModelShader::Argmax => MODEL_OPS_ARGMAX,
        };
        s += MODEL_OPS_COMMON;
        s += body;
        s
    }
}
