//! The work item every GPU attention kernel runs, and the split groups their combines merge.
//!
//! One [`WorkItem`] is one workgroup (CUDA: one CTA) of an attention kernel: a tile of query
//! rows — `q_len` consecutive tokens of one request × `head_count` of the query heads that
//! share KV head `kv_head` — against the key range `[kv_lo, kv_hi)` of that request. Row `r`
//! of the tile is token `q_start + r / head_count`, query head
//! `kv_head · group + head_start + r % head_count`, at sequence position
//! `q_pos + r / head_count`.
//!
//! The layout is shared by the kernel families: `kernels-cuda/common.cuh` declares the same
//! struct (`static_assert` on its size), `shaders/attention_common.wgsl` declares it as a WGSL
//! `struct` of twelve `u32` (every field is non-negative), and the asserts below pin every
//! offset, so a field added or moved on one side only fails to build.

/// One workgroup's rows and keys (see the module docs). Twelve `i32`, 48 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct WorkItem {
    /// Request (row of the block table).
    pub req: i32,
    /// First query token (batch index).
    pub q_start: i32,
    /// Query tokens.
    pub q_len: i32,
    /// KV head.
    pub kv_head: i32,
    /// First query head within the KV head's group.
    pub head_start: i32,
    /// Query heads of the group in this item.
    pub head_count: i32,
    /// First key position.
    pub kv_lo: i32,
    /// One past the last key position (`kv_lo == kv_hi`: an empty split, a partial of weight 0).
    pub kv_hi: i32,
    /// Split index along the keys (0 when unsplit; split 0 adds the sink logit).
    pub split: i32,
    /// Splits of this token range (1: unsplit, the item writes the output itself).
    pub num_splits: i32,
    /// Partial-buffer token index of `q_start` (split items): partials live at
    /// `[split][part_tok + r / head_count][query head]`.
    pub part_tok: i32,
    /// Sequence position of `q_start` (its request's context length plus its offset in the
    /// request; for dense encoder K/V the offset alone).
    pub q_pos: i32,
}

/// The split items of one query range, merged by a combine pass: its partials are planes
/// `0..num_splits` at partial tokens `part_tok .. part_tok + q_len`. Four `i32`, 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SplitGroup {
    /// First query token (batch index).
    pub q_start: i32,
    /// Query tokens.
    pub q_len: i32,
    /// Partial-buffer token index of `q_start`.
    pub part_tok: i32,
    /// Splits (partial planes) of the range.
    pub num_splits: i32,
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<WorkItem>() == 48);
    assert!(offset_of!(WorkItem, req) == 0);
    assert!(offset_of!(WorkItem, q_start) == 4);
    assert!(offset_of!(WorkItem, q_len) == 8);
    assert!(offset_of!(WorkItem, kv_head) == 12);
    assert!(offset_of!(WorkItem, head_start) == 16);
    assert!(offset_of!(WorkItem, head_count) == 20);
    assert!(offset_of!(WorkItem, kv_lo) == 24);
    assert!(offset_of!(WorkItem, kv_hi) == 28);
    assert!(offset_of!(WorkItem, split) == 32);
    assert!(offset_of!(WorkItem, num_splits) == 36);
    assert!(offset_of!(WorkItem, part_tok) == 40);
    assert!(offset_of!(WorkItem, q_pos) == 44);
    assert!(size_of::<SplitGroup>() == 16);
    assert!(offset_of!(SplitGroup, q_start) == 0);
    assert!(offset_of!(SplitGroup, q_len) == 4);
    assert!(offset_of!(SplitGroup, part_tok) == 8);
    assert!(offset_of!(SplitGroup, num_splits) == 12);
};

/// The field names of [`WorkItem`] in declaration order, which the CUDA header and the WGSL
/// struct must list in the same order (checked by tests against both sources).
pub const WORK_ITEM_FIELDS: [&str; 12] = [
    "req",
    "q_start",
    "q_len",
    "kv_head",
    "head_start",
    "head_count",
    "kv_lo",
    "kv_hi",
    "split",
    "num_splits",
    "part_tok",
    "q_pos",
];

/// The field names of [`SplitGroup`] in declaration order (see [`WORK_ITEM_FIELDS`]).
pub const SPLIT_GROUP_FIELDS: [&str; 4] = ["q_start", "q_len", "part_tok", "num_splits"];

#[cfg(test)]
mod tests {
    use super::*;

    /// The field names of `struct <name> { ... }` in a C++ or WGSL source, in order.
    fn fields(src: &str, name: &str) -> Vec<String> {
        let start = src
            .find(&format!("struct {name} {{"))
            .unwrap_or_else(|| panic!("no struct {name}"));
        let body = &src[start..];
        let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
        body.lines()
            .map(|l| l.split("//").next().unwrap().trim())
            .filter(|l| !l.is_empty())
            .map(|l| {
                // C++: `int name;` — WGSL: `name: u32,`.
                let l = l.trim_end_matches([';', ',']);
                match l.split_once(':') {
                    Some((n, _)) => n.trim().to_string(),
                    None => l.split_whitespace().last().unwrap().to_string(),
                }
            })
            .collect()
    }

    #[test]
    fn the_kernel_families_declare_the_same_records() {
        let cuda = include_str!("../../kernels-cuda/common.cuh");
        let wgsl = include_str!("../../shaders/attention_common.wgsl");
        let combine = include_str!("../../shaders/combine_splits.wgsl");
        assert_eq!(fields(cuda, "WorkItem"), WORK_ITEM_FIELDS);
        assert_eq!(fields(wgsl, "WorkItem"), WORK_ITEM_FIELDS);
        assert_eq!(fields(cuda, "SplitGroup"), SPLIT_GROUP_FIELDS);
        assert_eq!(fields(combine, "SplitGroup"), SPLIT_GROUP_FIELDS);
    }
}
