//! Decode context parallelism with one rank per CUDA device of one process: each rank attends
//! on its device, the partial results are all-gathered through NCCL, every device combines.

use super::forward::to_natural_log;
use super::{check_impl, combine, DcpDecodeBatch, Partial};
use crate::attention::{AttentionImpl, AttentionLayer};
use crate::device::cuda::NcclComms;
use crate::device::{Device, Tensor};
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

/// [`forward_decode`](super::forward_decode) with one rank per CUDA device: every rank attends
/// over its shard on its own device, the partial results (output and natural-log LSE) are
/// all-gathered through NCCL, and each device combines them, so every rank ends with the whole
/// result (what a tensor-parallel layer above needs). It allocates its buffers for the call;
/// a decode loop keeps them in a [`DcpWorkspace`] with [`forward_decode_across_in`].
pub fn forward_decode_across(
    comms: &mut NcclComms,
    layer: &AttentionLayer,
    batch: &DcpDecodeBatch,
    ranks: &mut [DcpRank<'_>],
) -> Result<()> {
    forward_decode_across_in(comms, layer, batch, ranks, &mut DcpWorkspace::default())
}

/// The buffers [`forward_decode_across_in`] keeps from call to call, so that a steady decode
/// allocates nothing: each active rank's partial output and LSE on its device, and on every
/// device a receive buffer for each active rank's output and LSE. Made on the first call and
/// again whenever the batch's shape, dtype, devices or active ranks change.
#[derive(Debug, Default)]
pub struct DcpWorkspace {
    shape: Option<WorkspaceShape>,
    /// Active rank `r`'s (output, LSE) on its device.
    partials: Vec<(Tensor, Tensor)>,
    /// Per device: the active ranks' outputs, then their LSEs.
    received: Vec<Vec<Tensor>>,
}

/// What a [`DcpWorkspace`] was made for.
#[derive(Clone, Debug, PartialEq)]
struct WorkspaceShape {
    query: Vec<usize>,
    dtype: DType,
    heads: usize,
    active: usize,
    devices: Vec<Device>,
}

/// [`forward_decode_across`] with its buffers kept in `workspace`.
pub fn forward_decode_across_in(
    comms: &mut NcclComms,
    layer: &AttentionLayer,
    batch: &DcpDecodeBatch,
    ranks: &mut [DcpRank<'_>],
    workspace: &mut DcpWorkspace,
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
    let query_shape = ranks[0].query.shape().to_vec();
    for (r, rank) in ranks.iter().enumerate() {
        check_impl(rank.imp)?;
        let p = rank.imp.params();
        if rank.query.shape().first() != Some(&t) || rank.query.shape() != query_shape {
            return Err(Error::shape(
                "query",
                rank.query.shape(),
                format!(
                    "[{t} requests, {}, {}] on every rank",
                    p.num_heads, p.head_size
                ),
            ));
        }
        // A rank past the active ones holds no key: it writes nothing and receives the
        // others' parts.
        if r < active && rank.metadata.is_none() {
            return Err(Error::config(format!(
                "DCP rank {r} holds keys of {} requests but was given no metadata",
                batch.holding(r)
            )));
        }
    }
    if active == 0 {
        return Ok(());
    }
    let want = WorkspaceShape {
        query: query_shape,
        dtype: ranks[0].query.dtype(),
        heads: ranks[0].imp.params().num_heads,
        active,
        devices: ranks.iter().map(|r| r.query.device().clone()).collect(),
    };
    if workspace.shape.as_ref() != Some(&want)
        || workspace.received.iter().any(|row| row.len() != 2 * active)
    {
        *workspace = DcpWorkspace::for_shape(want)?;
    }
    for (rank, (out, lse)) in ranks.iter_mut().zip(&mut workspace.partials) {
        let md = rank
            .metadata
            .ok_or_else(|| Error::config("DCP rank without metadata"))?;
        rank.imp.forward_with_lse(
            layer,
            rank.query,
            rank.key,
            rank.value,
            rank.cache,
            md,
            out,
            Some(lse),
        )?;
        to_natural_log(rank.imp, lse)?;
    }
    // One group: every active rank's output and LSE to every device.
    let roots: Vec<(usize, &Tensor)> = (0..active)
        .map(|r| (r, &workspace.partials[r].0))
        .chain((0..active).map(|r| (r, &workspace.partials[r].1)))
        .collect();
    comms.broadcast_parts(&roots, &mut workspace.received)?;
    for (rank, row) in ranks.iter_mut().zip(&mut workspace.received) {
        // The parts move into the combine's list and back, whatever it returns.
        let lses = row.split_off(active);
        let parts: Vec<Partial> = std::mem::take(row)
            .into_iter()
            .zip(lses)
            .enumerate()
            .map(|(r, (output, lse))| Partial {
                output,
                lse,
                holding: batch.holding(r),
            })
            .collect();
        let combined = combine(&parts, rank.output, None);
        let (outs, lses): (Vec<Tensor>, Vec<Tensor>) =
            parts.into_iter().map(|p| (p.output, p.lse)).unzip();
        row.extend(outs);
        row.extend(lses);
        combined?;
    }
    Ok(())
}

impl DcpWorkspace {
    /// Fresh buffers for `shape`.
    fn for_shape(shape: WorkspaceShape) -> Result<Self> {
        let t = shape.query[0];
        let lse_shape = [shape.heads, t];
        let partials = shape.devices[..shape.active]
            .iter()
            .map(|d| {
                Ok((
                    Tensor::zeros(d, &shape.query, shape.dtype)?,
                    Tensor::zeros(d, &lse_shape, DType::F32)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let received = shape
            .devices
            .iter()
            .map(|d| {
                (0..2 * shape.active)
                    .map(|i| match i < shape.active {
                        true => Tensor::zeros(d, &shape.query, shape.dtype),
                        false => Tensor::zeros(d, &lse_shape, DType::F32),
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DcpWorkspace {
            shape: Some(shape),
            partials,
            received,
        })
    }
}
