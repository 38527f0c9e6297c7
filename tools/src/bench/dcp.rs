//! Rows of the DCP group: one decode layer whose KV cache is sharded over `ranks` ranks
//! (`polyattn::parallel::dcp`: whole blocks round-robin, each rank's shard an ordinary paged
//! cache holding only its blocks), timed end to end — every rank's attention, the exchange of
//! the partial results and the combine.
//!
//! Where the ranks run: on a CUDA backend with `ranks` GPUs from its own on and NCCL, rank `r`
//! on the `r`-th of them and the partial results all-gathered through NCCL
//! (`dcp::forward_decode_across`); otherwise every rank's shard on the backend's one device
//! (`dcp::forward_decode`, the one-device form), which measures what sharding costs there,
//! not what it gains. The timer text of each row says which.
//!
//! Timing: the wall clock between synchronisations of every device the row uses, for the r1
//! row (the unsharded decode on one device) too, so the rows of one shape compare directly:
//! r1's time over r2's is the speed-up of two ranks. A device event timer would see one GPU
//! only; the wall clock adds the host's launch and synchronisation latency (tens of µs) to
//! every row alike.

use polyattn::backend::AttentionBackend;
use polyattn::backends::cuda::CudaBackend;
use polyattn::device::cuda::{nccl_status, CudaDevice, NcclComms};
use polyattn::device::{Device, Tensor};
use polyattn::dtype::{CacheDType, DType};
use polyattn::error::Result;
use polyattn::kv_cache::{KvCache, KvCacheSpec};
use polyattn::metadata::AttentionMetadata;
use polyattn::parallel::dcp::{
    self, DcpDecodeBatch, DcpLayout, DcpMetadata, DcpRank, DcpWorkspace,
};
use polyattn::parallel::RankBlockTable;
use polyattn::probe::{RegionTimer, WallTimer};
use polyattn::{AttentionImpl, AttentionLayer};

use super::inputs;
use super::shapes::Case;
use super::timing::{self, Samples, TimingConfig};

/// One input set: the split batch and, per rank, its shard of the cache, every request's
/// query and the combined output on its device, and its metadata (across devices) — or the
/// one-device form's metadata.
struct DcpSet {
    batch: DcpDecodeBatch,
    caches: Vec<KvCache>,
    queries: Vec<Tensor>,
    outputs: Vec<Tensor>,
    metadata: Vec<Option<Box<dyn AttentionMetadata>>>,
    one_device: Option<DcpMetadata>,
}

/// The ordinals of `ranks` GPUs from `backend`'s on, when `backend` is CUDA, that many GPUs
/// follow its and NCCL loads; `None` otherwise.
fn gpus_for(backend: &dyn AttentionBackend, ranks: usize) -> Option<Vec<usize>> {
    let Ok(Device::Cuda(first)) = backend.device() else {
        return None;
    };
    let first = first.ordinal();
    let enough = first + ranks <= CudaDevice::count();
    (enough && nccl_status().is_ok()).then(|| (first..first + ranks).collect())
}

/// Times one DCP row (module docs): `sets` input sets of `case` in `dtype` / `kv`. Returns the
/// samples, how they were timed and where the ranks ran, and how many devices ran them.
pub fn time(
    backend: &dyn AttentionBackend,
    device: &Device,
    case: &Case,
    (dtype, kv): (DType, CacheDType),
    sets: usize,
    seed: u64,
    cfg: &TimingConfig,
) -> Result<(Samples, String, usize)> {
    let layer = AttentionLayer::new("bench");
    let params = inputs::params(case, kv);
    let seed_of = |i: usize| seed ^ ((i as u64 + 1) * 0x9e37_79b9);
    if case.ranks <= 1 {
        let imp = backend.make_impl(params)?;
        let mut v = (0..sets)
            .map(|i| inputs::attention_set(backend, case, dtype, kv, seed_of(i)))
            .collect::<Result<Vec<_>>>()?;
        let mut timer = WallTimer::across(std::slice::from_ref(device));
        let s = timing::measure(&mut timer, cfg, |i| {
            let n = v.len();
            super::forward_set(imp.as_ref(), &layer, &mut v[i % n])
        })?;
        super::check_finite(&v[0].output)?;
        return Ok((s, format!("{}; one rank", timer.method()), 1));
    }
    let ranks = case.ranks;
    let spec = inputs::cache_spec(case, dtype, kv);
    match gpus_for(backend, ranks) {
        Some(ordinals) => {
            let backends: Vec<CudaBackend> = ordinals
                .iter()
                .map(|&o| CudaBackend::with_ordinal(o))
                .collect();
            let gpus = ordinals
                .iter()
                .map(|&o| CudaDevice::new(o))
                .collect::<Result<Vec<_>>>()?;
            let devices: Vec<Device> = gpus.iter().cloned().map(Device::Cuda).collect();
            let imps = backends
                .iter()
                .map(|b| b.make_impl(params.clone()))
                .collect::<Result<Vec<_>>>()?;
            let rank_backends: Vec<&dyn AttentionBackend> = backends
                .iter()
                .map(|b| b as &dyn AttentionBackend)
                .collect();
            let mut v = (0..sets)
                .map(|i| dcp_set(case, &rank_backends, &spec, false, seed_of(i)))
                .collect::<Result<Vec<_>>>()?;
            let mut comms = NcclComms::new(&gpus)?;
            // Every set has the same shape: one workspace serves them all.
            let mut workspace = DcpWorkspace::default();
            let mut timer = WallTimer::across(&devices);
            let s = timing::measure(&mut timer, cfg, |i| {
                let n = v.len();
                let set = &mut v[i % n];
                let mut rank_args: Vec<DcpRank<'_>> = imps
                    .iter()
                    .zip(&set.queries)
                    .zip(set.caches.iter_mut())
                    .zip(&set.metadata)
                    .zip(set.outputs.iter_mut())
                    .map(|((((imp, query), cache), md), output)| DcpRank {
                        imp: imp.as_ref(),
                        query,
                        key: None,
                        value: None,
                        cache,
                        metadata: md.as_deref(),
                        output,
                    })
                    .collect();
                dcp::forward_decode_across_in(
                    &mut comms,
                    &layer,
                    &set.batch,
                    &mut rank_args,
                    &mut workspace,
                )
            })?;
            super::check_finite(&v[0].outputs[0])?;
            Ok((
                s,
                format!(
                    "{}; ranks on CUDA GPUs {ordinals:?}, partial results all-gathered through \
                     NCCL",
                    timer.method()
                ),
                ranks,
            ))
        }
        None => {
            let imp = backend.make_impl(params)?;
            let rank_backends = vec![backend; ranks];
            let mut v = (0..sets)
                .map(|i| dcp_set(case, &rank_backends, &spec, true, seed_of(i)))
                .collect::<Result<Vec<_>>>()?;
            let mut timer = WallTimer::across(std::slice::from_ref(device));
            let s = timing::measure(&mut timer, cfg, |i| {
                let n = v.len();
                one_device_forward(imp.as_ref(), &layer, &mut v[i % n])
            })?;
            super::check_finite(&v[0].outputs[0])?;
            Ok((
                s,
                format!(
                    "{}; the {ranks} ranks share the device (the one-device form: what \
                     sharding costs here, not what it gains)",
                    timer.method()
                ),
                1,
            ))
        }
    }
}

/// The one-device form over `set`: every shard on one device, combined there.
fn one_device_forward(
    imp: &dyn AttentionImpl,
    layer: &AttentionLayer,
    set: &mut DcpSet,
) -> Result<()> {
    let md = set
        .one_device
        .as_ref()
        .ok_or_else(|| super::config_error("a one-device DCP set without its metadata"))?;
    let (query, output) = match (set.queries.first(), set.outputs.first_mut()) {
        (Some(q), Some(o)) => (q, o),
        _ => return Err(super::config_error("a DCP set without ranks")),
    };
    dcp::forward_decode(
        imp,
        layer,
        query,
        None,
        None,
        &mut set.caches,
        md,
        output,
        None,
    )
}

/// One input set: each rank's cache holds only its blocks of every request (numbered from 0
/// in request order), filled with random normals; every rank gets the same queries.
fn dcp_set(
    case: &Case,
    backends: &[&dyn AttentionBackend],
    spec: &KvCacheSpec,
    one_device: bool,
    seed: u64,
) -> Result<DcpSet> {
    let n = backends.len();
    let bs = case.block_size;
    let layout = DcpLayout::new(n, bs)?;
    let seq_lens: Vec<usize> = case.requests.iter().map(|r| r.sk).collect();
    let tables: Vec<RankBlockTable> = (0..n)
        .map(|r| {
            let blocks: Vec<usize> = seq_lens
                .iter()
                .map(|&s| layout.local_len(s, r).div_ceil(bs).max(1))
                .collect();
            let width = blocks.iter().copied().max().unwrap_or(1);
            let mut table = vec![0i32; seq_lens.len() * width];
            let mut next = 0i32;
            for (i, &b) in blocks.iter().enumerate() {
                for slot in &mut table[i * width..i * width + b] {
                    *slot = next;
                    next += 1;
                }
            }
            RankBlockTable {
                block_table: table,
                max_blocks_per_req: width,
            }
        })
        .collect();
    let batch = DcpDecodeBatch::new(layout, &seq_lens, &tables)?;
    let shape = [case.num_tokens(), case.num_heads, case.head_size];
    let first = backends[0].device()?;
    let query = inputs::random_tensor(&first, &shape, spec.dtype, seed ^ 0x9)?;
    let mut set = DcpSet {
        batch,
        caches: Vec::with_capacity(n),
        queries: Vec::with_capacity(n),
        outputs: Vec::with_capacity(n),
        metadata: Vec::with_capacity(n),
        one_device: None,
    };
    for (r, b) in backends.iter().enumerate() {
        let device = b.device()?;
        let blocks = tables[r].block_table.iter().copied().max().unwrap_or(0) as usize + 1;
        let mut cache = KvCache::new(*b, *spec, blocks)?;
        inputs::fill_cache(&device, &mut cache, seed ^ 0xcac4e ^ ((r as u64) << 32))?;
        set.caches.push(cache);
        set.metadata.push(match one_device {
            true => None,
            false => set
                .batch
                .build_rank(r, &device, b.make_builder(spec)?.as_ref())?,
        });
        set.queries.push(query.to_device(&device)?);
        set.outputs
            .push(Tensor::zeros(&device, &shape, spec.dtype)?);
    }
    if one_device {
        let builder = backends[0].make_builder(spec)?;
        set.one_device = Some(set.batch.build(&first, builder.as_ref())?);
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::formulas::Request;
    use crate::bench::shapes;

    /// A DCP row's shape at a size a unit test affords: 3 requests of different lengths.
    fn small(ranks: usize) -> Case {
        let mut c = shapes::select("DCP.b8s128k.r2").unwrap().remove(0);
        c.ranks = ranks;
        c.requests = [200, 97, 33]
            .iter()
            .map(|&sk| Request { sq: 1, sk })
            .collect();
        c.num_heads = 4;
        c.num_kv_heads = 2;
        c.head_size = 64;
        c.head_size_v = 64;
        c
    }

    #[test]
    fn rows_time_the_sharded_decode_and_say_where_it_ran() {
        let backend = polyattn::registry::global().get("CPU").unwrap();
        let device = Device::cpu();
        let cfg = TimingConfig {
            warmup: 1,
            min_reps: 2,
            max_reps: 2,
            ..TimingConfig::default()
        };
        for (ranks, says) in [
            (1, "one rank"),
            (2, "share the device"),
            (4, "share the device"),
        ] {
            let (s, timer, devices) = time(
                backend.as_ref(),
                &device,
                &small(ranks),
                (DType::F32, CacheDType::Auto),
                2,
                7,
                &cfg,
            )
            .unwrap();
            assert_eq!(s.len(), 2, "{ranks} ranks");
            assert_eq!(devices, 1, "{ranks} ranks on the one CPU");
            assert!(timer.contains(says), "{ranks} ranks: {timer}");
        }
    }

    #[test]
    fn the_sharded_sets_compute_the_unsharded_decode() {
        // The one-device form over the bench's own shards (each rank holding only its blocks)
        // gives what one cache of the same data gives: the shards really are the batch.
        let backend = polyattn::registry::global().get("CPU").unwrap();
        let case = small(3);
        let spec = inputs::cache_spec(&case, DType::F32, CacheDType::Auto);
        let layer = AttentionLayer::new("bench");
        let imp = backend
            .make_impl(inputs::params(&case, CacheDType::Auto))
            .unwrap();
        let mut set = dcp_set(&case, &[backend.as_ref(); 3], &spec, true, 5).unwrap();
        one_device_forward(imp.as_ref(), &layer, &mut set).unwrap();
        let got = set.outputs[0].to_f32_vec().unwrap();
        // The same keys and values in one cache: request i's position p is rank p/bs mod 3's
        // local position.
        let bs = case.block_size;
        let layout = DcpLayout::new(3, bs).unwrap();
        let caches: Vec<Vec<f32>> = set
            .caches
            .iter()
            .map(|c| c.data().to_f32_vec().unwrap())
            .collect();
        let (hk, d) = (case.num_kv_heads, case.head_size);
        let hq = case.num_heads;
        let q = set.queries[0].to_f32_vec().unwrap();
        for (i, r) in case.requests.iter().enumerate() {
            for h in 0..hq {
                let kh = h / (hq / hk);
                let qv = &q[(i * hq + h) * d..(i * hq + h + 1) * d];
                let mut scores = Vec::new();
                let mut values = Vec::new();
                for p in 0..r.sk {
                    let (rank, local) = layout.owner(p);
                    let table = set.batch.rank_description(rank).unwrap();
                    let width = table.max_blocks_per_req;
                    let block = table.block_table[i * width + local / bs] as usize;
                    let at = |plane: usize| {
                        let base = set.caches[rank].offset(block, plane, local % bs, kh);
                        &caches[rank][base..base + d]
                    };
                    let dot: f64 = qv
                        .iter()
                        .zip(at(0))
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum();
                    scores.push(dot / (d as f64).sqrt());
                    values.push(at(1).to_vec());
                }
                let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = w.iter().sum();
                for k in 0..d {
                    let want: f64 = w
                        .iter()
                        .zip(&values)
                        .map(|(w, v)| w * v[k] as f64)
                        .sum::<f64>()
                        / total;
                    let g = got[(i * hq + h) * d + k] as f64;
                    assert!(
                        (g - want).abs() < 1e-4,
                        "request {i} head {h} dim {k}: {g} vs {want}"
                    );
                }
            }
        }
    }
}
