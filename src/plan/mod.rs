//! The work plan every GPU backend runs: which query rows and which keys each workgroup of
//! an attention kernel computes.
//!
//! Pure host code over validated metadata, shared by every GPU kernel family so that the
//! split-KV, cascade and graph-stable layouts are decided once:
//!
//! - [`WorkItem`] / [`SplitGroup`]: the `#[repr(C)]` records the kernels read (the CUDA
//!   header and the WGSL struct declare the same fields; their offsets are asserted here);
//! - [`plan_work`]: query tiles × KV heads × head chunks, restricted to a range of query
//!   lengths, decode requests split along the keys by a [`SplitRule`], items in an
//!   [`ItemOrder`];
//! - [`plan_graph_work`]: the fixed layout of a graph-captured decode step.
//!
//! A backend turns a [`PlanKey`] (the layer's shape plus its kernel's tile and split rule)
//! and the batch into a [`WorkPlan`], uploads it, and launches one workgroup per item.

mod split;
mod work;
mod work_item;

pub use split::{
    fill_waves_target, SplitRule, DECODE_MAX_SPLITS, DECODE_MIN_KEYS_PER_SPLIT, MAX_SPLITS,
    MIN_KEYS_PER_SPLIT, SPLIT_ALIGN,
};
pub use work::{plan_graph_work, plan_work, ItemOrder, Pass, PlanInputs, PlanKey, WorkPlan};
pub use work_item::{SplitGroup, WorkItem, SPLIT_GROUP_FIELDS, WORK_ITEM_FIELDS};
