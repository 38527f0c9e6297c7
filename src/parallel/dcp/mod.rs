//! Decode context parallelism (DCP): a request's KV cache spread over `N` ranks, each rank
//! attending over its shard and returning output and LSE, the partial results combined with
//! `merge_attn_states`' LSE weighting (vLLM's decode context parallelism: impls that `can_return_lse_for_decode`, combined by
//! the base their `lse_base_on_e` declares).
//!
//! **Layout.** Whole blocks, round-robin: block `j` of a request lives on rank `j mod N` as
//! that rank's local block `j div N` (vLLM's interleaved layout with the interleave size equal
//! to the block size; [`DcpLayout::local_len`] is vLLM's `get_dcp_local_seq_lens`). Why
//! interleaved: as a request decodes, its new blocks go to each rank in turn, so every rank's
//! share and cache grow evenly (a contiguous split would put every new token on the last rank);
//! and why whole blocks: a rank's shard is then an ordinary paged cache with an ordinary block
//! table, so every backend's decode kernel runs on it unchanged.
//!
//! **A rank's batch.** Decode only (query length 1: a rank's keys are not a contiguous range
//! of positions, so the causal rule of a longer query cannot be applied locally). Every rank
//! gets every request's query; request `i`'s new token is written by the rank that owns its
//! position. Rank 0 holds every non-empty request (it owns each request's first block); a
//! request shorter than `r · block_size + 1` tokens has no key on rank `r`. Such a request
//! runs on rank `r` as a one-key placeholder whose result the combine never reads, which is
//! why the batch must list **requests that leave a rank empty last** (in order of decreasing
//! length): then the requests rank `r` holds are its first `holding` rows, and the combine's
//! merge copies the other rows from the ranks before it (`prefill_tokens_with_context` of
//! [`merge_attn_states`](crate::ops::merge_attn_states)) without reading rank `r`'s. A batch
//! in another order is a typed error naming the request.
//!
//! **Combine.** Rank 0's partial result merged with rank 1's, the result with rank 2's, … in
//! f32 per merge, the output stored in the activation dtype after each. The LSE base is read
//! from the impl ([`AttentionImpl::lse_base_on_e`](crate::AttentionImpl::lse_base_on_e)) and a base-2 LSE is rescaled to natural
//! log before any merge, so a wrong base cannot silently skew the denominators.
//!
//! **Not sharded.** Sliding windows and ALiBi need a key's absolute position, which a rank's
//! local index does not give; attention sinks would be counted once per rank. Such layers
//! are refused.
//!
//! Files: [`layout`] (which rank holds which tokens), [`batch`] (each rank's batch and
//! metadata), [`forward`] (the one-device forward and the combine), [`across`] (one rank per
//! CUDA device, over NCCL), [`mla`] (an MLA layer's latent-space decode).

pub mod across;
pub mod batch;
pub mod forward;
pub mod layout;
pub mod mla;

pub use across::{forward_decode_across, forward_decode_across_in, DcpRank, DcpWorkspace};
pub use batch::{DcpDecodeBatch, DcpMetadata, RankBlockTable};
pub use forward::{check_impl, combine, forward_decode, Partial};
pub use layout::DcpLayout;
pub use mla::forward_mqa_decode;
