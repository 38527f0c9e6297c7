// What the tensor-core prefill kernels share (paged_attention_mma.cu on mma.sync,
// paged_attention_wgmma_ws.cu on wgmma): a work item's geometry, and the online softmax. Both
// hold scores in the accumulator layout
// of an m16 tile per warp -- a thread owns rows lane/4 and lane/4 + 8, and of each n8 tile
// the elements 0, 1 (first row) and 2, 3 (second row) at keys 2 (lane % 4) and + 1 -- which
// is the layout of mma.m16n8 and of each warp's 16 rows of wgmma.m64nN. Pasted in place of
// `#include "prefill_tile.cuh"` after common.cuh (AttnParams, WorkItem, PA_INF, PA_FULL_MASK).

#ifndef POLYATTN_PREFILL_TILE_CUH
#define POLYATTN_PREFILL_TILE_CUH

#define PA_LOG2E 1.4426950408889634f
#define PA_LN2 0.6931471805599453f

// A prefill work item's geometry: rows = query tokens x heads (row r = token r / hc, head
// head0 + r % hc), pos0 the sequence position of its first token, and the union of its rows'
// visible key ranges [span_lo, span_hi) with `first` its start aligned down to 16 (where the
// key tiles begin).
struct PaPrefillItem {
    int hc;
    int rows;
    int pos0;
    int head0;
    int span_lo;
    int span_hi;
    int first;
};

__device__ __forceinline__ PaPrefillItem pa_prefill_item(const AttnParams& p, const WorkItem& it) {
    PaPrefillItem g;
    g.hc = it.head_count;
    g.rows = it.q_len * g.hc;
    const int qsl0 = p.query_start_loc[it.req];
    const int req_q_len = p.query_start_loc[it.req + 1] - qsl0;
    const int ctx = p.seq_lens[it.req] - req_q_len;
    g.pos0 = ctx + (it.q_start - qsl0);
    g.head0 = it.kv_head * p.group + it.head_start;
    int tmp;
    pa_visible(p, g.pos0, it.kv_lo, it.kv_hi, &g.span_lo, &tmp);
    pa_visible(p, g.pos0 + it.q_len - 1, it.kv_lo, it.kv_hi, &tmp, &g.span_hi);
    g.span_lo = max(g.span_lo, it.kv_lo);
    g.span_hi = min(g.span_hi, it.kv_hi);
    g.first = g.span_lo - g.span_lo % 16;
    return g;
}

// Folds the row maxima (MAX) or sums (else) of a thread's scores of one m-tile into r[0]
// (row lane/4: elements 0, 1 of every n-tile) and r[1] (row lane/4 + 8: elements 2, 3).
// Why a tree: a running max / sum is a chain of 2 NJ dependent instructions per row, and at
// 8 warps per SM their latency is not hidden (ncu: warps stalled on fixed-latency
// dependencies more than on anything else); the tree's depth is log2(2 NJ).
template <int NJ, bool SUM>
__device__ __forceinline__ void pa_mma_row_reduce(const float (&s)[NJ][4], float (&r)[2]) {
    static_assert((NJ & (NJ - 1)) == 0, "a power of two of n-tiles");
    float a[NJ][2];
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        a[j][0] = SUM ? s[j][0] + s[j][1] : fmaxf(s[j][0], s[j][1]);
        a[j][1] = SUM ? s[j][2] + s[j][3] : fmaxf(s[j][2], s[j][3]);
    }
    // Both loops have constant trip counts, so they unroll completely at any NJ and `a`
    // stays in registers (a halving bound in the outer loop stopped the unrolling at NJ 16).
#pragma unroll
    for (int w = NJ / 2; w >= 1; w /= 2) {
#pragma unroll
        for (int j = 0; j < NJ / 2; ++j) {
            if (j < w) {
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    a[j][i] = SUM ? a[j][i] + a[j + w][i] : fmaxf(a[j][i], a[j + w][i]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) r[i] = SUM ? r[i] + a[0][i] : fmaxf(r[i], a[0][i]);
}

// Scores of one m16 x (8 NJ)-key sub-tile starting at key c0 for the two rows a thread owns
// (rows r and r + 8 of the item), the visibility mask [lo, hi) when MASK (a tile wholly
// inside every row's visible range needs none), and folds their maxima into mx. PLAIN (no soft cap, no
// ALiBi): s stays the raw Q K^T (the caller folds scale * log2 e into the exponent's FFMA,
// which is exact to reorder because scale > 0); otherwise s = (Q K^T * scale, soft-capped,
// minus the ALiBi bias) * log2 e, in base-2 units.
template <bool MASK, bool PLAIN, int NJ>
__device__ __forceinline__ void pa_mma_scores(const AttnParams& p, float (&s)[NJ][4], int c0,
                                              int t4, int r, int hc, int pos0, int head0,
                                              const int (&lo)[2], const int (&hi)[2],
                                              float qk_scale, float (&mx)[2]) {
    float slope[2] = {0.0f, 0.0f};
    int pos[2] = {0, 0};
    if (!PLAIN && p.alibi != 0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            pos[i] = pos0 + (r + 8 * i) / hc;
            slope[i] = p.alibi[head0 + (r + 8 * i) % hc];
        }
    }
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = e >> 1;
            const int kp = c0 + 8 * j + 2 * t4 + (e & 1);
            float x = s[j][e];
            if (!PLAIN) {
                x *= qk_scale;
                if (p.soft_cap > 0.0f) x = p.soft_cap * tanhf(x / p.soft_cap);
                x -= slope[i] * fabsf((float)(pos[i] - kp));
                x *= PA_LOG2E;
            }
            if (MASK) x = (kp >= lo[i] && kp < hi[i]) ? x : -PA_INF;
            s[j][e] = x;
        }
    }
    pa_mma_row_reduce<NJ, false>(s, mx);
}

#endif  // POLYATTN_PREFILL_TILE_CUH
