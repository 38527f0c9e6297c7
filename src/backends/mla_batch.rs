//! The metadata of every MLA backend (`CPU_MLA`, `CUDA_MLA`, `HIP_MLA`, `WGPU_MLA`): the checks and
//! decode / prefill split of a batch ([`mla_batch_split`]: decodes first, one query length up
//! to [`MLA_DECODE_MAX_QUERY_LEN`], as vLLM's FlashMLA builder with `UNIFORM` query lengths;
//! the latent-space decode is exact for any query length) plus copies of the batch arrays on
//! the backend's device when the batch was described elsewhere. The kernels differ per
//! backend; what a batch must satisfy and how it splits does not.

use crate::backend::GraphCaptureSupport;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::metadata::{
    AttentionMetadata, AttentionMetadataBuilder, CommonAttentionMetadata, DecodePrefillSplit,
    DeviceMetadata,
};

/// The longest query a decode request may have (FlashMLA's reorder threshold).
pub const MLA_DECODE_MAX_QUERY_LEN: usize = 128;

/// The checks every MLA builder makes of a batch (block size, no cascade, causal) and its
/// decode / prefill split: the leading requests of one query length up to
/// [`MLA_DECODE_MAX_QUERY_LEN`] are decodes.
pub fn mla_batch_split(
    backend: &str,
    block_size: usize,
    common_prefix_len: usize,
    common: &CommonAttentionMetadata,
) -> Result<DecodePrefillSplit> {
    common.expect_block_size(block_size)?;
    if common_prefix_len > 0 {
        return Err(Error::config(format!(
            "{backend} runs no cascade attention (common_prefix_len must be 0)"
        )));
    }
    if !common.causal() {
        return Err(Error::config(format!(
            "{backend} runs causal (decoder) batches only"
        )));
    }
    Ok(common.split_decodes_and_prefills(MLA_DECODE_MAX_QUERY_LEN, true, false))
}

/// What an MLA backend's kernels consume for one batch.
#[derive(Clone, Debug)]
pub struct MlaBatchMetadata {
    /// The validated common metadata.
    pub common: CommonAttentionMetadata,
    /// Requests `0..num_decodes` run `forward_mqa`, the rest `forward_mha`.
    pub split: DecodePrefillSplit,
    /// Copies of the batch arrays on the backend's device, when the batch was described
    /// elsewhere.
    uploaded: Option<DeviceMetadata>,
}

impl MlaBatchMetadata {
    /// The batch arrays on the backend's device.
    pub fn arrays(&self) -> &DeviceMetadata {
        self.uploaded.as_ref().unwrap_or(self.common.device())
    }
}

crate::metadata::batch_metadata!(MlaBatchMetadata, no_cascade);

/// Builds [`MlaBatchMetadata`] for one MLA backend.
#[derive(Clone, Debug)]
pub struct MlaBatchBuilder {
    backend: &'static str,
    block_size: usize,
    device: Device,
}

impl MlaBatchBuilder {
    /// A builder of backend `backend` for latent caches of `block_size` tokens per block on
    /// `device`.
    pub fn new(backend: &'static str, block_size: usize, device: Device) -> Self {
        MlaBatchBuilder {
            backend,
            block_size,
            device,
        }
    }

    /// The query lengths the decode kernels take (vLLM's `query_len_support`): one length
    /// for every decode request of a batch.
    pub fn query_len_support(&self) -> &'static str {
        "UNIFORM"
    }
}

impl AttentionMetadataBuilder for MlaBatchBuilder {
    fn graph_capture_support(&self) -> GraphCaptureSupport {
        GraphCaptureSupport::Never
    }

    /// [`MLA_DECODE_MAX_QUERY_LEN`]: shorter requests go to the front of the batch.
    fn reorder_batch_threshold(&self) -> Option<usize> {
        Some(MLA_DECODE_MAX_QUERY_LEN)
    }

    fn build(
        &self,
        common_prefix_len: usize,
        common: &CommonAttentionMetadata,
        _fast_build: bool,
    ) -> Result<Box<dyn AttentionMetadata>> {
        let split = mla_batch_split(self.backend, self.block_size, common_prefix_len, common)?;
        let uploaded = common.device().copies_on(&self.device)?;
        Ok(Box::new(MlaBatchMetadata {
            common: common.clone(),
            split,
            uploaded,
        }))
    }
}

/// How a batch's prefills run in chunks of key positions (the GPU MLA backends' expanded
/// prefill): chunk `c` holds positions `[c·chunk, (c + 1)·chunk)` of every prefill request,
/// request `i`'s at rows `starts(c)[i] ..` of the chunk's workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlaPrefillChunks {
    /// Sequence lengths of the prefill requests (batch requests `num_decodes..`).
    pub seq_lens: Vec<usize>,
    /// Positions per chunk (positive).
    pub chunk: usize,
    /// Chunks: enough for the longest sequence.
    pub chunks: usize,
}

impl MlaPrefillChunks {
    /// The chunks of `md`'s prefills: `chunk` positions each (`None`: `fit` of the longest
    /// prefill sequence), rounded to at most the longest sequence up to a multiple of
    /// `align` and at least `align`.
    pub fn new(
        md: &MlaBatchMetadata,
        chunk: Option<usize>,
        align: usize,
        fit: impl FnOnce(usize) -> Result<usize>,
    ) -> Result<Self> {
        let seq_lens: Vec<usize> = md.common.seq_lens_cpu()[md.split.num_decodes..]
            .iter()
            .map(|&s| s as usize)
            .collect();
        let max_seq = seq_lens.iter().copied().max().unwrap_or(0);
        let align = align.max(1);
        let chunk = match chunk {
            Some(c) => c,
            None => fit(max_seq)?,
        };
        let chunk = chunk.min(max_seq.div_ceil(align) * align).max(align);
        Ok(MlaPrefillChunks {
            chunks: max_seq.div_ceil(chunk),
            seq_lens,
            chunk,
        })
    }

    /// First position of chunk `c`.
    pub fn lo(&self, c: usize) -> usize {
        c * self.chunk
    }

    /// The `n + 1` row starts of chunk `c` (request `i` holds
    /// `clamp(seq_len − lo, 0, chunk)` rows), or an overflow error past i32.
    pub fn starts(&self, c: usize) -> Result<Vec<i32>> {
        let lo = self.lo(c);
        let mut acc = 0usize;
        let mut starts = Vec::with_capacity(self.seq_lens.len() + 1);
        starts.push(0);
        for &s in &self.seq_lens {
            acc += s.saturating_sub(lo).min(self.chunk);
            starts.push(
                i32::try_from(acc).map_err(|_| {
                    Error::overflow("MLA prefill chunk rows", format!("{acc} rows"))
                })?,
            );
        }
        Ok(starts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::BatchDescription;

    #[test]
    fn prefill_chunks_cover_every_position_once() {
        // A decode (q 1), then prefills of 45 and 100 positions; block size 16.
        let desc = BatchDescription {
            query_start_loc: vec![0, 1, 21, 61],
            seq_lens: vec![30, 45, 100],
            block_table: (0..21).collect(),
            max_blocks_per_req: 7,
            slot_mapping: vec![-1; 61],
            causal: true,
            block_size: 16,
            is_prefilling: None,
        };
        let common = CommonAttentionMetadata::new(&Device::cpu(), desc).unwrap();
        let md = MlaBatchBuilder::new("TEST", 16, Device::cpu())
            .build(0, &common, false)
            .unwrap();
        let md = md.downcast::<MlaBatchMetadata>("test").unwrap();
        let c = MlaPrefillChunks::new(md, Some(32), 16, |_| unreachable!()).unwrap();
        assert_eq!(
            (c.seq_lens.clone(), c.chunk, c.chunks),
            (vec![45, 100], 32, 4)
        );
        assert_eq!(c.starts(0).unwrap(), vec![0, 32, 64]);
        assert_eq!(c.starts(1).unwrap(), vec![0, 13, 45]);
        assert_eq!(c.starts(3).unwrap(), vec![0, 0, 4]);
        let total: i32 = (0..c.chunks).map(|k| c.starts(k).unwrap()[2]).sum();
        assert_eq!(total, 145);
        // The fit rule, capped by the longest sequence rounded up to the alignment.
        let f = MlaPrefillChunks::new(md, None, 32, |max| Ok(max * 10)).unwrap();
        assert_eq!((f.chunk, f.chunks), (128, 1));
    }
}
