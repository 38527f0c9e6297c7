// The linear layers of the model runner and of the MLA prefill's kv_b_proj expansion, for
// every compiler of the family (parameter block: src/kernels/cuda/model_ops.rs): p = x · Wᵀ
// in f32, a tiled SGEMM for many rows and a GEMV for a few, each with an optional RMSNorm of
// the input rows before the product and an output step after it (src/compute/fused_linear.rs
// says what each computes):
//   epilogue 0  store        y [T][N] = p
//   epilogue 1  accumulate   y [T][N] += p (y is read once, by the thread that writes it)
//   epilogue 2  swiglu       y [T][I] = silu(p[:, i]) · p[:, I + i], N = 2I
//   epilogue 3  rope split   p is a fused Q/K/V projection, N = (H + 2Hk)·d: query heads
//                            rotated into y = q [T][H][d], key heads into y2 = k [T][Hk][d],
//                            value heads copied into y3 = v [T][Hk][d] (pa_rope_rotate, the
//                            arithmetic of model_ops.cu's model_rope); with
//                            cache_block_size > 0 the key and value heads go instead into
//                            the f32 paged cache y2 at token t's slot slots[t] (NHD or HND,
//                            reshape_and_cache.cu's layout; slot -1: not written), y3 unused
// norm != null: each input row is used as h = x · inv · g with inv = 1 / sqrtf(mean(x²) + eps)
// and g = norm [K] (model_rms_norm's expression; the squares are summed in this kernel's
// own order).
//
// Pairs. The swiglu and rope outputs combine two products per output element (gate and up;
// the two coordinates of a rotated pair), so those forms compute weight rows in *pairs*:
// pair u is rows (u, I + u) for swiglu and, for rope, head = u / half, i = u % half, rows
// head·d + ia and head·d + ib with (ia, ib) = (2i, 2i + 1) interleaved or (i, i + half).
// The GEMV computes two rows per warp in every form (store / accumulate: rows 2u and 2u + 1,
// the second dropped past N), so every x element it loads feeds two rows.
//
// Layout (row-major, dense, 256-byte aligned allocations): x [T][K], W [N][K] (PyTorch's
// [out_features][in_features]), outputs as above. `vec4` says that K is a multiple of 4 and
// x, W, norm are 16-byte aligned (checked on the host): the kernels then move float4s.
// W's element type is a build option, -DLIN_W: 0 f32 (default), 1 f16, 2 bf16. 16-bit
// weights are widened to f32 as they are loaded (lin_w4 / lin_w1: a vec4 load reads 8 bytes),
// so a GEMV streams half the bytes; everything after the load is the f32 kernel's.
//
// Algorithms:
//   * model_linear_tiled (T > 16): 64×64 output tile per 256-thread block, K in steps of 16.
//     The step's x and W rows are read with coalesced vector loads (float4; 8 bytes of a
//     16-bit W) and stored transposed
//     in shared memory ([16][64 + 4]: the padding keeps the float4 reads aligned and spreads
//     the transposing stores); each thread then keeps a 4×4 register block (rows ty·4..,
//     columns tx·4..) and does 16 FMAs per two float4 shared loads. Loads outside the
//     matrices read zeros and stores outside the outputs are skipped, so any T, K, N work.
//     With a norm, the block first sums the squares of its 64 rows (4 threads a row) into
//     inv_sh and scales x as it loads it. In the pair forms the tile's 64 columns are 32
//     pairs: column c is member (c >> 1) & 1 of pair (c >> 2)·2 + (c & 1), so a thread's four
//     columns are both members of two pairs (acc[.][j] with acc[.][j + 2]).
//   * model_linear_gemv{1,4,8,16}{,_norm}{,_split} (T ≤ 1 / 4 / 8 / 16; memory-bound: every
//     weight element is read once for all T tokens): one warp / wavefront (PA_WAVE lanes)
//     per row pair, or with _split four waves per pair (each a quarter of K, added in shared
//     memory: the host takes it when there are too few pairs to fill the GPU with one wave
//     each). At decode sizes a layer's weights are a few MB and the kernel is bound by the
//     loads in flight, so each lane loads its float4s of both rows in chunks, every load of
//     a chunk issued before the first is used (K = 576: the whole row in one chunk), then
//     the same columns of the T input rows (small: they stay in L1 / L2); two partial sums
//     per token stay in registers, shuffles reduce them, and lane tt writes token tt's
//     outputs. The _norm forms sum each row's squares in the same pass and compute
//     (x · g) · Wᵀ, scaled by inv at the end (the same product as (x · inv · g) · Wᵀ up to
//     rounding).
//
// Bounds relied on (host checks in src/compute/ and the MLA backends): the sizes match the
// tensors; element counts fit in i64 and T, K, N in i32; grid.y of the tiled kernel =
// ceil(T / 64) ≤ 65535; a GEMV runs only for 1 ≤ T ≤ its width; positions only feed
// arithmetic; into the cache, every slot is -1 or inside the cache's blocks (the batch's
// metadata checked against the cache on the host, by linear_fused and before a graph
// replay).

#include "common.cuh"
#include "linear_params.cuh"

#define MO_THREADS 256
#define LIN_BM 64
#define LIN_BN 64
#define LIN_BK 16
#define LIN_PAD 4
#define GEMV_THREADS 128
#define GEMV_CHUNK 6  // float4s of each row a lane loads at once (K = 576: one chunk)

extern "C" __global__ void PA_LAUNCH_BOUNDS(MO_THREADS, 1) model_linear_tiled(const LinearParams p) {
    PA_DEPENDENT_PROLOGUE();
    __shared__ __attribute__((aligned(16))) float as[LIN_BK][LIN_BM + LIN_PAD];
    __shared__ __attribute__((aligned(16))) float bs[LIN_BK][LIN_BN + LIN_PAD];
    __shared__ float inv_sh[LIN_BM];
    const int tid = threadIdx.x;
    const int tx = tid % (LIN_BN / 4);
    const int ty = tid / (LIN_BN / 4);
    const pa_i64 m0 = (pa_i64)blockIdx.y * LIN_BM;
    const bool pairs = p.epilogue >= LIN_SWIGLU;
    // Plain forms: columns n0.. are rows n0..; pair forms: pairs u0.. (32 per tile).
    const pa_i64 n0 = (pa_i64)blockIdx.x * LIN_BN;
    const int u0 = blockIdx.x * (LIN_BN / 2);
    const int units = lin_units(p);

    if (p.norm) {
        // 4 threads per row: strided partial sums of squares, combined by two shuffles.
        const int r = tid / 4;
        const int q = tid % 4;
        float s = 0.0f;
        if (m0 + r < p.t) {
            const float* xr = p.x + (m0 + r) * p.k;
            if (p.vec4) {
                for (int c = q; c < p.k / 4; c += 4) s = lin_sq4(pa_ldg((const float4*)xr + c), s);
            } else {
                for (int c = q; c < p.k; c += 4) {
                    const float v = pa_ldg(xr + c);
                    s = fmaf(v, v, s);
                }
            }
        }
        s += pa_shfl_xor(s, 1);
        s += pa_shfl_xor(s, 2);
        if (q == 0) inv_sh[r] = 1.0f / sqrtf(s / (float)p.k + p.eps);
        __syncthreads();
    }

    // The weight row behind tile column r, or -1 past the matrix (each thread loads the same
    // columns at every K step: looked up once).
    auto wrow = [&](int r) -> pa_i64 {
        if (!pairs) return n0 + r < p.n ? n0 + r : -1;
        const int u = u0 + (r >> 2) * 2 + (r & 1);
        if (u >= units) return -1;
        int r0, r1;
        lin_pair_rows(p, u, &r0, &r1);
        return ((r >> 1) & 1) ? r1 : r0;
    };

    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    const pa_i64 wr_vec = wrow(tid / 4);
    pa_i64 wr_scalar[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) wr_scalar[i] = wrow((tid + i * MO_THREADS) / LIN_BK);

    for (int k0 = 0; k0 < p.k; k0 += LIN_BK) {
        if (p.vec4) {
            // 64 rows × 4 float4 per matrix: one float4 of x and one of W per thread.
            const int r = tid / 4;
            const int c = (tid % 4) * 4;
            const bool kin = k0 + c < p.k;
            const pa_i64 wr = wr_vec;
            float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float4 b = a;
            if (m0 + r < p.t && kin) {
                a = pa_ldg((const float4*)(p.x + (m0 + r) * p.k + k0 + c));
                if (p.norm) a = lin_scale4(a, inv_sh[r], pa_ldg((const float4*)(p.norm + k0 + c)));
            }
            if (wr >= 0 && kin) b = lin_w4(p, wr * p.k + k0 + c);
            as[c + 0][r] = a.x;
            as[c + 1][r] = a.y;
            as[c + 2][r] = a.z;
            as[c + 3][r] = a.w;
            bs[c + 0][r] = b.x;
            bs[c + 1][r] = b.y;
            bs[c + 2][r] = b.z;
            bs[c + 3][r] = b.w;
        } else {
            // 64 rows × 16 floats per matrix: four of each per thread, 16 threads per row.
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int e = tid + i * MO_THREADS;
                const int r = e / LIN_BK;
                const int c = e % LIN_BK;
                const bool kin = k0 + c < p.k;
                const pa_i64 wr = wr_scalar[i];
                float a = 0.0f;
                if (m0 + r < p.t && kin) {
                    a = pa_ldg(p.x + (m0 + r) * p.k + k0 + c);
                    if (p.norm) a = a * inv_sh[r] * pa_ldg(p.norm + k0 + c);
                }
                as[c][r] = a;
                bs[c][r] = (wr >= 0 && kin) ? lin_w1(p, wr * p.k + k0 + c) : 0.0f;
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < LIN_BK; ++kk) {
            const float4 a = *(const float4*)&as[kk][ty * 4];
            const float4 b = *(const float4*)&bs[kk][tx * 4];
            const float av[4] = {a.x, a.y, a.z, a.w};
            const float bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }

    if (pairs) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const pa_i64 m = m0 + ty * 4 + i;
            if (m >= p.t) break;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int u = u0 + tx * 2 + j;
                if (u < units) lin_put_pair(p, m, u, acc[i][j], acc[i][j + 2]);
            }
        }
        return;
    }
    const pa_i64 nb = n0 + tx * 4;
    const bool accumulate = p.epilogue == LIN_ACCUMULATE;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const pa_i64 m = m0 + ty * 4 + i;
        if (m >= p.t) break;
        float* yr = p.y + m * p.n;
        if (p.n % 4 == 0 && nb + 3 < p.n) {
            float4 v = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
            if (accumulate) {
                const float4 o = *(const float4*)(yr + nb);
                v = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
            }
            *(float4*)(yr + nb) = v;
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (nb + j < p.n) yr[nb + j] = accumulate ? yr[nb + j] + acc[i][j] : acc[i][j];
        }
    }
}

// The GEMV for T ≤ MAXT tokens: 3·MAXT partial sums per lane in registers (two rows and,
// with NORM, the sums of squares), so each width is its own entry point. Every token slot up
// to MAXT is computed (past T from the last row again) and only T are written: no branch in
// the inner loop, so the compiler issues every load of a chunk before the first FMA.
// SPLIT waves share a pair (each sums a slice of K; shared memory adds the slices).
template <int MAXT, bool NORM, int SPLIT>
__device__ __forceinline__ void linear_gemv(const LinearParams& p) {
    constexpr int WAVES = GEMV_THREADS / PA_WAVE;
    constexpr int S = SPLIT < WAVES ? SPLIT : WAVES;
    constexpr int PER_BLOCK = WAVES / S;
    // The split forms need fewer loads per lane in flight; the widest keeps one float4 per
    // row on AMD, where the 16-token split body would otherwise spill a register (gfx1030).
    constexpr int CHUNK = S == 1 ? GEMV_CHUNK : (PA_AMD && MAXT > 8 ? 1 : (GEMV_CHUNK + S - 1) / S);
    __shared__ float red[S > 1 ? WAVES : 1][3 * MAXT];
    const int lane = threadIdx.x & (PA_WAVE - 1);
    const int wave = threadIdx.x >> PA_WAVE_LOG2;
    const int slot = wave / S;
    const int part = wave - slot * S;
    const int t = p.t;
    const int units = lin_units(p);
    // The loop's trip count is the block's, not the wave's: every thread reaches the barriers.
    for (int u0 = blockIdx.x * PER_BLOCK; u0 < units; u0 += gridDim.x * PER_BLOCK) {
        const int u = u0 + slot;
        const bool active = u < units;
        int r0 = 0;
        int r1 = 0;
        if (active) lin_pair_rows(p, u, &r0, &r1);
        float a0[MAXT];
        float a1[MAXT];
        float ss[MAXT];
#pragma unroll
        for (int tt = 0; tt < MAXT; ++tt) {
            a0[tt] = 0.0f;
            a1[tt] = 0.0f;
            ss[tt] = 0.0f;
        }
        if (active && p.vec4) {
            const int kv = p.k / 4;
            const int step = S * PA_WAVE;
            const pa_i64 w0 = (pa_i64)r0 * p.k;
            const pa_i64 w1 = (pa_i64)r1 * p.k;
            const float4* xr = (const float4*)p.x;
            for (int base = part * PA_WAVE + lane; base < kv; base += CHUNK * step) {
                // Every weight load of the chunk is issued before the first is used.
                float4 wa[CHUNK];
                float4 wb[CHUNK];
#pragma unroll
                for (int j = 0; j < CHUNK; ++j) {
                    const int c = base + j * step;
                    const bool in = c < kv;
                    wa[j] = in ? lin_w4(p, w0 + 4 * (pa_i64)c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    wb[j] = in ? lin_w4(p, w1 + 4 * (pa_i64)c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                }
#pragma unroll
                for (int j = 0; j < CHUNK; ++j) {
                    const int c = base + j * step;
                    if (c < kv) {
                        float4 g = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                        if (NORM) g = pa_ldg((const float4*)p.norm + c);
#pragma unroll
                        for (int tt = 0; tt < MAXT; ++tt) {
                            float4 xv = pa_ldg(xr + (pa_i64)min(tt, t - 1) * kv + c);
                            if (NORM) {
                                ss[tt] = lin_sq4(xv, ss[tt]);
                                xv = make_float4(xv.x * g.x, xv.y * g.y, xv.z * g.z, xv.w * g.w);
                            }
                            a0[tt] = lin_dot4(wa[j], xv, a0[tt]);
                            a1[tt] = lin_dot4(wb[j], xv, a1[tt]);
                        }
                    }
                }
            }
        } else if (active) {
            const pa_i64 w0 = (pa_i64)r0 * p.k;
            const pa_i64 w1 = (pa_i64)r1 * p.k;
#pragma unroll 2
            for (int c = part * PA_WAVE + lane; c < p.k; c += S * PA_WAVE) {
                const float wa = lin_w1(p, w0 + c);
                const float wb = lin_w1(p, w1 + c);
                const float g = NORM ? pa_ldg(p.norm + c) : 0.0f;
#pragma unroll
                for (int tt = 0; tt < MAXT; ++tt) {
                    float xv = pa_ldg(p.x + (pa_i64)min(tt, t - 1) * p.k + c);
                    if (NORM) {
                        ss[tt] = fmaf(xv, xv, ss[tt]);
                        xv = xv * g;
                    }
                    a0[tt] = fmaf(wa, xv, a0[tt]);
                    a1[tt] = fmaf(wb, xv, a1[tt]);
                }
            }
        }
        // Every lane holds the wave's totals after the butterflies.
#pragma unroll
        for (int tt = 0; tt < MAXT; ++tt) {
            a0[tt] = pa_warp_sum(a0[tt]);
            a1[tt] = pa_warp_sum(a1[tt]);
            if (NORM) ss[tt] = pa_warp_sum(ss[tt]);
        }
        if (S == 1) {
#pragma unroll
            for (int tt = 0; tt < MAXT; ++tt) {
                if (active && tt < t && lane == tt) {
                    float s0 = a0[tt];
                    float s1 = a1[tt];
                    if (NORM) {
                        const float inv = 1.0f / sqrtf(ss[tt] / (float)p.k + p.eps);
                        s0 *= inv;
                        s1 *= inv;
                    }
                    lin_put_pair(p, tt, u, s0, s1);
                }
            }
        } else {
            if (lane == 0) {
#pragma unroll
                for (int tt = 0; tt < MAXT; ++tt) {
                    red[wave][tt] = a0[tt];
                    red[wave][MAXT + tt] = a1[tt];
                    red[wave][2 * MAXT + tt] = ss[tt];
                }
            }
            __syncthreads();
            if (active && part == 0 && lane < t) {
                float s0 = 0.0f;
                float s1 = 0.0f;
                float sq = 0.0f;
#pragma unroll
                for (int w = 0; w < S; ++w) {
                    s0 += red[wave + w][lane];
                    s1 += red[wave + w][MAXT + lane];
                    sq += red[wave + w][2 * MAXT + lane];
                }
                if (NORM) {
                    const float inv = 1.0f / sqrtf(sq / (float)p.k + p.eps);
                    s0 *= inv;
                    s1 *= inv;
                }
                lin_put_pair(p, lane, u, s0, s1);
            }
            __syncthreads();  // red is rewritten by the block's next pairs
        }
    }
}

// MIN_BLOCKS bounds the registers (more resident blocks keep more loads in flight).
#define LIN_GEMV_ENTRY(NAME, MAXT, NORM, SPLIT, MIN_BLOCKS)                               \
    extern "C" __global__ void PA_LAUNCH_BOUNDS(GEMV_THREADS, MIN_BLOCKS)                  \
        NAME(const LinearParams p) {                                                       \
        PA_DEPENDENT_PROLOGUE();                                                           \
        linear_gemv<MAXT, NORM, SPLIT>(p);                                                 \
    }

LIN_GEMV_ENTRY(model_linear_gemv1, 1, false, 1, 8)
LIN_GEMV_ENTRY(model_linear_gemv4, 4, false, 1, 4)
LIN_GEMV_ENTRY(model_linear_gemv8, 8, false, 1, 3)
LIN_GEMV_ENTRY(model_linear_gemv16, 16, false, 1, 2)
LIN_GEMV_ENTRY(model_linear_gemv1_norm, 1, true, 1, 8)
LIN_GEMV_ENTRY(model_linear_gemv4_norm, 4, true, 1, 4)
LIN_GEMV_ENTRY(model_linear_gemv8_norm, 8, true, 1, 3)
LIN_GEMV_ENTRY(model_linear_gemv16_norm, 16, true, 1, 2)
LIN_GEMV_ENTRY(model_linear_gemv1_split, 1, false, 4, 8)
LIN_GEMV_ENTRY(model_linear_gemv4_split, 4, false, 4, 5)
LIN_GEMV_ENTRY(model_linear_gemv8_split, 8, false, 4, 4)
LIN_GEMV_ENTRY(model_linear_gemv16_split, 16, false, 4, 3)
LIN_GEMV_ENTRY(model_linear_gemv1_norm_split, 1, true, 4, 8)
LIN_GEMV_ENTRY(model_linear_gemv4_norm_split, 4, true, 4, 5)
LIN_GEMV_ENTRY(model_linear_gemv8_norm_split, 8, true, 4, 4)
LIN_GEMV_ENTRY(model_linear_gemv16_norm_split, 16, true, 4, 3)
