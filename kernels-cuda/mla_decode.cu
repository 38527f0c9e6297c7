// MLA decode (vLLM's forward_mqa) on the vector ALUs, for every compiler of the family (NVRTC,
// hiprtc, hipcc, clang -x hip): every query row attends in latent space over its request's
// cached latents, the one shared key (all 576 dims) and value (the first 512 dims) head.
// Split-KV over the key range, then mla_combine merges the splits' partials. The same rows,
// splits, masks and outputs as the tensor-core form (mla_decode_mma.cu); this one needs no
// matrix instruction, cp.async or fixed warp width.
//
// Rows: a request of q_len query tokens and H heads has q_len * H rows, row r = j * H + h
// (token j, head h), contiguous in q [T][H][576] from its first token. Query token j sits at
// position seq_len - q_len + j and sees positions [0, seq_len - q_len + j] (causal).
//
// Work: CTA (blockIdx.x, blockIdx.y, blockIdx.z) = (row tile, request, split): rows
// [16 x, 16 (x + 1)) of request y, keys [lo, hi) of split z, where lo = z * per,
// per = ceil(seq_len / num_splits) rounded up to MLA_KEYS, and hi also stops at the last
// position any row of the tile sees. 256 threads; thread t serves row t / 16 of the tile and,
// within it, lane group g = t % 16 (16 threads per row: the rows never straddle a warp or
// wavefront of 32 or 64 lanes, so the row's reductions are shuffles over 16 lanes).
//
// Algorithm per CTA (three barriers per chunk of MLA_KEYS latents):
//  1. The tile's query rows go to shared memory (16-bit, rows past the request zero). Chunks
//     of MLA_KEYS positions are loaded into registers one chunk ahead and stored to one
//     shared tile (16-bit, or raw E4M3 bytes converted as they are read); positions outside
//     [lo, hi) are stored as zeros, never loaded. A chunk never crosses a cache block (block
//     sizes are multiples of MLA_KEYS).
//  2. Scores: thread (row, g) computes the full 576-dim dot products of its row with keys g
//     and g + 16, scaled (scale; fp8: times k_scale) and masked by selection (-inf for
//     positions the row does not see and for rows past the request). An online softmax in
//     base e over the row's 16 threads (running max m and denominator l, identical on each:
//     a butterfly's sums are bit-identical on every lane) gives P (to shared memory) and the
//     rescale factor e^(m_old - m_new) (in each of the row's threads).
//  3. O (16 x 512, f32 in registers: thread (row, g) holds columns 4 g + 64 i .. + 4, i < 8)
//     is rescaled and O += P V over the chunk's first 512 dims.
//  4. Unsplit launches write out = O / l (times k_scale for fp8; 0 when l = 0) in the
//     activation dtype and lse = m + ln l; split launches write f32 partials (the same
//     normalised O and LSE; an empty split writes 0 and -inf).
//
// mla_combine: one warp / wavefront per (token, head) row: M = max_s lse_s,
// w_s = e^(lse_s - M) / Z, Z = sum_s e^(lse_s - M); out = sum_s w_s o_s, lse = M + ln Z.
//
// Layouts: q [T][H][576], out [T][H][512] (f16 / bf16); cache [num_blocks][block_size][576]
// in the activation dtype or E4M3; lse [H][T] f32; part_out [num_splits][T * H][512] f32,
// part_lse [num_splits][T * H] f32; block_table [num_reqs][bt_stride]. Shared memory
// (mla_portable_smem_bytes in src/kernels/cuda/mla.rs, at most 58 KB: inside AMD's 64 KB of
// LDS per workgroup): Q [16][584] 16-bit, the chunk [32][584] 16-bit (fp8: [32][592] bytes),
// P [16][32] f32.
//
// Bounds relied on (host side, src/backends/cuda_mla and hip_mla): metadata validated
// against the cache (query_start_loc monotonic, q_len <= seq_len, block ids of every position
// < seq_len in range); every request of the launch has q_len * H rows with
// grid.x >= ceil(rows / 16); block_size a multiple of MLA_KEYS; num_splits <= MLA_MAX_SPLITS;
// q, cache, out and part_out 16-byte aligned; T * H * 576 and the cache's element count fit
// in i64. Only chunks holding a position of [lo, hi) are loaded, so every block-table entry
// read is one of a position < seq_len.

#include "common.cuh"
#include "mla_params.cuh"

#define MLA_P_ROWS 16                    // query rows per CTA
#define MLA_P_THREADS 256                // 16 threads per row
#define MLA_P_S (MLA_LAT + 8)            // 16-bit row stride in elements
#define MLA_P_RAW_S (MLA_LAT + 16)       // fp8 row stride in bytes
#define MLA_COMBINE_WAVES 4              // rows (waves) per CTA of mla_combine

static_assert(MLA_P_THREADS == 16 * MLA_P_ROWS, "16 threads per row");
static_assert(MLA_KEYS == 32, "each thread scores keys g and g + 16");
static_assert(MLA_DV == 4 * 16 * 8, "each thread holds 8 groups of 4 value columns");

// 8 16-bit values (one uint4) as floats.
template <bool BF16>
__device__ __forceinline__ void mla_unpack8(uint4 w, float* f) {
    const pa_u32 u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (BF16) {
            f[2 * i] = __uint_as_float(u[i] << 16);
            f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        } else {
            f[2 * i] = pa_f16_to_f32((pa_u16)(u[i] & 0xffffu));
            f[2 * i + 1] = pa_f16_to_f32((pa_u16)(u[i] >> 16));
        }
    }
}

// Dims d .. d + 8 of staged chunk row `row` (16-bit, or raw E4M3) as floats.
template <bool BF16, bool FP8>
__device__ __forceinline__ void mla_key8(const pa_u8* tile, int row, int d, float* f) {
    if (FP8) {
        const uint2 w = *(const uint2*)(tile + row * MLA_P_RAW_S + d);
        const pa_u32 u[2] = {w.x, w.y};
#pragma unroll
        for (int i = 0; i < 8; ++i) f[i] = pa_e4m3_to_f32((pa_u8)(u[i / 4] >> (8 * (i % 4))));
    } else {
        mla_unpack8<BF16>(*(const uint4*)(tile + (row * MLA_P_S + d) * 2), f);
    }
}

// Four value columns c .. c + 4 of staged row `row` as floats.
template <bool BF16, bool FP8>
__device__ __forceinline__ void mla_value4(const pa_u8* tile, int row, int c, float* f) {
    if (FP8) {
        const pa_u32 u = *(const pa_u32*)(tile + row * MLA_P_RAW_S + c);
#pragma unroll
        for (int i = 0; i < 4; ++i) f[i] = pa_e4m3_to_f32((pa_u8)(u >> (8 * i)));
    } else {
        const uint2 w = *(const uint2*)(tile + (row * MLA_P_S + c) * 2);
        float g[8];
        mla_unpack8<BF16>(make_uint4(w.x, w.y, 0u, 0u), g);
#pragma unroll
        for (int i = 0; i < 4; ++i) f[i] = g[i];
    }
}

template <bool BF16>
__device__ __forceinline__ void mla_store4(void* out, pa_i64 i, const float* v) {
    pa_u16 h[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = BF16 ? pa_f32_to_bf16(v[k]) : pa_f32_to_f16(v[k]);
    *(uint2*)((pa_u16*)out + i) =
        make_uint2((pa_u32)h[0] | ((pa_u32)h[1] << 16), (pa_u32)h[2] | ((pa_u32)h[3] << 16));
}

template <bool BF16, int KV>
__device__ __forceinline__ void mla_decode_portable_body(const MlaDecodeParams& p) {
    constexpr bool FP8 = KV != 0;
    constexpr int EB = FP8 ? 1 : 2;
    constexpr int RS = FP8 ? MLA_P_RAW_S : MLA_P_S * 2;  // bytes per staged row
    constexpr int CHB = MLA_LAT * EB / 16;                // 16-byte pieces per latent
    constexpr int PIECES = MLA_KEYS * CHB;
    constexpr int PER = (PIECES + MLA_P_THREADS - 1) / MLA_P_THREADS;
    extern __shared__ uint4 mla_p_smem[];
    pa_u16* q_s = (pa_u16*)mla_p_smem;                            // [16][S]
    pa_u8* k_s = (pa_u8*)(q_s + MLA_P_ROWS * MLA_P_S);            // [32] rows of RS bytes
    float* p_s = (float*)(k_s + MLA_KEYS * RS);                   // [16][32]

    const int tid = threadIdx.x;
    const int r = tid >> 4;  // the tile's row
    const int g = tid & 15;  // lane group within the row
    const int req = blockIdx.y;
    const int H = p.num_heads;
    const int q0 = p.query_start_loc[req];
    const int ql = p.query_start_loc[req + 1] - q0;
    const int seq = p.seq_lens[req];
    const int nrows = ql * H;
    const int row0 = blockIdx.x * MLA_P_ROWS;
    if (row0 >= nrows) return;  // the whole CTA, before any barrier
    const int ctx = seq - ql;
    const int per = ((seq + p.num_splits - 1) / p.num_splits + MLA_KEYS - 1) / MLA_KEYS * MLA_KEYS;
    const int lo = blockIdx.z * per;
    const int jmax = min(ql - 1, (row0 + MLA_P_ROWS - 1) / H);
    const int hi = min(min(seq, lo + per), ctx + jmax + 1);
    const int nch = lo < hi ? (hi - lo + MLA_KEYS - 1) / MLA_KEYS : 0;
    const int* bt = p.block_table + (pa_i64)req * p.bt_stride;
    const pa_i64 qrow0 = (pa_i64)q0 * H + row0;
    const bool act = row0 + r < nrows;
    const int vis = act ? ctx + (row0 + r) / H + 1 : 0;  // positions below vis are seen

    // 1. Q rows (zeros past the request).
    {
        const uint4* q = (const uint4*)p.q;
        constexpr int QCH = MLA_LAT / 8;
        for (int i = tid; i < MLA_P_ROWS * QCH; i += MLA_P_THREADS) {
            const int rr = i / QCH;
            const int c = i - rr * QCH;
            const uint4 v = row0 + rr < nrows ? q[(qrow0 + rr) * QCH + c] : make_uint4(0u, 0u, 0u, 0u);
            *(uint4*)(q_s + rr * MLA_P_S + c * 8) = v;
        }
    }

    // Chunk c's pieces of this thread into registers (zeros for positions outside [lo, hi)).
    uint4 reg[PER];
    auto load = [&](int c) {
        const int c0 = lo + MLA_KEYS * c;
        const pa_i64 block = bt[c0 / p.block_size];
        const int off = c0 % p.block_size;
        const uint4* src =
            (const uint4*)((const pa_u8*)p.cache + ((block * p.block_size + off) * MLA_LAT) * EB);
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const int piece = tid + k * MLA_P_THREADS;
            const int j = piece / CHB;
            const bool in = piece < PIECES && c0 + j < hi;
            reg[k] = in ? src[piece] : make_uint4(0u, 0u, 0u, 0u);
        }
    };
    auto store = [&]() {
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const int piece = tid + k * MLA_P_THREADS;
            if (piece < PIECES) {
                const int j = piece / CHB;
                const int cc = piece - j * CHB;
                *(uint4*)(k_s + j * RS + cc * 16) = reg[k];
            }
        }
    };

    float m = -PA_INF, l = 0.0f;
    float o[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

    if (nch > 0) load(0);
    for (int c = 0; c < nch; ++c) {
        store();
        __syncthreads();  // the chunk (and Q) staged for every thread
        if (c + 1 < nch) load(c + 1);  // in flight while this chunk is computed
        const int c0 = lo + MLA_KEYS * c;

        // 2. Scores of keys g and g + 16.
        float s0 = 0.0f, s1 = 0.0f;
        for (int d = 0; d < MLA_LAT; d += 8) {
            float qv[8], k0[8], k1[8];
            mla_unpack8<BF16>(*(const uint4*)(q_s + r * MLA_P_S + d), qv);
            mla_key8<BF16, FP8>(k_s, g, d, k0);
            mla_key8<BF16, FP8>(k_s, g + 16, d, k1);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                s0 += qv[i] * k0[i];
                s1 += qv[i] * k1[i];
            }
        }
        const int kp0 = c0 + g;
        const int kp1 = c0 + g + 16;
        s0 = kp0 < vis && kp0 < hi ? s0 * p.scale : -PA_INF;
        s1 = kp1 < vis && kp1 < hi ? s1 * p.scale : -PA_INF;
        float mx = fmaxf(m, fmaxf(s0, s1));
#pragma unroll
        for (int o2 = 8; o2 > 0; o2 >>= 1) mx = fmaxf(mx, pa_shfl_xor(mx, o2));
        const float msub = mx == -PA_INF ? 0.0f : mx;
        const float alpha = expf(m - msub);  // m = -inf: 0
        const float e0 = expf(s0 - msub);
        const float e1 = expf(s1 - msub);
        float rs = e0 + e1;
#pragma unroll
        for (int o2 = 8; o2 > 0; o2 >>= 1) rs += pa_shfl_xor(rs, o2);
        l = l * alpha + rs;
        m = mx;
        p_s[r * MLA_KEYS + g] = e0;
        p_s[r * MLA_KEYS + g + 16] = e1;
        __syncthreads();  // P of every row staged

        // 3. O = O * alpha + P V over this thread's 32 value columns.
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            o[i][0] *= alpha;
            o[i][1] *= alpha;
            o[i][2] *= alpha;
            o[i][3] *= alpha;
        }
        for (int k = 0; k < MLA_KEYS; ++k) {
            const float pk = p_s[r * MLA_KEYS + k];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                float v[4];
                mla_value4<BF16, FP8>(k_s, k, 4 * g + 64 * i, v);
                o[i][0] += pk * v[0];
                o[i][1] += pk * v[1];
                o[i][2] += pk * v[2];
                o[i][3] += pk * v[3];
            }
        }
        __syncthreads();  // the chunk tile and P are free again
    }

    // 4. Results of this thread's row.
    if (!act) return;
    const bool split = p.num_splits > 1;
    const pa_i64 R = (pa_i64)p.num_tokens * H;
    const int rr = row0 + r;
    const pa_i64 grow = (pa_i64)q0 * H + rr;
    const float inv = l > 0.0f ? p.v_scale / l : 0.0f;
    const float lse = l > 0.0f ? m + logf(l) : -PA_INF;
    if (split) {
        float* dst = p.part_out + ((pa_i64)blockIdx.z * R + grow) * MLA_DV;
#pragma unroll
        for (int i = 0; i < 8; ++i)
            *(float4*)(dst + 4 * g + 64 * i) =
                make_float4(o[i][0] * inv, o[i][1] * inv, o[i][2] * inv, o[i][3] * inv);
        if (g == 0) p.part_lse[(pa_i64)blockIdx.z * R + grow] = lse;
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float v[4] = {o[i][0] * inv, o[i][1] * inv, o[i][2] * inv, o[i][3] * inv};
            mla_store4<BF16>(p.out, grow * MLA_DV + 4 * g + 64 * i, v);
        }
        if (g == 0 && p.lse != 0) {
            const int t = q0 + rr / H;
            p.lse[(pa_i64)(rr % H) * p.num_tokens + t] = lse;
        }
    }
}

#define MLA_PORTABLE_DEFINE(NAME, BF16, KV)                                               \
    extern "C" __global__ void PA_LAUNCH_BOUNDS(MLA_P_THREADS, 1) NAME(const MlaDecodeParams p) { \
        mla_decode_portable_body<BF16, KV>(p);                                            \
    }

MLA_PORTABLE_DEFINE(mla_decode_portable_f16, false, 0)
MLA_PORTABLE_DEFINE(mla_decode_portable_bf16, true, 0)
MLA_PORTABLE_DEFINE(mla_decode_portable_f16_e4m3, false, 1)
MLA_PORTABLE_DEFINE(mla_decode_portable_bf16_e4m3, true, 1)

static_assert(MLA_MAX_SPLITS % PA_WAVE == 0, "mla_combine holds MLA_MAX_SPLITS / PA_WAVE LSEs per lane");
static_assert(MLA_DV % (4 * PA_WAVE) == 0, "mla_combine's lanes hold whole float4s of a row");

extern "C" __global__ void PA_LAUNCH_BOUNDS(MLA_COMBINE_WAVES * PA_WAVE, 1) mla_combine(const MlaCombineParams p) {
    constexpr int NX = MLA_MAX_SPLITS / PA_WAVE;
    constexpr int NV = MLA_DV / (4 * PA_WAVE);
    const int lane = threadIdx.x & (PA_WAVE - 1);
    const pa_i64 R = (pa_i64)p.num_tokens * p.num_heads;
    const pa_i64 row = (pa_i64)blockIdx.x * MLA_COMBINE_WAVES + (threadIdx.x >> PA_WAVE_LOG2);
    if (row >= R) return;  // the whole wave; no CTA barrier follows
    const int ns = min(p.num_splits, MLA_MAX_SPLITS);
    float x[NX];
    float mx = -PA_INF;
#pragma unroll
    for (int k = 0; k < NX; ++k) {
        const int s = lane + PA_WAVE * k;
        x[k] = s < ns ? p.part_lse[(pa_i64)s * R + row] : -PA_INF;
        mx = fmaxf(mx, x[k]);
    }
    mx = pa_warp_max(mx);
    float z = 0.0f;
#pragma unroll
    for (int k = 0; k < NX; ++k) {
        x[k] = (x[k] == -PA_INF || mx == -PA_INF) ? 0.0f : expf(x[k] - mx);
        z += x[k];
    }
    z = pa_warp_sum(z);
    const float inv = z > 0.0f ? 1.0f / z : 0.0f;
    float4 acc[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) acc[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < ns; ++s) {
        // The split's weight, from the lane that holds its LSE.
        float xs = x[0];
#pragma unroll
        for (int k = 1; k < NX; ++k) xs = s / PA_WAVE == k ? x[k] : xs;
        const float w = pa_shfl(xs, s % PA_WAVE) * inv;
        if (w == 0.0f) continue;  // uniform across the wave; an empty split wrote zeros
        const float4* src = (const float4*)(p.part_out + ((pa_i64)s * R + row) * MLA_DV);
#pragma unroll
        for (int k = 0; k < NV; ++k) {
            const float4 v = src[lane + PA_WAVE * k];
            acc[k].x += w * v.x;
            acc[k].y += w * v.y;
            acc[k].z += w * v.z;
            acc[k].w += w * v.w;
        }
    }
    const pa_i64 base = row * MLA_DV;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const pa_i64 d = base + 4 * (lane + PA_WAVE * k);
        pa_store(p.out, d, p.out_dtype, acc[k].x);
        pa_store(p.out, d + 1, p.out_dtype, acc[k].y);
        pa_store(p.out, d + 2, p.out_dtype, acc[k].z);
        pa_store(p.out, d + 3, p.out_dtype, acc[k].w);
    }
    if (lane == 0 && p.lse != 0) {
        const pa_i64 t = row / p.num_heads;
        const pa_i64 h = row % p.num_heads;
        p.lse[h * p.num_tokens + t] = z > 0.0f ? mx + logf(z) : -PA_INF;
    }
}
