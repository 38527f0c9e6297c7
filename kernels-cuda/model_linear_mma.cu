// The linear layers for 2 to 16 tokens on tensor cores in f32 accuracy (NVIDIA sm_80+): the
// GEMV of model_linear.cu, with the same parameter block, row pairs and epilogues
// (linear_params.cuh), for the token counts where that GEMV is bound by each warp's serial
// chain (every warp owns one row pair and re-reads, re-norms and re-multiplies all T input
// rows for it).
//
// Precision: each f32 operand v is split into big = tf32(v) and small = tf32(v - big) (the
// next 11 bits), and a product is big_w·big_x + big_w·small_x + small_w·big_x, the three
// m16n8k8 tf32 products accumulated in f32 ("3xTF32"): about 21 significant bits per product
// against f32's 24, the same order as a reordered f32 sum. 16-bit weights are exact in tf32
// (small_w = 0), so their builds skip the third product.
//
// Work: a CTA of MMA_WARPS warps owns a tile of 8 row pairs (16 weight rows: pair u0 + g gives
// the m16 rows g and g + 8, lin_pair_rows' r0 and r1) for every token; warp w takes the
// tile's k-blocks of 32 input features w, w + MMA_WARPS, ...; the warps' accumulators are
// added in shared memory in warp order, so a result does not depend on the launch.
//
// Per k-block kb (32 features; the next block's loads issued before this one is multiplied),
// lane (g = lane / 4, t = lane % 4) loads 8 consecutive
// features 8t .. 8t + 7 of weight rows r0(g) and r1(g) and of token g's input row (two float4s
// each) and feeds them to four k8 steps s = 0..3, step s taking features 8t + 2s (logical k t)
// and 8t + 2s + 1 (logical k t + 4): a permutation of the block's features applied alike to
// the A (weights, row-major m16 x k8) and B (inputs, k8 x n8 with n = token) fragments, which
// a dot product does not see. Token columns past T recompute the last token and are not
// written.
//
// Norm (RMSNorm of the input rows): the B values are x · g (the norm weight); each lane also
// sums x² of its token's features, and the CTA adds the lanes and warps of each token in a
// fixed order; the epilogue scales by inv = 1 / sqrt(ss / K + eps), as the GEMV does.
//
// Layout: as model_linear.cu (x [T][K], W [N][K], 16-byte aligned, vec4), and K a multiple
// of 32 (host check). Shared memory (static): the warps' accumulators [MMA_WARPS][NT][32][4]
// and sums of squares [MMA_WARPS][16].
//
// The two small-term products accumulate apart from the big one (acc_lo) and join it at the
// end: a tensor core's f32 accumulation may truncate, and a separate small sum keeps that
// bias off the hundreds of small additions.
//
// Bounds relied on (host side, src/compute/cuda.rs): 2 <= T <= 16, K % 32 == 0, vec4, the
// sizes as model_linear.cu's; grid.x = ceil(units / 8); pairs past the last unit load the
// last unit's rows and are not written.

#include "common.cuh"
#include "linear_params.cuh"

#define MMA_WARPS 4

__device__ __forceinline__ pa_u32 mma_tf32(float v) {
    pa_u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
    return r;
}

// d += a · b, m16n8k8, tf32 inputs, f32 accumulators.
__device__ __forceinline__ void mma_m16n8k8(float* d, const pa_u32* a, pa_u32 b0, pa_u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The big / small split of v (3xTF32).
__device__ __forceinline__ void mma_split(float v, pa_u32* big, pa_u32* small) {
    *big = mma_tf32(v);
    *small = mma_tf32(v - __uint_as_float(*big));
}

// NT n8 tiles of tokens (1: T <= 8, 2: T <= 16).
template <int NT, bool NORM>
__device__ __forceinline__ void linear_mma(const LinearParams& p) {
    __shared__ __attribute__((aligned(16))) float acc_s[MMA_WARPS][NT][32][4];
    __shared__ float ss_s[MMA_WARPS][16];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int units = lin_units(p);
    const int u0 = blockIdx.x * 8;
    // This lane's weight rows (pair u0 + g; a pair past the last unit reloads the last).
    int r0, r1;
    lin_pair_rows(p, min(u0 + g, units - 1), &r0, &r1);
    // This lane's token rows, one per n8 tile (tokens past T recompute the last).
    const float* xrow[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) xrow[n] = p.x + (pa_i64)min(8 * n + g, p.t - 1) * p.k;

    float acc[NT][4];
    float acc_lo[NT][4];
    float ss[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
        acc_lo[n][0] = acc_lo[n][1] = acc_lo[n][2] = acc_lo[n][3] = 0.0f;
        ss[n] = 0.0f;
    }
    // One k-block's operands as this lane loads them: weights of rows r0 and r1, the norm
    // weight, the token rows (features f .. f + 7, f = 32 kb + 8t).
    struct Block {
        float4 w[4];
        float4 g[2];
        float4 x[NT][2];
    };
    auto load = [&](int kb, Block& b) {
        const int f = kb * 32 + 8 * t;
        b.w[0] = lin_w4(p, (pa_i64)r0 * p.k + f);
        b.w[1] = lin_w4(p, (pa_i64)r0 * p.k + f + 4);
        b.w[2] = lin_w4(p, (pa_i64)r1 * p.k + f);
        b.w[3] = lin_w4(p, (pa_i64)r1 * p.k + f + 4);
        if (NORM) {
            b.g[0] = pa_ldg((const float4*)(p.norm + f));
            b.g[1] = pa_ldg((const float4*)(p.norm + f + 4));
        }
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            b.x[n][0] = pa_ldg((const float4*)(xrow[n] + f));
            b.x[n][1] = pa_ldg((const float4*)(xrow[n] + f + 4));
        }
    };
    // The block's four k8 steps.
    auto multiply = [&](const Block& b) {
        const float wr0[8] = {b.w[0].x, b.w[0].y, b.w[0].z, b.w[0].w,
                              b.w[1].x, b.w[1].y, b.w[1].z, b.w[1].w};
        const float wr1[8] = {b.w[2].x, b.w[2].y, b.w[2].z, b.w[2].w,
                              b.w[3].x, b.w[3].y, b.w[3].z, b.w[3].w};
        float xv[NT][8];
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const float raw[8] = {b.x[n][0].x, b.x[n][0].y, b.x[n][0].z, b.x[n][0].w,
                                  b.x[n][1].x, b.x[n][1].y, b.x[n][1].z, b.x[n][1].w};
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                if (NORM) {
                    const float ge = e < 4 ? (&b.g[0].x)[e] : (&b.g[1].x)[e - 4];
                    ss[n] = fmaf(raw[e], raw[e], ss[n]);
                    xv[n][e] = raw[e] * ge;
                } else {
                    xv[n][e] = raw[e];
                }
            }
        }
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            // A: (row g, k t) = W[r0][f + 2s], (row g + 8, k t) = W[r1][f + 2s],
            //    (row g, k t + 4) = W[r0][f + 2s + 1], (row g + 8, k t + 4) = W[r1][f + 2s + 1].
            pa_u32 ab[4], as[4];
            mma_split(wr0[2 * s], &ab[0], &as[0]);
            mma_split(wr1[2 * s], &ab[1], &as[1]);
            mma_split(wr0[2 * s + 1], &ab[2], &as[2]);
            mma_split(wr1[2 * s + 1], &ab[3], &as[3]);
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                // B: (k t, token g) = x[g][f + 2s], (k t + 4, token g) = x[g][f + 2s + 1].
                pa_u32 b0, b0s, b1, b1s;
                mma_split(xv[n][2 * s], &b0, &b0s);
                mma_split(xv[n][2 * s + 1], &b1, &b1s);
                if (LIN_W == 0) mma_m16n8k8(acc_lo[n], as, b0, b1);
                mma_m16n8k8(acc_lo[n], ab, b0s, b1s);
                mma_m16n8k8(acc[n], ab, b0, b1);
            }
        }
    };
    // Software pipeline: the next block's loads are in flight while this one multiplies.
    const int blocks = p.k / 32;
    Block cur, next;
    if (warp < blocks) load(warp, cur);
    for (int kb = warp; kb < blocks; kb += MMA_WARPS) {
        if (kb + MMA_WARPS < blocks) load(kb + MMA_WARPS, next);
        multiply(cur);
        cur = next;
    }

    // The warps' accumulators and sums of squares, added in warp order.
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        *(float4*)acc_s[warp][n][lane] =
            make_float4(acc[n][0] + acc_lo[n][0], acc[n][1] + acc_lo[n][1],
                        acc[n][2] + acc_lo[n][2], acc[n][3] + acc_lo[n][3]);
    }
    if (NORM) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            // Token 8n + g's sum over this warp's features: the 4 lanes of row g.
            float v = ss[n];
            v += pa_shfl_xor(v, 1);
            v += pa_shfl_xor(v, 2);
            if (t == 0) ss_s[warp][8 * n + g] = v;
        }
    }
    __syncthreads();
    if (warp != 0) return;
    float tot[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float v = acc_s[0][n][lane][e];
#pragma unroll
            for (int w = 1; w < MMA_WARPS; ++w) v += acc_s[w][n][lane][e];
            tot[n][e] = v;
        }
    }
    const int u = u0 + g;
    if (u >= units) return;
    // C: (row g, token 2t), (row g, token 2t + 1), (row g + 8, token 2t), (row g + 8, token
    // 2t + 1) of n8 tile n: the pair's two rows for tokens 8n + 2t and 8n + 2t + 1.
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int tok = 8 * n + 2 * t + c;
            if (tok >= p.t) continue;
            float a0 = tot[n][c];
            float a1 = tot[n][2 + c];
            if (NORM) {
                float sq = ss_s[0][tok];
#pragma unroll
                for (int w = 1; w < MMA_WARPS; ++w) sq += ss_s[w][tok];
                const float inv = 1.0f / sqrtf(sq / (float)p.k + p.eps);
                a0 *= inv;
                a1 *= inv;
            }
            lin_put_pair(p, tok, u, a0, a1);
        }
    }
}

#define LIN_MMA_ENTRY(NAME, NT, NORM)                                                   \
    extern "C" __global__ void __launch_bounds__(MMA_WARPS * 32) NAME(const LinearParams p) { \
        PA_DEPENDENT_PROLOGUE();                                                          \
        linear_mma<NT, NORM>(p);                                                          \
    }

LIN_MMA_ENTRY(model_linear_mma8, 1, false)
LIN_MMA_ENTRY(model_linear_mma16, 2, false)
LIN_MMA_ENTRY(model_linear_mma8_norm, 1, true)
LIN_MMA_ENTRY(model_linear_mma16_norm, 2, true)
