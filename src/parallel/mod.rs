//! Attention across ranks: decode context parallelism ([`dcp`]: one request's KV cache
//! spread over `N` ranks, partial results combined by their LSEs), head-sharded tensor
//! parallelism ([`heads`]: query and KV heads split over ranks, GQA groups kept whole), and
//! the group that sums the ranks' partial results ([`group`]: NCCL between CUDA GPUs).
//!
//! Every rule here is written for ranks that are separate caches and separate layers. The
//! one-device form runs all ranks on one device and combines locally (what the tests check on
//! every backend); a multi-GPU engine runs one rank per device and moves the partial results
//! with a collective library (NCCL on CUDA), then combines with the same functions.

pub mod dcp;
pub mod group;
pub mod heads;

pub use dcp::{DcpDecodeBatch, DcpLayout, DcpMetadata, RankBlockTable};
pub use group::{RankGroup, Transport};
pub use heads::{HeadShard, HeadSharding};
