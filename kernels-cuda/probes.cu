// Roofline probe for `polyattn bench`: the f32 FMA peak of the CUDA cores.
//
// Algorithm: every thread runs PROBE_CHAINS independent FMA chains (x = x * m + c) for
// `iters` iterations, so each SM has far more independent FMAs in flight than its pipeline
// depth; FLOPs = 2 * PROBE_CHAINS * iters * threads. The chains start from the thread index
// (never zeros) and are summed into `out`, so the compiler cannot drop them.
//
// Layout: out [gridDim.x * blockDim.x] f32.
// Bounds relied on: the host sizes `out` to gridDim.x * blockDim.x floats.

#include "common.cuh"

#define PROBE_CHAINS 8

struct FmaProbeParams {
    float* out;
    int iters;
    float m;
    float c;
    int pad;
};

extern "C" __global__ void fma_probe(FmaProbeParams p) {
    const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
    float x[PROBE_CHAINS];
#pragma unroll
    for (int k = 0; k < PROBE_CHAINS; ++k) x[k] = 1.0f + 1e-3f * (float)(t % 97 + k);
    for (int i = 0; i < p.iters; ++i) {
#pragma unroll
        for (int k = 0; k < PROBE_CHAINS; ++k) x[k] = fmaf(x[k], p.m, p.c);
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < PROBE_CHAINS; ++k) s += x[k];
    p.out[t] = s;
}
