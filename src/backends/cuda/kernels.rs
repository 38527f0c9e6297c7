//! The CUDA backend's kernel glue: the work items its planner writes for `paged_attention.cu`
//! ([`WorkItem`]), and, under the names the backend's files use, the family's work-item shape
//! and the runtime's compile and launch (`kernels::function`, `kernels::launch`).

pub use crate::kernels::cuda::{KEYS_PER_CHUNK, ROWS_PER_ITEM};

pub(crate) use crate::device::cuda::{function, launch};

/// `WorkItem` of `paged_attention.cu`: one CTA's rows and keys.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct WorkItem {
    /// Request.
    pub req: i32,
    /// First query token (batch index).
    pub q_start: i32,
    /// Query tokens.
    pub q_len: i32,
    /// KV head.
    pub kv_head: i32,
    /// First query head within the KV head's group.
    pub head_start: i32,
    /// Query heads.
    pub head_count: i32,
    /// First key position.
    pub kv_lo: i32,
    /// One past the last key position.
    pub kv_hi: i32,
    /// Split index (0 when unsplit).
    pub split: i32,
    /// Splits of this token range (1: unsplit, writes the final output).
    pub num_splits: i32,
    /// Partial-buffer token index of `q_start` (split items).
    pub part_tok: i32,
    /// Padding.
    pub pad_: i32,
}

const _: () = assert!(std::mem::size_of::<WorkItem>() == 48);
