//! The CPU impl: checks the arguments once, writes the cache, then runs the tiles of the
//! batch in parallel (one task per tile and KV head) and scatters their rows into `output`.

use rayon::prelude::*;

use crate::attention::{AttentionImpl, AttentionLayer, AttentionParams};
use crate::backend::AttentionType;
use crate::device::{CpuStorage, Tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::metadata::AttentionMetadata;

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

    fn metadata<'m>(
        &self,
        metadata: &'m dyn AttentionMetadata,
    ) -> Result<&'m CpuAttentionMetadata> {
        metadata.downcast::<CpuAttentionMetadata>("CpuAttentionImpl")
    }

    fn check_cache(&self, cache: &KvCache, dtype: DType, md: &CpuAttentionMetadata) -> Result<()> {
        self.params.check_kv_cache(cache, dtype, &md.common)?;
        if cache.data().as_cpu().is_none() {
            return Err(Error::Device {
                backend: "CPU".into(),
                message: "KV cache is not in host memory".into(),
            });
        }
        Ok(())
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

impl AttentionImpl for CpuAttentionImpl {
    fn params(&self) -> &AttentionParams {
        &self.params
    }

    fn can_return_lse_for_decode(&self) -> bool {
        true
    }

    fn do_kv_cache_update(
        &self,
        layer: &AttentionLayer,
        key: &Tensor,
        value: &Tensor,
        kv_cache: &mut KvCache,
        metadata: &dyn AttentionMetadata,
    ) -> Result<()> {
        let md = self.metadata(metadata)?;
        let slots = md.common.slot_mapping_cpu();
        let dtype = self
            .params
            .check_kv_update(key, value, slots.len(), kv_cache)?;
        self.check_cache(kv_cache, dtype, md)?;
        let kv = RowsView::new(key.as_cpu().ok_or_else(not_cpu)?, dtype)?;
        let vv = RowsView::new(value.as_cpu().ok_or_else(not_cpu)?, dtype)?;
        reshape_and_cache(kv, vv, kv_cache, slots, layer.k_scale, layer.v_scale);
        Ok(())
    }

    fn forward_with_lse(
        &self,
        layer: &AttentionLayer,
        query: &Tensor,
        key: Option<&Tensor>,
        value: Option<&Tensor>,
        kv_cache: &mut KvCache,
        metadata: &dyn AttentionMetadata,
        output: &mut Tensor,
        output_lse: Option<&mut Tensor>,
    ) -> Result<()> {
        let p = &self.params;
        let md = self.metadata(metadata)?;
        let common = &md.common;
        let n = common.num_actual_tokens();
        let dtype = p.check_query_output(query, output, output_lse.as_deref(), n)?;
        let lse_tensor = output_lse;
        let encoder = p.attn_type.is_encoder();
        if p.attn_type == AttentionType::EncoderDecoder {
            return Err(Error::config(
                "the CPU backend does not implement encoder_decoder attention",
            ));
        }
        if md.cascade.is_some()
            && (p.alibi_slopes.is_some() || p.sliding_window.is_some() || encoder)
        {
            return Err(Error::config(
                "cascade attention (common_prefix_len > 0) cannot be combined with ALiBi, a sliding \
                 window or encoder attention; build the metadata with common_prefix_len = 0",
            ));
        }

        let mut out = vec![0.0f32; n * p.num_heads * p.head_size];
        let mut lse = vec![0.0f32; p.num_heads * n];
        let qv = RowsView::new(query.as_cpu().ok_or_else(not_cpu)?, dtype)?;
        let qsl = common.query_start_loc_cpu();
        let seq_lens = common.seq_lens_cpu();
        let mask = Mask {
            causal: common.causal() && !encoder,
            window: p.sliding_window,
            soft_cap: p.soft_cap(),
            alibi: p.alibi_slopes.as_deref(),
            sinks: p.sinks.as_deref(),
        };
        // Absolute position of each query token: its context length plus its index. Encoder
        // self-attention has no context: its keys are the request's own query rows, so its
        // positions start at 0 whatever seq_lens says (vLLM's FA encoder path likewise uses
        // cu_seqlens_q for queries and keys and ignores seq_lens).
        let positions_of = |t: &Tile| -> Vec<usize> {
            let ctx = if encoder {
                0
            } else {
                seq_lens[t.req] as usize - (qsl[t.req + 1] - qsl[t.req]) as usize
            };
            (t.q_start..t.q_end)
                .map(|i| ctx + (i - qsl[t.req] as usize))
                .collect()
        };

        if encoder {
            // Encoder self-attention reads K/V straight from the inputs, never the cache.
            let (k, v) = match (key, value) {
                (Some(k), Some(v)) => (k, v),
                _ => {
                    return Err(Error::config(
                        "encoder attention needs key and value tensors",
                    ))
                }
            };
            self.params.check_kv_input("key", k, n, dtype)?;
            self.params.check_kv_input("value", v, n, dtype)?;
            let kv = RowsView::new(k.as_cpu().ok_or_else(not_cpu)?, dtype)?;
            let vv = RowsView::new(v.as_cpu().ok_or_else(not_cpu)?, dtype)?;
            let results = self.run_tiles(
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
            );
            self.scatter(&results, n, &mut out, &mut lse);
        } else {
            if let (Some(k), Some(v)) = (key, value) {
                self.do_kv_cache_update(layer, k, v, kv_cache, metadata)?;
            } else if key.is_some() != value.is_some() {
                return Err(Error::config("key and value must be given together"));
            }
            self.check_cache(kv_cache, dtype, md)?;
            let cache: &KvCache = kv_cache;
            let view = RowsView::new(
                cache.data().as_cpu().ok_or_else(not_cpu)?,
                cache.spec().storage_dtype(),
            )?;
            let source = |blocks| paged_source(cache, view, blocks, layer);
            match &md.cascade {
                None => {
                    let results = self.run_tiles(
                        &qv,
                        &md.tiles,
                        &positions_of,
                        |t| source(common.block_table_row(t.req)),
                        |t| (0, seq_lens[t.req] as usize),
                        &mask,
                    );
                    self.scatter(&results, n, &mut out, &mut lse);
                }
                Some(plan) => {
                    // Prefix: every token against the shared blocks, no mask, with sinks.
                    let prefix_mask = Mask {
                        causal: false,
                        ..mask
                    };
                    let results = self.run_tiles(
                        &qv,
                        &md.tiles,
                        &positions_of,
                        |_| source(&plan.prefix_blocks),
                        |_| (0, plan.prefix_len),
                        &prefix_mask,
                    );
                    let mut o_p = vec![0.0f32; out.len()];
                    let mut l_p = vec![0.0f32; lse.len()];
                    self.scatter(&results, n, &mut o_p, &mut l_p);
                    // Suffix: each request's own keys after the prefix, causal, no sinks.
                    let suffix_mask = Mask {
                        sinks: None,
                        ..mask
                    };
                    let results = self.run_tiles(
                        &qv,
                        &md.tiles,
                        &positions_of,
                        |t| source(common.block_table_row(t.req)),
                        |t| (plan.prefix_len, seq_lens[t.req] as usize),
                        &suffix_mask,
                    );
                    let mut o_s = vec![0.0f32; out.len()];
                    let mut l_s = vec![0.0f32; lse.len()];
                    self.scatter(&results, n, &mut o_s, &mut l_s);
                    merge_states(
                        &mut out,
                        Some(&mut lse),
                        &o_p,
                        &l_p,
                        &o_s,
                        &l_s,
                        n,
                        p.num_heads,
                        p.head_size,
                        None,
                    );
                }
            }
        }

        let out_storage = output.as_cpu_mut().ok_or_else(not_cpu)?;
        store(out_storage, dtype, 0, &out, 1.0);
        if let Some(t) = lse_tensor {
            match t.as_cpu_mut() {
                Some(CpuStorage::F32(v)) => v.copy_from_slice(&lse),
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
