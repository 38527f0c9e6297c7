// MLA decode (vLLM's forward_mqa) on tensor cores: every query row attends in latent space
// over its request's cached latents, which serve as the one shared key (all 576 dims) and
// value (the first 512 dims) head. Split-KV over the key range, then mla_combine (in
// mla_decode.cu) merges the splits' partials. The portable form of the same decode, for
// compilers without these instructions, is mla_decode.cu.
//
// Rows: a request of q_len query tokens and H heads has q_len * H rows, row r = j * H + h
// (token j, head h), contiguous in q [T][H][576] from its first token. Query token j sits at
// position seq_len - q_len + j and sees positions [0, seq_len - q_len + j] (causal).
//
// Work: CTA (blockIdx.x, blockIdx.y, blockIdx.z) = (row tile, request, split): rows
// [16 RG * x, 16 RG * (x + 1)) of request y, keys [lo, hi) of split z, where lo = z * per,
// per = ceil(seq_len / num_splits) rounded up to MLA_KEYS, and hi also stops at the last
// position any row of the tile sees. RG row groups of W = 2 warps: warp w owns rows
// 16 (w / W) .. + 16, score dims 576 / W * (w % W) .. + 576 / W and value columns
// 512 / W * (w % W) .. + 512 / W (the 16 x 256 f32 accumulator is 128 registers a thread).
//
// Barriers per chunk: the CTA's (chunk landed; stage, fp8 tile and exchange free again) and
// the row group's own (named barrier 1 + group: its partial scores written).
//
// Algorithm per CTA:
//  1. The tile's query rows go to shared memory (cp.async; rows past the request's zero-
//     filled). Key chunks of MLA_KEYS positions stream through MLA_STAGES shared stages with
//     cp.async (16-byte copies; positions outside [lo, hi) zero-filled, never read: a chunk
//     never crosses a cache block, block sizes being multiples of MLA_KEYS). fp8 (E4M3)
//     caches: a landed raw chunk is converted once into a 16-bit tile (exact in f16 and bf16).
//  2. Per chunk, S = Q K^T (m16n8k16): the W warps of a row group each multiply their
//     576 / W dims (18 k-steps; ldmatrix.x4 on Q and K rows) and exchange their partial
//     scores through shared memory, so all hold the full 16 x 32 scores without computing
//     them twice (every warp sums the W partials in warp order: bit-identical scores).
//     Scores are scaled (scale * log2 e; fp8: times k_scale), masked by selection
//     (-inf for positions a row does not see and for rows past the request) and folded into
//     an online softmax in base 2 (running max m, partial denominator l per thread; all
//     warps of a row group compute the same m and l). O (16 x 512 / W per warp, f32 in registers)
//     is rescaled by 2^(m_old - m_new), P packed to f16x2 / bf16x2, O += P V
//     (ldmatrix.x4.trans on the chunk's first 512 dims).
//  3. Unsplit launches write out = O / l (times k_scale for fp8; 0 when l = 0) in the
//     activation dtype and lse = (m + log2 l) ln 2 (natural log); split launches write f32
//     partials (the same normalised O and LSE; an empty split writes 0 and -inf).
//
// Layouts: q [T][H][576], out [T][H][512] (f16 / bf16); cache [num_blocks][block_size][576]
// in the activation dtype or E4M3; lse [H][T] f32; part_out [num_splits][T * H][512] f32,
// part_lse [num_splits][T * H] f32; block_table [num_reqs][bt_stride]. Shared memory
// (mla_decode_smem_bytes in src/kernels/cuda/mla.rs): Q [16 RG][584] 16-bit, MLA_STAGES
// stages of [32][584] 16-bit (fp8: [32][592] bytes, then one converted [32][584] tile), then
// the score exchange [W RG][16][32] f32.
//
// Bounds relied on (host side, src/backends/cuda_mla): metadata validated against the cache
// (query_start_loc monotonic, q_len <= seq_len, block ids of every position < seq_len in
// range); every request of the launch has q_len * H rows with grid.x >= ceil(rows / (16 RG));
// block_size a multiple of MLA_KEYS; num_splits <= MLA_MAX_SPLITS; q, cache, out and
// part_out 16-byte aligned; T * H * 576 and the cache's element count fit in i64; compute
// capability >= 8.0. Only chunks holding a position of [lo, hi) are loaded, so every
// block-table entry read is one of a position < seq_len.

#include "common.cuh"
#include "mla_params.cuh"

#define MLA_STAGES 2         // shared-memory stages
#define MLA_S (MLA_LAT + 8)  // 16-bit row stride in elements (16-byte rows, no bank conflicts)
#define MLA_RAW_S (MLA_LAT + 16)  // fp8 raw row stride in bytes
#define MLA_GROUP_WARPS 2    // warps per 16-row group

template <bool BF16>
__device__ __forceinline__ void mla_store2(void* out, pa_i64 i, float a, float b) {
    *(pa_u32*)((pa_u16*)out + i) = ptx_pack2<BF16>(a, b);
}

template <bool BF16, int KV, int RG>
__device__ __forceinline__ void mla_decode_body(const MlaDecodeParams& p) {
    constexpr bool FP8 = KV != 0;
    constexpr int ROWS = 16 * RG;
    constexpr int S = MLA_S;
    constexpr int TILE = MLA_KEYS * S;                // elements of one 16-bit chunk tile
    constexpr int EB = FP8 ? 1 : 2;
    constexpr int RS = FP8 ? MLA_RAW_S : S * 2;       // bytes per staged row
    constexpr int CHB = MLA_LAT * EB / 16;            // 16-byte pieces per latent
    constexpr int RAW = MLA_KEYS * RS;                // bytes per stage
    constexpr int W = MLA_GROUP_WARPS;
    constexpr int KT = MLA_LAT / W / 16;              // k16 steps per warp (its score dims)
    constexpr int NT = MLA_DV / W / 8;                // n8 tiles of a warp's value columns
    constexpr int THREADS = W * RG * 32;
    extern __shared__ uint4 mla_smem[];
    pa_u16* q_s = (pa_u16*)mla_smem;                            // [ROWS][S]
    pa_u8* ring = (pa_u8*)(q_s + ROWS * S);                     // MLA_STAGES x RAW
    pa_u16* conv = (pa_u16*)(ring + MLA_STAGES * RAW);          // fp8: [MLA_KEYS][S]
    float* sx = (float*)(conv + (FP8 ? TILE : 0));              // [W RG][16][32]

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int rg = warp / W;
    const int part = warp % W;
    const int g4 = lane >> 2;
    const int t4 = lane & 3;
    const int req = blockIdx.y;
    const int H = p.num_heads;
    const int q0 = p.query_start_loc[req];
    const int ql = p.query_start_loc[req + 1] - q0;
    const int seq = p.seq_lens[req];
    const int nrows = ql * H;
    const int row0 = blockIdx.x * ROWS;
    if (row0 >= nrows) return;  // the whole CTA, before any barrier
    const int ctx = seq - ql;
    const int per = ((seq + p.num_splits - 1) / p.num_splits + MLA_KEYS - 1) / MLA_KEYS * MLA_KEYS;
    const int lo = blockIdx.z * per;
    const int jmax = min(ql - 1, (row0 + ROWS - 1) / H);
    const int hi = min(min(seq, lo + per), ctx + jmax + 1);
    const int nch = lo < hi ? (hi - lo + MLA_KEYS - 1) / MLA_KEYS : 0;
    const int* bt = p.block_table + (pa_i64)req * p.bt_stride;
    const pa_i64 qrow0 = (pa_i64)q0 * H + row0;  // global row of the tile's first row

    // Queues chunk c (positions lo + 32c ..) into stage `stage`.
    auto issue = [&](int c, int stage) {
        const int c0 = lo + MLA_KEYS * c;
        const pa_i64 block = bt[c0 / p.block_size];
        const int off = c0 % p.block_size;
        const pa_u8* src = (const pa_u8*)p.cache + ((block * p.block_size + off) * MLA_LAT) * EB;
        pa_u8* dst = ring + stage * RAW;
        for (int piece = tid; piece < MLA_KEYS * CHB; piece += THREADS) {
            const int j = piece / CHB;
            const int cc = piece - j * CHB;
            const int bytes = c0 + j < hi ? 16 : 0;
            ptx_cp_async16(ptx_smem_addr(dst + j * RS + cc * 16),
                           src + (pa_i64)j * MLA_LAT * EB + cc * 16, bytes);
        }
    };

    // 1. Q rows, committed with chunk 0.
    {
        const pa_u16* q = (const pa_u16*)p.q;
        constexpr int QCH = MLA_LAT / 8;
        for (int i = tid; i < ROWS * QCH; i += THREADS) {
            const int r = i / QCH;
            const int c = i - r * QCH;
            const bool in = row0 + r < nrows;
            const pa_u16* src = in ? q + (qrow0 + r) * MLA_LAT + c * 8 : q;
            ptx_cp_async16(ptx_smem_addr(q_s + r * S + c * 8), src, in ? 16 : 0);
        }
    }
#pragma unroll
    for (int s = 0; s < MLA_STAGES - 1; ++s) {
        if (s < nch) issue(s, s);
        ptx_cp_async_commit();
    }

    // Per-thread rows (g4, g4 + 8 of the warp's row group): active, and the last position seen.
    bool act[2];
    int vis[2];
    float m[2], l[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = row0 + rg * 16 + g4 + 8 * i;
        act[i] = r < nrows;
        vis[i] = act[i] ? ctx + r / H + 1 : 0;
        m[i] = -PA_INF;
        l[i] = 0.0f;
    }
    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    const float sl2 = p.scale * MLA_LOG2E;
    const int a_row = (lane & 7) + 8 * ((lane >> 3) & 1);
    const int a_col = 8 * (lane >> 4);
    const int k_row = (lane & 7) + 8 * (lane >> 4);
    const int k_col = 8 * ((lane >> 3) & 1);
    const int v_row = (lane & 7) + 8 * ((lane >> 3) & 1);
    const int v_col = 8 * (lane >> 4);
    const int dim0 = part * (MLA_LAT / W);  // this warp's score dims
    const int col0 = part * (MLA_DV / W);   // and value columns
    float* my_sx = sx + warp * 16 * 32;
    const float* group_sx = sx + rg * W * 16 * 32;

    for (int c = 0; c < nch; ++c) {
        {
            const int nx = c + MLA_STAGES - 1;
            if (nx < nch) issue(nx, nx % MLA_STAGES);
            ptx_cp_async_commit();
        }
        ptx_cp_async_wait<MLA_STAGES - 1>();
        __syncthreads();  // chunk c (and Q) landed for every thread
        const pa_u16* ks = (const pa_u16*)(ring + (c % MLA_STAGES) * RAW);
        if (FP8) {
            const pa_u8* raw = ring + (c % MLA_STAGES) * RAW;
            for (int piece = tid; piece < MLA_KEYS * CHB; piece += THREADS) {
                const int j = piece / CHB;
                const int cc = piece - j * CHB;
                const uint4 w = *(const uint4*)(raw + j * RS + cc * 16);
                const uint2 a = pa_fp8x4<BF16, 1>(w.x);
                const uint2 b = pa_fp8x4<BF16, 1>(w.y);
                const uint2 e = pa_fp8x4<BF16, 1>(w.z);
                const uint2 f = pa_fp8x4<BF16, 1>(w.w);
                uint4* dst = (uint4*)(conv + j * S + cc * 16);
                dst[0] = make_uint4(a.x, a.y, b.x, b.y);
                dst[1] = make_uint4(e.x, e.y, f.x, f.y);
            }
            __syncthreads();
            ks = conv;
        }
        const int c0 = lo + MLA_KEYS * c;

        // 2. This warp's partial scores over its share of the dims.
        float s[4][4];
#pragma unroll
        for (int j = 0; j < 4; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
            const int k0 = dim0 + 16 * kk;
            pa_u32 a[4];
            ptx_ldmatrix_x4(ptx_smem_addr(q_s + (rg * 16 + a_row) * S + k0 + a_col), a[0], a[1],
                            a[2], a[3]);
#pragma unroll
            for (int nb = 0; nb < 2; ++nb) {
                pa_u32 b0, b1, b2, b3;
                ptx_ldmatrix_x4(ptx_smem_addr(ks + (nb * 16 + k_row) * S + k0 + k_col), b0, b1,
                                b2, b3);
                ptx_mma<BF16>(s[2 * nb], a, b0, b1);
                ptx_mma<BF16>(s[2 * nb + 1], a, b2, b3);
            }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) my_sx[(j * 4 + e) * 32 + lane] = s[j][e];
        // Only the row group's warps exchange: a named barrier lets the other groups run on.
        if (RG > 1)
            ptx_bar_sync(1 + rg, W * 32);
        else
            __syncthreads();
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                // The partials summed in warp order on every warp of the group (its own from
                // registers): the same sum in the same order, so all see identical scores.
                float t = 0.0f;
#pragma unroll
                for (int w = 0; w < W; ++w) {
                    const float x =
                        w == part ? s[j][e] : group_sx[(w * 16 + j * 4 + e) * 32 + lane];
                    t = w == 0 ? x : t + x;
                }
                s[j][e] = t;
            }

        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e >> 1;
                const int kp = c0 + 8 * j + 2 * t4 + (e & 1);
                const float x = kp < vis[r] && kp < hi ? s[j][e] * sl2 : -PA_INF;
                s[j][e] = x;
                mx[r] = fmaxf(mx[r], x);
            }
        }
        float msub[2], alpha[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(PA_FULL_MASK, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(PA_FULL_MASK, mx[r], 2));
            msub[r] = mx[r] == -PA_INF ? 0.0f : mx[r];
            alpha[r] = ptx_ex2(m[r] - msub[r]);
            m[r] = mx[r];
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float x = ptx_ex2(s[j][e] - msub[e >> 1]);
                s[j][e] = x;
                rs[e >> 1] += x;
            }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + rs[r];
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }
#pragma unroll
        for (int ksi = 0; ksi < 2; ++ksi) {
            pa_u32 a[4];
            a[0] = ptx_pack2<BF16>(s[2 * ksi][0], s[2 * ksi][1]);
            a[1] = ptx_pack2<BF16>(s[2 * ksi][2], s[2 * ksi][3]);
            a[2] = ptx_pack2<BF16>(s[2 * ksi + 1][0], s[2 * ksi + 1][1]);
            a[3] = ptx_pack2<BF16>(s[2 * ksi + 1][2], s[2 * ksi + 1][3]);
#pragma unroll
            for (int n = 0; n < NT; n += 2) {
                pa_u32 b0, b1, b2, b3;
                ptx_ldmatrix_x4_trans(
                    ptx_smem_addr(ks + (16 * ksi + v_row) * S + col0 + 8 * n + v_col), b0, b1,
                    b2, b3);
                ptx_mma<BF16>(o[n], a, b0, b1);
                ptx_mma<BF16>(o[n + 1], a, b2, b3);
            }
        }
        __syncthreads();  // the stage, the fp8 tile and the exchange are free again
    }
    ptx_cp_async_wait<0>();

    // 3. Results of this CTA's rows.
    const bool split = p.num_splits > 1;
    const pa_i64 R = (pa_i64)p.num_tokens * H;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float lt = l[i];
        lt += __shfl_xor_sync(PA_FULL_MASK, lt, 1);
        lt += __shfl_xor_sync(PA_FULL_MASK, lt, 2);
        if (!act[i]) continue;
        const int r = row0 + rg * 16 + g4 + 8 * i;
        const pa_i64 grow = (pa_i64)q0 * H + r;
        const float inv = lt > 0.0f ? p.v_scale / lt : 0.0f;
        const float lse = lt > 0.0f ? (m[i] + __log2f(lt)) * MLA_LN2 : -PA_INF;
        if (split) {
            float* dst = p.part_out + ((pa_i64)blockIdx.z * R + grow) * MLA_DV + col0;
#pragma unroll
            for (int n = 0; n < NT; ++n)
                *(float2*)(dst + 8 * n + 2 * t4) =
                    make_float2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
            if (part == 0 && t4 == 0) p.part_lse[(pa_i64)blockIdx.z * R + grow] = lse;
        } else {
            const pa_i64 base = grow * MLA_DV + col0;
#pragma unroll
            for (int n = 0; n < NT; ++n)
                mla_store2<BF16>(p.out, base + 8 * n + 2 * t4, o[n][2 * i] * inv,
                                 o[n][2 * i + 1] * inv);
            if (part == 0 && t4 == 0 && p.lse != 0) {
                const int t = q0 + r / H;
                p.lse[(pa_i64)(r % H) * p.num_tokens + t] = lse;
            }
        }
    }
}

#define MLA_DEFINE(NAME, BF16, KV, RG)                                                  \
    extern "C" __global__ void __launch_bounds__(MLA_GROUP_WARPS * (RG) * 32, 1)       \
        NAME(const MlaDecodeParams p) {                                                 \
        mla_decode_body<BF16, KV, RG>(p);                                               \
    }

// The host builds one variant (-DMLA_RG=4 -DMLA_BF16=1 -DMLA_KV=0; -DMLA_RG=0 builds only
// mla_combine); without the defines every variant is built (the CI compile check).
#ifdef MLA_RG
#define MLA_ALL 0
#else
#define MLA_ALL 1
#define MLA_RG 0
#define MLA_BF16 0
#define MLA_KV 0
#endif
#define MLA_WANT(BF, KV, RG) (MLA_ALL || (MLA_RG == (RG) && MLA_BF16 == (BF) && MLA_KV == (KV)))
#if MLA_WANT(0, 0, 1)
MLA_DEFINE(mla_decode_f16_r1, false, 0, 1)
#endif
#if MLA_WANT(0, 0, 2)
MLA_DEFINE(mla_decode_f16_r2, false, 0, 2)
#endif
#if MLA_WANT(0, 0, 4)
MLA_DEFINE(mla_decode_f16_r4, false, 0, 4)
#endif
#if MLA_WANT(1, 0, 1)
MLA_DEFINE(mla_decode_bf16_r1, true, 0, 1)
#endif
#if MLA_WANT(1, 0, 2)
MLA_DEFINE(mla_decode_bf16_r2, true, 0, 2)
#endif
#if MLA_WANT(1, 0, 4)
MLA_DEFINE(mla_decode_bf16_r4, true, 0, 4)
#endif
#if MLA_WANT(0, 1, 1)
MLA_DEFINE(mla_decode_f16_e4m3_r1, false, 1, 1)
#endif
#if MLA_WANT(0, 1, 2)
MLA_DEFINE(mla_decode_f16_e4m3_r2, false, 1, 2)
#endif
#if MLA_WANT(0, 1, 4)
MLA_DEFINE(mla_decode_f16_e4m3_r4, false, 1, 4)
#endif
#if MLA_WANT(1, 1, 1)
MLA_DEFINE(mla_decode_bf16_e4m3_r1, true, 1, 1)
#endif
#if MLA_WANT(1, 1, 2)
MLA_DEFINE(mla_decode_bf16_e4m3_r2, true, 1, 2)
#endif
#if MLA_WANT(1, 1, 4)
MLA_DEFINE(mla_decode_bf16_e4m3_r4, true, 1, 4)
#endif
