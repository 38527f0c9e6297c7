//! The parameter blocks the kernels take by value, `#[repr(C)]` mirrors of the structs in the
//! `.cuh` / `.cu` files. Each size is asserted here and by a `static_assert` on the C++ side,
//! and each block is `bytemuck::Pod` (no padding, any bit pattern valid), so a runtime can
//! pass it to a launch as plain bytes. The work items of `paged_attention.cu` are the CUDA
//! backend's (`WorkItem`, beside its planner).

/// `ReshapeParams` of `reshape_and_cache.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ReshapeParams {
    /// `[T][Hkv][D]` keys.
    pub key: u64,
    /// `[T][Hkv][D]` values.
    pub value: u64,
    /// The cache buffer.
    pub cache: u64,
    /// `[T]` i64 slots.
    pub slot_mapping: u64,
    /// Activation dtype code.
    pub in_dtype: i32,
    /// Cache storage dtype code.
    pub cache_dtype: i32,
    /// 1 for HND.
    pub layout_hnd: i32,
    /// Tokens (slot-mapping length).
    pub num_tokens: i32,
    /// KV heads.
    pub num_kv_heads: i32,
    /// Head size.
    pub head_size: i32,
    /// Tokens per block.
    pub block_size: i32,
    /// Key scale (1.0 unless fp8).
    pub k_scale: f32,
    /// Value scale.
    pub v_scale: f32,
    /// Padding.
    pub pad_: i32,
}

/// `MergeParams` of `merge_states.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MergeParams {
    /// Prefix outputs.
    pub o_p: u64,
    /// Suffix outputs.
    pub o_s: u64,
    /// Prefix LSEs.
    pub lse_p: u64,
    /// Suffix LSEs.
    pub lse_s: u64,
    /// Output.
    pub out: u64,
    /// Output LSEs (0: none).
    pub out_lse: u64,
    /// Input dtype code.
    pub in_dtype: i32,
    /// Output dtype code.
    pub out_dtype: i32,
    /// Tokens.
    pub num_tokens: i32,
    /// Heads.
    pub num_heads: i32,
    /// Head size.
    pub head_size: i32,
    /// Tokens at or after this copy the suffix.
    pub prefill_tokens: i32,
}

/// `AttnParams` of `paged_attention.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct AttnParams {
    /// Queries.
    pub q: u64,
    /// Paged cache.
    pub cache: u64,
    /// Dense keys (encoder).
    pub k_dense: u64,
    /// Dense values (encoder).
    pub v_dense: u64,
    /// Block table.
    pub block_table: u64,
    /// Sequence lengths.
    pub seq_lens: u64,
    /// Query start offsets.
    pub query_start_loc: u64,
    /// Work items.
    pub items: u64,
    /// ALiBi slopes (0: none).
    pub alibi: u64,
    /// Sinks (0: none).
    pub sinks: u64,
    /// Output.
    pub out: u64,
    /// LSE output (0: none).
    pub lse: u64,
    /// Split partial outputs.
    pub part_out: u64,
    /// Split partial LSEs.
    pub part_lse: u64,
    /// `[n_part_tokens][num_heads]` i32 arrival counters of the decode kernel's fused split
    /// combine, zero between launches.
    pub split_counters: u64,
    /// Query dtype code.
    pub q_dtype: i32,
    /// Cache dtype code.
    pub cache_dtype: i32,
    /// Output dtype code.
    pub out_dtype: i32,
    /// 1: dense K/V.
    pub dense: i32,
    /// 1: HND cache.
    pub layout_hnd: i32,
    /// Query heads.
    pub num_heads: i32,
    /// KV heads.
    pub num_kv_heads: i32,
    /// Head size.
    pub head_size: i32,
    /// Query heads per KV head.
    pub group: i32,
    /// Tokens per block.
    pub block_size: i32,
    /// Block-table row width.
    pub bt_stride: i32,
    /// Tokens of the batch (LSE row stride).
    pub num_tokens: i32,
    /// Tokens in the split partial buffers.
    pub n_part_tokens: i32,
    /// Causal mask.
    pub causal: i32,
    /// Sliding window (0: none).
    pub window: i32,
    /// Apply sinks.
    pub use_sinks: i32,
    /// Logit scale.
    pub scale: f32,
    /// Soft cap (0: off).
    pub soft_cap: f32,
    /// Key dequantisation scale.
    pub k_scale: f32,
    /// Value dequantisation scale.
    pub v_scale: f32,
}

/// `FmaProbeParams` of `probes.cu` (the benchmark's f32 FMA ceiling).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct FmaProbeParams {
    /// One f32 output per thread.
    pub out: u64,
    /// FMA iterations per thread.
    pub iters: i32,
    /// Multiplier of the FMA chain.
    pub m: f32,
    /// Addend of the FMA chain.
    pub c: f32,
    /// Padding.
    pub pad: i32,
}

const _: () = assert!(std::mem::size_of::<ReshapeParams>() == 72);
const _: () = assert!(std::mem::size_of::<MergeParams>() == 72);
const _: () = assert!(std::mem::size_of::<AttnParams>() == 200);
const _: () = assert!(std::mem::size_of::<FmaProbeParams>() == 24);
