//! The plain data the contracts share: what a backend declares it supports (attention
//! types, block and head sizes, KV layout, graph-capture level, device capability) and why it
//! rejects a configuration ([`Reason`]).
//!
//! A leaf module: it imports nothing of polyattn, so the error type, the metadata and the
//! KV cache can name these types without depending on the backend descriptor, and the
//! descriptor ([`crate::backend`]) re-exports them.

use std::fmt;

/// vLLM's `AttentionType`: which tokens attend to which.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum AttentionType {
    /// Decoder self-attention over the paged KV cache (causal unless the metadata says not).
    Decoder,
    /// Encoder self-attention inside an encoder-decoder model (non-causal).
    Encoder,
    /// Encoder-only self-attention (BERT-style, non-causal).
    EncoderOnly,
    /// Cross-attention: decoder queries, encoder keys and values.
    EncoderDecoder,
}

impl AttentionType {
    /// vLLM's string value.
    pub const fn as_str(self) -> &'static str {
        match self {
            AttentionType::Decoder => "decoder",
            AttentionType::Encoder => "encoder",
            AttentionType::EncoderOnly => "encoder_only",
            AttentionType::EncoderDecoder => "encoder_decoder",
        }
    }

    /// True for the types whose self-attention is bidirectional.
    pub const fn is_encoder(self) -> bool {
        matches!(self, AttentionType::Encoder | AttentionType::EncoderOnly)
    }
}

impl fmt::Display for AttentionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A kernel block-size rule: an exact size, or any multiple of a base (vLLM's `MultipleOf`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockSize {
    /// Exactly this many tokens per block (also accepted as a divisor: vLLM's hybrid blocks).
    Exact(u32),
    /// Any multiple of this many tokens.
    MultipleOf(u32),
}

impl BlockSize {
    /// vLLM's `supports_block_size` rule for one entry: `bs % size == 0`.
    pub fn accepts(self, bs: u32) -> bool {
        let base = match self {
            BlockSize::Exact(b) | BlockSize::MultipleOf(b) => b,
        };
        bs > 0 && base > 0 && bs.is_multiple_of(base)
    }

    pub(crate) fn describe(self) -> String {
        match self {
            BlockSize::Exact(b) => format!("{b}"),
            BlockSize::MultipleOf(b) => format!("any multiple of {b}"),
        }
    }
}

/// Which head sizes a backend's kernels accept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeadSizes {
    /// Any head size.
    Any,
    /// Exactly these.
    List(Vec<usize>),
    /// Multiples of `multiple` in `min..=max`.
    Range {
        /// Smallest.
        min: usize,
        /// Largest.
        max: usize,
        /// Step.
        multiple: usize,
    },
}

impl HeadSizes {
    /// True if `h` is accepted.
    pub fn contains(&self, h: usize) -> bool {
        match self {
            HeadSizes::Any => true,
            HeadSizes::List(l) => l.contains(&h),
            HeadSizes::Range { min, max, multiple } => {
                h >= *min && h <= *max && *multiple > 0 && h.is_multiple_of(*multiple)
            }
        }
    }
}

impl fmt::Display for HeadSizes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeadSizes::Any => f.write_str("any"),
            HeadSizes::List(l) => write!(f, "{l:?}"),
            HeadSizes::Range { min, max, multiple } => {
                write!(f, "multiples of {multiple} in {min}..={max}")
            }
        }
    }
}

/// Memory order of one block of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum KvLayout {
    /// `[block_size, num_kv_heads, head_size]`: a token's heads are adjacent.
    Nhd,
    /// `[num_kv_heads, block_size, head_size]`: a head's tokens are adjacent.
    Hnd,
}

impl KvLayout {
    /// vLLM's stride order of the logical `(num_blocks, 2, block_size, num_kv_heads, head_size)`
    /// shape: NHD `(0,1,2,3,4)`, HND `(0,1,3,2,4)`.
    pub const fn stride_order(self) -> [usize; 5] {
        match self {
            KvLayout::Nhd => [0, 1, 2, 3, 4],
            KvLayout::Hnd => [0, 1, 3, 2, 4],
        }
    }
}

/// vLLM's `AttentionCGSupport`: for which batches a full graph capture (CUDA graphs, Vulkan
/// re-submittable command buffers) is valid. Larger means more support.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum GraphCaptureSupport {
    /// No full-graph capture.
    Never = 0,
    /// Only pure `query_len == 1` decode batches.
    UniformSingleTokenDecode = 1,
    /// Only batches whose queries all have the same length.
    UniformBatch = 2,
    /// Any batch, mixed prefill and decode included.
    Always = 3,
}

/// A device's compute capability (`major.minor`), ordered as a tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct DeviceCapability {
    /// Major version (9 for Hopper).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// One reason a backend cannot run a configuration.
///
/// `code` is vLLM's reason string where one applies ("head_size not supported"), so logs and
/// tests match vLLM's; `detail` says what was asked and what would be valid.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Reason {
    /// vLLM's reason string (or polyattn's own, for checks vLLM does not make).
    pub code: String,
    /// What was asked and what is valid.
    pub detail: String,
}

impl Reason {
    /// A reason with a detail.
    pub fn new(code: impl Into<String>, detail: impl Into<String>) -> Self {
        Reason {
            code: code.into(),
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.detail.is_empty() {
            f.write_str(&self.code)
        } else {
            write!(f, "{} ({})", self.code, self.detail)
        }
    }
}
