// attention_common.wgsl — what paged_attention.wgsl and paged_decode.wgsl share: the
// parameter block, the flags, the bindings whose types never vary, the mask (`visible`), the
// logit modifiers (`modify`: soft cap, ALiBi) and the key range of a work item (`key_range`).
//
// Algorithm: a query at position p sees key position kp when (causal) kp <= p and (window W)
// p - kp < W, plus kp - p < W when not causal. A scaled logit s becomes c·tanh(s/c) under a
// soft cap c, then s - slope·|p - kp| under ALiBi (FlashAttention's form).
//
// Layout: an item is 8 u32 (see paged_attention.wgsl); layer = [alibi slopes H][sinks H] f32;
// lse [H, num_tokens] f32 bits; scratch holds split-KV partials (combine_splits.wgsl).
//
// Bounds: `visible` and `key_range` touch no memory; `modify` reads layer[head] with
// head < H (the layer buffer holds 2·H floats).

struct Params {
    num_tokens: u32,
    num_heads: u32,
    num_kv_heads: u32,
    group: u32,
    block_size: u32,
    block_stride: u32,
    kv_stride: u32,
    tok_stride: u32,
    head_stride: u32,
    num_items: u32,
    flags: u32,
    window: u32,
    scale: f32,
    soft_cap: f32,
    k_scale: f32,
    v_scale: f32,
    ml_offset: u32,
    // Partial-buffer tokens of the split groups (the token stride of a partial plane).
    n_part_tokens: u32,
    // log2(block_size) when the block size is a power of two, else 0xffffffff;
    // paged_decode.wgsl only.
    block_shift: u32,
    // Block-table row width (paged), 0 for dense K/V (encoder attention).
    bt_width: u32,
    // Blocks per chunk of a cache stored in chunks (the generated `kv_addr`); unused when
    // the cache is one buffer.
    blocks_per_window: u32,
}

// A work item of the planner (src/plan/work_item.rs documents every field and asserts its
// offsets; kernels-cuda/common.cuh declares the same twelve). Row r of an item is token
// q_start + r / head_count, query head kv_head·group + head_start + r % head_count, at
// position q_pos + r / head_count.
struct WorkItem {
    req: u32,
    q_start: u32,
    q_len: u32,
    kv_head: u32,
    head_start: u32,
    head_count: u32,
    kv_lo: u32,
    kv_hi: u32,
    split: u32,
    num_splits: u32,
    part_tok: u32,
    q_pos: u32,
}

const CAUSAL: u32 = 1u;
const WINDOW: u32 = 2u;
const SOFT_CAP: u32 = 4u;
const ALIBI: u32 = 8u;
const SINKS: u32 = 16u;
const WRITE_LSE: u32 = 32u;
const DIRECT: u32 = 0x7fffffffu;
const NO_ROW: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read> items: array<WorkItem>;
@group(0) @binding(5) var<storage, read> layer: array<f32>;
@group(0) @binding(6) var<storage, read_write> lse: array<u32>;
@group(0) @binding(7) var<storage, read_write> scratch: array<vec4<f32>>;

// The block-table row offset of an item's request (paged cache), or the first K/V row of its
// request (dense K/V, bt_width = 0: positions count from the request's first token).
fn item_kv_row(it: WorkItem) -> u32 {
    return select(it.q_start - it.q_pos, it.req * params.bt_width, params.bt_width != 0u);
}

// The scratch row of a split item's row r (token offset r / head_count, query head `head`):
// partial planes [split][partial token][query head], each row D4 vec4 and its (m, l) vec4 at
// ml_offset + the row.
fn partial_row(it: WorkItem, r: u32, head: u32) -> u32 {
    let pt = it.part_tok + r / it.head_count;
    return (it.split * params.n_part_tokens + pt) * params.num_heads + head;
}

// Is key position `kp` visible to a query at position `p`? (The tile's key range is
// already clipped to [kv_lo, kv_hi).)
fn visible(p: u32, kp: u32) -> bool {
    var ok = true;
    if (params.flags & CAUSAL) != 0u {
        ok = kp <= p;
    }
    if (params.flags & WINDOW) != 0u {
        ok = ok && kp + params.window > p;
        if (params.flags & CAUSAL) == 0u {
            ok = ok && p + params.window > kp;
        }
    }
    return ok;
}

// Soft cap then ALiBi, on a scaled logit.
fn modify(s_in: f32, head: u32, p: u32, kp: u32) -> f32 {
    var s = s_in;
    if (params.flags & SOFT_CAP) != 0u {
        let c = params.soft_cap;
        s = c * tanh(clamp(s / c, -15.0, 15.0));
    }
    if (params.flags & ALIBI) != 0u {
        s = s - layer[head] * abs(f32(p) - f32(kp));
    }
    return s;
}

// The keys [lo, hi) of [kv_lo, kv_hi) that any query at positions p_min..=p_max can see
// (the mask still applies per query inside the range). Returns hi <= lo when none.
fn key_range(kv_lo: u32, kv_hi: u32, p_min: u32, p_max: u32) -> vec2<u32> {
    var lo = kv_lo;
    var hi = kv_hi;
    if (params.flags & CAUSAL) != 0u {
        hi = min(hi, p_max + 1u);
    }
    if (params.flags & WINDOW) != 0u {
        if p_min + 1u > params.window {
            lo = max(lo, p_min + 1u - params.window);
        }
        if (params.flags & CAUSAL) == 0u {
            hi = min(hi, p_max + params.window);
        }
    }
    return vec2<u32>(lo, hi);
}
