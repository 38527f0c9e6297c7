// The MLA decode's parameter blocks and sizes, shared by its two forms (mla_decode.cu, every
// compiler of the family; mla_decode_mma.cu, NVIDIA's tensor cores) and mla_combine.
// src/kernels/cuda/sources.rs pastes this file in place of its include line; the struct
// layouts are asserted against src/kernels/cuda/mla.rs.

#ifndef POLYATTN_MLA_PARAMS_CUH
#define POLYATTN_MLA_PARAMS_CUH

#define MLA_LAT 576   // latent width: kv_lora_rank 512 + rope 64
#define MLA_DV 512    // value width: kv_lora_rank
#define MLA_KEYS 32   // keys per chunk; block sizes are multiples of it
#define MLA_MAX_SPLITS 64
#define MLA_LOG2E 1.4426950408889634f
#define MLA_LN2 0.6931471805599453f

struct MlaDecodeParams {
    const void* q;
    const void* cache;
    void* out;
    float* lse;  // null: not written
    float* part_out;
    float* part_lse;
    const int* query_start_loc;
    const int* seq_lens;
    const int* block_table;
    float scale;    // softmax scale (fp8: times k_scale)
    float v_scale;  // output factor: k_scale for fp8, else 1
    int num_heads;
    int num_tokens;  // T: tokens of the launch's requests (rows of q)
    int block_size;
    int bt_stride;
    int num_splits;
    int pad;
};
static_assert(sizeof(MlaDecodeParams) == 104, "MlaDecodeParams must match src/kernels/cuda/mla.rs");

struct MlaCombineParams {
    const float* part_out;
    const float* part_lse;
    void* out;
    float* lse;  // null: not written
    int num_heads;
    int num_tokens;
    int num_splits;
    int out_dtype;
};
static_assert(sizeof(MlaCombineParams) == 48, "MlaCombineParams must match src/kernels/cuda/mla.rs");

#endif  // POLYATTN_MLA_PARAMS_CUH
