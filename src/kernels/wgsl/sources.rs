//! The WGSL sources of the family, embedded at build time (`include_str!` of `shaders/`), so
//! binaries run without the source tree. Each is a fragment: a specialisation pastes its
//! generated header and the fragments it needs into one module (see `preprocess`).

pub(super) const COMMON: &str = include_str!("../../../shaders/common.wgsl");
pub(super) const ATTENTION_COMMON: &str = include_str!("../../../shaders/attention_common.wgsl");
pub(super) const PAGED_ATTENTION: &str = include_str!("../../../shaders/paged_attention.wgsl");
pub(super) const ATTENTION_CHUNKS: &str = include_str!("../../../shaders/attention_chunks.wgsl");
pub(super) const PAGED_ATTENTION_COOP: &str =
    include_str!("../../../shaders/paged_attention_coop.wgsl");
pub(super) const PAGED_DECODE: &str = include_str!("../../../shaders/paged_decode.wgsl");
pub(super) const SOFTMAX_SERIAL: &str = include_str!("../../../shaders/softmax_serial.wgsl");
pub(super) const SOFTMAX_SUBGROUP: &str = include_str!("../../../shaders/softmax_subgroup.wgsl");
pub(super) const COMBINE_SPLITS: &str = include_str!("../../../shaders/combine_splits.wgsl");
pub(super) const RESHAPE_AND_CACHE: &str = include_str!("../../../shaders/reshape_and_cache.wgsl");
pub(super) const MERGE_ATTN_STATES: &str = include_str!("../../../shaders/merge_attn_states.wgsl");
pub(super) const PROBE_COPY: &str = include_str!("../../../shaders/probe_copy.wgsl");
pub(super) const PROBE_FMA: &str = include_str!("../../../shaders/probe_fma.wgsl");
pub(super) const MODEL_OPS_COMMON: &str = include_str!("../../../shaders/model_ops_common.wgsl");
pub(super) const MODEL_OPS_LINEAR: &str = include_str!("../../../shaders/model_ops_linear.wgsl");
pub(super) const MODEL_OPS_GEMV: &str = include_str!("../../../shaders/model_ops_gemv.wgsl");
pub(super) const MODEL_OPS_LINEAR_OUT: &str =
    include_str!("../../../shaders/model_ops_linear_out.wgsl");
pub(super) const MODEL_OPS_RMS_NORM: &str =
    include_str!("../../../shaders/model_ops_rms_norm.wgsl");
pub(super) const MODEL_OPS_GATHER: &str = include_str!("../../../shaders/model_ops_gather.wgsl");
pub(super) const MODEL_OPS_ROPE: &str = include_str!("../../../shaders/model_ops_rope.wgsl");
pub(super) const MODEL_OPS_ROPE_SPLIT: &str =
    include_str!("../../../shaders/model_ops_rope_split.wgsl");
pub(super) const MODEL_OPS_SAMPLE: &str = include_str!("../../../shaders/model_ops_sample.wgsl");
pub(super) const MODEL_OPS_ELEMENTWISE: &str =
    include_str!("../../../shaders/model_ops_elementwise.wgsl");
pub(super) const MLA_CACHE_WRITE: &str = include_str!("../../../shaders/mla_cache_write.wgsl");
pub(super) const MLA_GATHER: &str = include_str!("../../../shaders/mla_gather.wgsl");
pub(super) const MLA_DECODE: &str = include_str!("../../../shaders/mla_decode.wgsl");
pub(super) const MLA_COMBINE: &str = include_str!("../../../shaders/mla_combine.wgsl");
pub(super) const MLA_PREFILL: &str = include_str!("../../../shaders/mla_prefill.wgsl");
