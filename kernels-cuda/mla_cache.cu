// The MLA latent cache's data movement: the write of new tokens (vLLM's
// concat_and_cache_mla) and the gather of a prefill chunk's latents as f32 rows for the
// expanded prefill (mla_prefill.cu).
//
// concat_and_cache_mla: one thread per (token, latent element), grid-stride. Element e of
// token t is kv_c[t][e] for e < kv_lora_rank, else k_pe[t][e - kv_lora_rank]; it goes to
// element e of slot slot_mapping[t] (block slot / block_size, offset slot % block_size); a
// negative slot writes nothing; fp8 caches store saturate(x / scale) (common.cuh's encoder,
// bit-identical to src/fp8.rs).
//
// mla_gather_latents: CTA row blockIdx.y = prefill request i (batch request first_req + i);
// its positions [chunk_lo, min(chunk_lo + chunk, seq_len)) land at rows starts[i] .. of
// kvc [rows][kv_lora_rank] and pe [rows][rope] f32 (grid-stride over that request's rows x
// latent elements; two arrays, so that kvc is the dense input of the expansion GEMM). A position before the
// request's new tokens (pos < seq_len - q_len) is read from the cache through the block
// table (fp8 times k_scale); a new token's from its own kv_c / k_pe row (row
// query_start_loc[req] - q_base + pos - ctx of the prefill inputs).
//
// Layouts: kv_c [T][kv_lora_rank], k_pe [T][rope] (activation dtype), cache
// [num_blocks][block_size][kv_lora_rank + rope] (activation dtype or E4M3), slot_mapping [T]
// i64, block_table [num_reqs][bt_stride], starts [n + 1] i32.
//
// Bounds relied on (host side): slots < num_blocks * block_size (checked against the cache);
// metadata validated (block ids of every position < seq_len in range, q_len <= seq_len);
// starts[i + 1] - starts[i] = clamp(seq_len - chunk_lo, 0, chunk) for every prefill request
// and kvc / pe hold starts[n] rows; element counts fit in i64.

#include "common.cuh"

struct MlaCacheParams {
    const void* kv_c;
    const void* k_pe;
    void* cache;
    const pa_i64* slot_mapping;
    float scale;  // fp8: the layer's k_scale, else 1
    int num_tokens;
    int kv_lora_rank;
    int rope_dim;
    int act_dtype;
    int cache_dtype;
    int block_size;
    int pad;
};
static_assert(sizeof(MlaCacheParams) == 64, "MlaCacheParams must match src/kernels/cuda/mla.rs");

extern "C" __global__ void concat_and_cache_mla(const MlaCacheParams p) {
    const int dim = p.kv_lora_rank + p.rope_dim;
    const pa_i64 n = (pa_i64)p.num_tokens * dim;
    const bool fp8 = p.cache_dtype == PA_E4M3 || p.cache_dtype == PA_E5M2;
    for (pa_i64 i = (pa_i64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (pa_i64)gridDim.x * blockDim.x) {
        const pa_i64 t = i / dim;
        const int e = (int)(i - t * dim);
        const pa_i64 slot = p.slot_mapping[t];
        if (slot < 0) continue;
        float x = e < p.kv_lora_rank ? pa_load(p.kv_c, t * p.kv_lora_rank + e, p.act_dtype)
                                     : pa_load(p.k_pe, t * p.rope_dim + e - p.kv_lora_rank,
                                               p.act_dtype);
        if (fp8) x = x / p.scale;
        const pa_i64 block = slot / p.block_size;
        const pa_i64 off = slot - block * p.block_size;
        pa_store(p.cache, (block * p.block_size + off) * dim + e, p.cache_dtype, x);
    }
}

struct MlaGatherParams {
    const void* kv_c;
    const void* k_pe;
    const void* cache;
    float* kvc;
    float* pe;
    const int* query_start_loc;
    const int* seq_lens;
    const int* block_table;
    const int* starts;
    float k_scale;  // fp8 caches: the factor of every cached value, else 1
    int first_req;
    int q_base;  // query_start_loc[first_req]
    int chunk_lo;
    int chunk;
    int kv_lora_rank;
    int rope_dim;
    int act_dtype;
    int cache_dtype;
    int block_size;
    int bt_stride;
    int pad;
};
static_assert(sizeof(MlaGatherParams) == 120, "MlaGatherParams must match src/kernels/cuda/mla.rs");

extern "C" __global__ void mla_gather_latents(const MlaGatherParams p) {
    const int i = blockIdx.y;
    const int req = p.first_req + i;
    const int dim = p.kv_lora_rank + p.rope_dim;
    const int seq = p.seq_lens[req];
    const int q0 = p.query_start_loc[req];
    const int ctx = seq - (p.query_start_loc[req + 1] - q0);
    const int row0 = p.starts[i];
    const pa_i64 n = (pa_i64)(p.starts[i + 1] - row0) * dim;
    const bool fp8 = p.cache_dtype == PA_E4M3 || p.cache_dtype == PA_E5M2;
    const int* bt = p.block_table + (pa_i64)req * p.bt_stride;
    for (pa_i64 k = (pa_i64)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (pa_i64)gridDim.x * blockDim.x) {
        const int r = (int)(k / dim);
        const int e = (int)(k - (pa_i64)r * dim);
        const int pos = p.chunk_lo + r;
        float x;
        if (pos < ctx) {
            const pa_i64 block = bt[pos / p.block_size];
            const pa_i64 o = (block * p.block_size + pos % p.block_size) * dim + e;
            x = pa_load(p.cache, o, p.cache_dtype);
            if (fp8) x *= p.k_scale;
        } else {
            const pa_i64 t = (pa_i64)(q0 - p.q_base) + (pos - ctx);
            x = e < p.kv_lora_rank ? pa_load(p.kv_c, t * p.kv_lora_rank + e, p.act_dtype)
                                   : pa_load(p.k_pe, t * p.rope_dim + e - p.kv_lora_rank,
                                             p.act_dtype);
        }
        const pa_i64 row = row0 + r;
        if (e < p.kv_lora_rank) {
            p.kvc[row * p.kv_lora_rank + e] = x;
        } else {
            p.pe[row * p.rope_dim + e - p.kv_lora_rank] = x;
        }
    }
}
