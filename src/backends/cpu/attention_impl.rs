//! The CPU impl: the forward driver's kernels (`crate::forward`) on host memory. A pass runs
//! the tiles of the batch in parallel (one task per tile and KV head) and scatters their rows
//! into f32 buffers, which `finish` stores in the output's dtype.

use rayon::prelude::*;

use crate::attention::{AttentionLayer, AttentionParams};
use crate::device::{CpuStorage, Tensor};
use crate::error::{Error, Result};
use crate::forward::{AttendJob, Band, ForwardIo, ForwardKernels, Keys, PassSpec, Target};
use crate::kv_cache::KvCache;
use crate::metadata::AttentionMetadata;
use crate::plan::Pass;

use super::kernels::convert::{store, RowsView};
use super::kernels::merge_states::merge_states;
use super::kernels::paged_attention::{
    attend_tile, DenseSource, KeySource, Mask, PagedSource, TileJob,
};
use super::kernels::reshape_and_cache::reshape_and_cache;
use super::metadata_builder::{CpuAttentionMetadata, Tile};

/// The CPU attention impl of one layer.
#[derive(Clone, Debug)]
pub struct CpuAttentionImpl {
    params: AttentionParams,
}

/// Rows of one task: `[tokens·group][head_size]` outputs and `[tokens·group]` LSEs.
struct TaskResult {
    tile: Tile,
    kv_head: usize,
    out: Vec<f32>,
    lse: Vec<f32>,
}

impl CpuAttentionImpl {
    /// Builds the impl (parameters already validated by the descriptor).
    pub fn new(params: AttentionParams) -> Self {
        CpuAttentionImpl { params }
    }

    /// Scaled query rows of one tile for one KV head: `[tokens·g][D]`.
    fn gather_queries(&self, q: &RowsView<'_>, tile: &Tile, kv_head: usize) -> Vec<f32> {
        let p = &self.params;
        let (d, g) = (p.head_size, p.num_queries_per_kv());
        let n = tile.q_end - tile.q_start;
        let mut rows = vec![0.0f32; n * g * d];
        for i in 0..n {
            let t = tile.q_start + i;
            let off = (t * p.num_heads + kv_head * g) * d;
            q.load(off, &mut rows[i * g * d..(i + 1) * g * d], 1.0);
        }
        rows.iter_mut().for_each(|x| *x *= p.scale);
        rows
    }

    /// Runs every tile against `source_for(tile)` keys `range(tile)`.
    fn run_tiles<'a, S, FS, FR>(
        &self,
        q: &RowsView<'_>,
        tiles: &[Tile],
        positions_of: &(dyn Fn(&Tile) -> Vec<usize> + Sync),
        source_for: FS,
        range: FR,
        mask: &Mask<'_>,
    ) -> Vec<TaskResult>
    where
        S: KeySource + 'a,
        FS: Fn(&Tile) -> S + Sync,
        FR: Fn(&Tile) -> (usize, usize) + Sync,
    {
        let p = &self.params;
        let (d, g) = (p.head_size, p.num_queries_per_kv());
        let jobs: Vec<(Tile, usize)> = tiles
            .iter()
            .flat_map(|t| (0..p.num_kv_heads).map(move |h| (*t, h)))
            .collect();
        jobs.par_iter()
            .map(|&(tile, kv_head)| {
                let qrows = self.gather_queries(q, &tile, kv_head);
                let positions = positions_of(&tile);
                let (kv_lo, kv_hi) = range(&tile);
                let rows = positions.len() * g;
                let mut out = vec![0.0f32; rows * d];
                let mut lse = vec![0.0f32; rows];
                let job = TileJob {
                    kv_head,
                    group: g,
                    head_size: d,
                    q: &qrows,
                    positions: &positions,
                    kv_lo,
                    kv_hi,
                };
                attend_tile(&source_for(&tile), &job, mask, &mut out, &mut lse);
                TaskResult {
                    tile,
                    kv_head,
                    out,
                    lse,
                }
            })
            .collect()
    }

    /// Scatters task rows into dense `[T][H][D]` f32 outputs and `[H][T]` LSEs.
    fn scatter(&self, results: &[TaskResult], num_tokens: usize, out: &mut [f32], lse: &mut [f32]) {
        let p = &self.params;
        let (d, g) = (p.head_size, p.num_queries_per_kv());
        for r in results {
            for i in 0..(r.tile.q_end - r.tile.q_start) {
                let t = r.tile.q_start + i;
                for h in 0..g {
                    let head = r.kv_head * g + h;
                    let row = i * g + h;
                    out[(t * p.num_heads + head) * d..][..d]
                        .copy_from_slice(&r.out[row * d..(row + 1) * d]);
                    lse[head * num_tokens + t] = r.lse[row];
                }
            }
        }
    }
}

/// The f32 rows a CPU forward writes before it stores them in the output's dtype.
#[derive(Debug, Default)]
pub struct CpuRecording {
    /// Output rows `[T][H][D]` and LSEs `[H][T]`.
    out: (Vec<f32>, Vec<f32>),
    /// The cascade partials, when the passes ran.
    prefix: (Vec<f32>, Vec<f32>),
    suffix: (Vec<f32>, Vec<f32>),
}

impl CpuRecording {
    fn rows(&mut self, target: Target, t: usize, h: usize, d: usize) -> &mut (Vec<f32>, Vec<f32>) {
        let rows = match target {
            Target::Output => &mut self.out,
            Target::Prefix => &mut self.prefix,
            Target::Suffix => &mut self.suffix,
        };
        if rows.0.len() != t * h * d {
            *rows = (vec![0.0; t * h * d], vec![0.0; h * t]);
        }
        rows
    }
}

/// The CPU kernels have one form for every query length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTiles;

impl ForwardKernels for CpuAttentionImpl {
    type Metadata = CpuAttentionMetadata;
    type Kernel = CpuTiles;
    type Recording = CpuRecording;
    const BACKEND: &'static str = "CPU";

    fn params(&self) -> &AttentionParams {
        &self.params
    }

    fn metadata<'m>(
        &self,
        metadata: &'m dyn AttentionMetadata,
    ) -> Result<&'m CpuAttentionMetadata> {
        metadata.downcast::<CpuAttentionMetadata>("CpuAttentionImpl")
    }

    fn check_cache(&self, cache: &KvCache, _: &CpuAttentionMetadata) -> Result<()> {
        if cache.data().as_cpu().is_none() {
            return Err(Error::Device {
                backend: "CPU".into(),
                message: "KV cache is not in host memory".into(),
            });
        }
        Ok(())
    }

    fn runs_cascade(&self) -> bool {
        true
    }

    fn bands(
        &self,
        _: &CpuAttentionMetadata,
        _: &ForwardIo<'_>,
        _: &PassSpec,
    ) -> Result<Vec<Band<CpuTiles>>> {
        Ok(vec![Band {
            min_q: 0,
            kernel: CpuTiles,
        }])
    }

    fn begin(&self, _: &CpuAttentionMetadata) -> Result<CpuRecording> {
        Ok(CpuRecording::default())
    }

    fn write_cache(
        &self,
        _: &mut CpuRecording,
        md: &CpuAttentionMetadata,
        layer: &AttentionLayer,
        key: &Tensor,
        value: &Tensor,
        cache: &mut KvCache,
    ) -> Result<()> {
        let dtype = cache.spec().dtype;
        let kv = RowsView::new(key.as_cpu().ok_or_else(not_cpu)?, dtype)?;
        let vv = RowsView::new(value.as_cpu().ok_or_else(not_cpu)?, dtype)?;
        let slots = md.common.slot_mapping_cpu();
        reshape_and_cache(kv, vv, cache, slots, layer.k_scale, layer.v_scale)?;
        Ok(())
    }

    fn attend(
        &self,
        rec: &mut CpuRecording,
        md: &CpuAttentionMetadata,
        io: &mut ForwardIo<'_>,
        job: &AttendJob<CpuTiles>,
    ) -> Result<()> {
        let p = &self.params;
        let common = &md.common;
        let n = io.num_tokens;
        let qv = RowsView::new(io.query.as_cpu().ok_or_else(not_cpu)?, io.dtype)?;
        let qsl = common.query_start_loc_cpu();
        let seq_lens = common.seq_lens_cpu();
        let spec = job.spec;
        let mask = Mask {
            causal: spec.causal,
            window: p.sliding_window,
            soft_cap: p.soft_cap(),
            alibi: p.alibi_slopes.as_deref(),
            sinks: p.sinks.as_deref().filter(|_| spec.sinks),
        };
        let dense = io.keys.is_dense();
        // Absolute position of each query token: its context length plus its index. Encoder
        // self-attention has no context: its keys are the request's own query rows, so its
        // positions start at 0 whatever seq_lens says (vLLM's FA encoder path likewise uses
        // cu_seqlens_q for queries and keys and ignores seq_lens).
        let positions_of = |t: &Tile| -> Vec<usize> {
            let ctx = if dense {
                0
            } else {
                seq_lens[t.req] as usize - (qsl[t.req + 1] - qsl[t.req]) as usize
            };
            (t.q_start..t.q_end)
                .map(|i| ctx + (i - qsl[t.req] as usize))
                .collect()
        };
        let results = match io.keys {
            Keys::Dense { key, value } => {
                let kv = RowsView::new(key.as_cpu().ok_or_else(not_cpu)?, io.dtype)?;
                let vv = RowsView::new(value.as_cpu().ok_or_else(not_cpu)?, io.dtype)?;
                self.run_tiles(
                    &qv,
                    &md.tiles,
                    &positions_of,
                    |t| DenseSource {
                        key: kv,
                        value: vv,
                        row0: qsl[t.req] as usize,
                        num_kv_heads: p.num_kv_heads,
                        head_size: p.head_size,
                    },
                    |t| (0, (qsl[t.req + 1] - qsl[t.req]) as usize),
                    &mask,
                )
            }
            Keys::Cache(cache) => {
                let view = RowsView::new(
                    cache.data().as_cpu().ok_or_else(not_cpu)?,
                    cache.spec().storage_dtype(),
                )?;
                let layer = io.layer;
                let source = |blocks| paged_source(cache, view, blocks, layer);
                // The shared prefix's blocks are request 0's first ones (the metadata checked
                // that every request starts with them).
                let prefix_blocks =
                    |len: usize| &common.block_table_row(0)[..len / common.block_size()];
                let seq = |t: &Tile| seq_lens[t.req] as usize;
                match spec.pass {
                    Pass::Full => self.run_tiles(
                        &qv,
                        &md.tiles,
                        &positions_of,
                        |t| source(common.block_table_row(t.req)),
                        |t| (0, seq(t)),
                        &mask,
                    ),
                    Pass::Prefix(len) => self.run_tiles(
                        &qv,
                        &md.tiles,
                        &positions_of,
                        |_| source(prefix_blocks(len)),
                        |_| (0, len),
                        &mask,
                    ),
                    Pass::Suffix(len) => self.run_tiles(
                        &qv,
                        &md.tiles,
                        &positions_of,
                        |t| source(common.block_table_row(t.req)),
                        |t| (len, seq(t)),
                        &mask,
                    ),
                }
            }
        };
        let (out, lse) = rec.rows(spec.target, n, p.num_heads, p.head_size);
        self.scatter(&results, n, out, lse);
        Ok(())
    }

    fn merge(
        &self,
        rec: &mut CpuRecording,
        _: &CpuAttentionMetadata,
        io: &mut ForwardIo<'_>,
    ) -> Result<()> {
        let p = &self.params;
        let n = io.num_tokens;
        let (h, d) = (p.num_heads, p.head_size);
        rec.rows(Target::Output, n, h, d);
        let CpuRecording {
            out,
            prefix,
            suffix,
        } = rec;
        merge_states(
            &mut out.0,
            Some(&mut out.1),
            &prefix.0,
            &prefix.1,
            &suffix.0,
            &suffix.1,
            n,
            h,
            d,
            None,
        );
        Ok(())
    }

    fn finish(&self, rec: CpuRecording, io: Option<&mut ForwardIo<'_>>) -> Result<()> {
        let Some(io) = io else { return Ok(()) };
        if io.num_tokens == 0 {
            return Ok(());
        }
        let out_storage = io.output.as_cpu_mut().ok_or_else(not_cpu)?;
        store(out_storage, io.dtype, 0, &rec.out.0, 1.0);
        if let Some(t) = io.output_lse.as_deref_mut() {
            match t.as_cpu_mut() {
                Some(CpuStorage::F32(v)) => v.copy_from_slice(&rec.out.1),
                _ => return Err(not_cpu()),
            }
        }
        Ok(())
    }
}

fn paged_source<'a>(
    cache: &'a KvCache,
    view: RowsView<'a>,
    blocks: &'a [i32],
    layer: &AttentionLayer,
) -> PagedSource<'a> {
    PagedSource {
        cache,
        view,
        blocks,
        k_scale: layer.k_scale,
        v_scale: layer.v_scale,
    }
}

fn not_cpu() -> Error {
    Error::Device {
        backend: "CPU".into(),
        message: "tensor is not in host memory; create it on Device::Cpu".into(),
    }
}
