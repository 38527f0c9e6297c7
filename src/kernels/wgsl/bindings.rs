//! The binding set of each kernel of the family: which binding numbers a kernel declares and
//! whether each is read-only. The runtime builds its bind-group layouts from these (explicit
//! layouts, not derived from a shader, so every variant of a kernel binds the same buffers).

/// The binding set of a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bindings {
    /// paged_attention.wgsl: uniform 0; read 1 (q), 2 (kv / k), 3 (block table / v),
    /// 4 (items), 5 (layer); read-write 6 (lse), 7 (scratch), 8 (out).
    Attention,
    /// combine_splits.wgsl: uniform 0; read 1 (scratch), 2 (groups); read-write 3 (out),
    /// 4 (lse).
    Combine,
    /// reshape_and_cache.wgsl: uniform 0; read 1 (key), 2 (value), 3 (slots);
    /// read-write 4 (cache).
    Reshape,
    /// merge_attn_states.wgsl: uniform 0; read 1..=4 (o_p, lse_p, o_s, lse_s);
    /// read-write 5 (out), 6 (out_lse).
    Merge,
    /// probe_copy.wgsl / probe_fma.wgsl: uniform 0; read 1 (src); read-write 2 (dst).
    Probe,
    /// model_ops_*.wgsl (`crate::compute`): uniform 0; read 1, 2; read-write 3.
    Model,
    /// model_ops_gemv.wgsl / model_ops_linear.wgsl with an input norm or a pair output
    /// (`crate::compute::linear_fused`): uniform 0; read 1 (x), 2 (W), 4 (norm weight),
    /// 5 (positions); read-write 3 (the output, or q), 6 (k, or the KV cache), 7 (v, or the
    /// slot mapping, only read). A specialisation
    /// declares only those it uses ([`LinearFusion`](super::LinearFusion)); the others get
    /// placeholders.
    LinearFused,
    /// mla_cache_write.wgsl: uniform 0; read 1 (kv_c), 2 (k_pe), 3 (slots); read-write 4
    /// (cache).
    MlaCacheWrite,
    /// mla_gather.wgsl: uniform 0; read 1 (kv_c), 2 (k_pe), 3 (cache), 4 (block table),
    /// 5 (plan); read-write 6 (latent rows).
    MlaGather,
    /// mla_decode.wgsl: uniform 0; read 1 (q), 2 (cache), 3 (block table), 4 (seq_lens);
    /// read-write 5 (out or partials), 6 (lse or partial LSEs).
    MlaDecode,
    /// mla_combine.wgsl: uniform 0; read 1 (partials), 2 (partial LSEs); read-write 3 (out),
    /// 4 (lse).
    MlaCombine,
    /// mla_prefill.wgsl: uniform 0; read 1 (q), 2 (expanded keys / values), 3 (latent
    /// rows), 4 (plan); read-write 5 (softmax state), 6 (out).
    MlaPrefill,
}

impl Bindings {
    /// `(binding, read_only)` of every storage binding.
    pub fn storage(self) -> &'static [(u32, bool)] {
        match self {
            Bindings::Attention => &[
                (1, true),
                (2, true),
                (3, true),
                (4, true),
                (5, true),
                (6, false),
                (7, false),
                (8, false),
            ],
            Bindings::Combine => &[(1, true), (2, true), (3, false), (4, false)],
            Bindings::Reshape => &[(1, true), (2, true), (3, true), (4, false)],
            Bindings::Merge => &[
                (1, true),
                (2, true),
                (3, true),
                (4, true),
                (5, false),
                (6, false),
            ],
            Bindings::Probe => &[(1, true), (2, false)],
            Bindings::Model => &[(1, true), (2, true), (3, false)],
            Bindings::LinearFused => &[
                (1, true),
                (2, true),
                (3, false),
                (4, true),
                (5, true),
                (6, false),
                (7, false),
            ],
            Bindings::MlaCacheWrite => &[(1, true), (2, true), (3, true), (4, false)],
            Bindings::MlaGather => &[
                (1, true),
                (2, true),
                (3, true),
                (4, true),
                (5, true),
                (6, false),
            ],
            Bindings::MlaDecode => &[
                (1, true),
                (2, true),
                (3, true),
                (4, true),
                (5, false),
                (6, false),
            ],
            Bindings::MlaCombine => &[(1, true), (2, true), (3, false), (4, false)],
            Bindings::MlaPrefill => &[
                (1, true),
                (2, true),
                (3, true),
                (4, true),
                (5, false),
                (6, false),
            ],
        }
    }
}
