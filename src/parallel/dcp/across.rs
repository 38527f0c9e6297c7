//! Decode context parallelism with one rank per CUDA device of one process: each rank attends
//! on its device, the partial results are all-gathered through NCCL, every device combines.

use super::forward::to_natural_log;
use super::{check_impl, combine, DcpDecodeBatch, Partial};
use crate::attention::{AttentionImpl, AttentionLayer};
use crate::device::cuda::NcclComms;
use crate::device::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::metadata::AttentionMetadata;

/// One rank of a decode batch whose ranks run on separate CUDA devices of one process:
/// its impl, inputs and cache on its device, and its metadata from
/// [`DcpDecodeBatch::build_rank`] (`None` for a rank that holds no key).
pub struct DcpRank<'a> {
    /// The rank's impl (a layer built on the rank's backend).
    pub imp: &'a dyn AttentionImpl,
    /// `[num_reqs, num_heads, head_size]`, every request's query.
    pub query: &'a Tensor,
    /// `[num_reqs, num_kv_heads, head_size]` new keys (absent for a layer reading another's
    /// cache).
    pub key: Option<&'a Tensor>,
    /// New values, as `key`.
    pub value: Option<&'a Tensor>,
    /// The rank's shard of the cache.
    pub cache: &'a mut KvCache,
    /// The rank's metadata.
    pub metadata: Option<&'a dyn AttentionMetadata>,
    /// `[num_reqs, num_heads, head_size]`: the combined result, written on every rank.
    pub output: &'a mut Tensor,
}

/// [`forward_decode`](super::forward_decode) with one rank per CUDA device: every rank attends over its shard on its
/// own device, the partial results (output and natural-log LSE) are all-gathered through
/// NCCL, and each device combines them, so every rank ends with the whole result (what a
/// tensor-parallel layer above needs).
pub fn forward_decode_across(
    comms: &mut NcclComms,
    layer: &AttentionLayer,
    batch: &DcpDecodeBatch,
    ranks: &mut [DcpRank<'_>],
) -> Result<()> {
    let n = batch.layout().world_size();
    if ranks.len() != n || comms.world_size() != n {
        return Err(Error::config(format!(
            "DCP across devices: {} ranks and {} NCCL ranks for a layout of {n}",
            ranks.len(),
            comms.world_size()
        )));
    }
    let t = batch.num_reqs();
    let active = (0..n).take_while(|&r| batch.holding(r) > 0).count();
    let mut partials: Vec<(Tensor, Tensor)> = Vec::with_capacity(active);
    for (r, rank) in ranks.iter_mut().enumerate() {
        check_impl(rank.imp)?;
        let p = rank.imp.params();
        if rank.query.shape().first() != Some(&t) {
            return Err(Error::shape(
                "query",
                rank.query.shape(),
                format!("[{t} requests, {}, {}]", p.num_heads, p.head_size),
            ));
        }
        if r >= active {
            // Holds no key: it still writes nothing and receives the others' parts.
            continue;
        }
        let md = rank.metadata.ok_or_else(|| {
            Error::config(format!(
                "DCP rank {r} holds keys of {} requests but was given no metadata",
                batch.holding(r)
            ))
        })?;
        let device = rank.query.device().clone();
        let mut out = Tensor::zeros(&device, rank.query.shape(), rank.query.dtype())?;
        let mut lse = Tensor::zeros(&device, &[p.num_heads, t], DType::F32)?;
        rank.imp.forward_with_lse(
            layer,
            rank.query,
            rank.key,
            rank.value,
            rank.cache,
            md,
            &mut out,
            Some(&mut lse),
        )?;
        to_natural_log(rank.imp, &mut lse)?;
        partials.push((out, lse));
    }
    if partials.is_empty() {
        return Ok(());
    }
    // Receive buffers: on each device, one output and one LSE per active rank.
    let mut outs: Vec<Vec<Tensor>> = Vec::with_capacity(n);
    let mut lses: Vec<Vec<Tensor>> = Vec::with_capacity(n);
    for rank in ranks.iter() {
        let device = rank.query.device().clone();
        let mut o = Vec::with_capacity(n);
        let mut l = Vec::with_capacity(n);
        for (po, pl) in &partials {
            o.push(Tensor::zeros(&device, po.shape(), po.dtype())?);
            l.push(Tensor::zeros(&device, pl.shape(), DType::F32)?);
        }
        outs.push(o);
        lses.push(l);
    }
    // Ranks past the active ones send nothing; every device receives.
    gather_active(comms, &partials, &mut outs, &mut lses)?;
    for (d, rank) in ranks.iter_mut().enumerate() {
        let parts: Vec<Partial> = outs[d]
            .drain(..)
            .zip(lses[d].drain(..))
            .enumerate()
            .map(|(r, (output, lse))| Partial {
                output,
                lse,
                holding: batch.holding(r),
            })
            .collect();
        combine(&parts, rank.output, None)?;
    }
    Ok(())
}

/// Broadcasts each active rank's partial (output, LSE) to every device.
fn gather_active(
    comms: &mut NcclComms,
    partials: &[(Tensor, Tensor)],
    outs: &mut [Vec<Tensor>],
    lses: &mut [Vec<Tensor>],
) -> Result<()> {
    let roots: Vec<(usize, &Tensor)> = partials.iter().map(|p| &p.0).enumerate().collect();
    comms.broadcast_parts(&roots, outs)?;
    let roots: Vec<(usize, &Tensor)> = partials.iter().map(|p| &p.1).enumerate().collect();
    comms.broadcast_parts(&roots, lses)
}
