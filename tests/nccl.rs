//! NCCL through polyattn (`device::cuda::NcclComms`) and decode context parallelism with one
//! rank per CUDA device (`parallel::dcp::forward_decode_across`).
//!
//! What one GPU can check: NCCL is found or reported unavailable with a reason (never a
//! panic); two ranks on one GPU are refused; an all-reduce and a broadcast over one rank leave
//! the data as it was; the across-devices DCP path over one rank equals the f64 reference.
//! A `RankGroup` sums through NCCL over distinct GPUs and through the host for two ranks on
//! one GPU. The runs with two or more GPUs need a machine with several; this file says it
//! skipped them.

#[macro_use]
mod common;

use polyattn::device::cuda::{nccl_status, CudaDevice, NcclComms};
use polyattn::parallel::dcp::{self, DcpDecodeBatch, DcpRank};
use polyattn::parallel::{RankGroup, Transport};
use polyattn::reference;
use polyattn::testing::fuzz::{fill_cache_outside, StaleFill};
use polyattn::testing::{BatchSpec, CaseConfig, RandomBatch, Rng, Tolerance};
use polyattn::{AttentionParams, DType, Device, KvCacheSpec, Tensor};

fn device_count() -> usize {
    CudaDevice::count()
}

/// Collectives of different tests over the same GPUs must not interleave (see `NcclComms`):
/// the tests take turns.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn nccl_is_found_or_reported_unavailable() {
    let _serial = serial();
    match nccl_status() {
        Ok(v) => report!("[nccl] NCCL {v} found"),
        Err(why) => report!("[nccl] NCCL unavailable: {why}"),
    }
    let dev = match CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            report!(
                "SKIP nccl_is_found_or_reported_unavailable (communicators): no CUDA device ({e})"
            );
            return;
        }
    };
    match (nccl_status(), NcclComms::new(std::slice::from_ref(&dev))) {
        (Ok(_), Ok(c)) => assert_eq!(c.world_size(), 1),
        (Err(_), Err(e)) => {
            let e = e.to_string();
            assert!(e.contains("unavailable"), "{e}");
        }
        (Ok(_), Err(e)) => panic!("NCCL is present but a one-rank communicator failed: {e}"),
        (Err(why), Ok(_)) => panic!("NCCL reported unavailable ({why}) yet opened"),
    }
    if nccl_status().is_ok() {
        let e = NcclComms::new(&[dev.clone(), dev]).unwrap_err().to_string();
        assert!(e.contains("listed twice"), "{e}");
    }
}

#[test]
fn one_rank_collectives_keep_the_data() {
    let _serial = serial();
    let Ok(dev) = CudaDevice::new(0) else {
        report!("SKIP one_rank_collectives_keep_the_data: no CUDA device");
        return;
    };
    if let Err(why) = nccl_status() {
        report!("SKIP one_rank_collectives_keep_the_data: NCCL unavailable: {why}");
        return;
    }
    let mut comms = NcclComms::new(std::slice::from_ref(&dev)).unwrap();
    let device = Device::Cuda(dev);
    let data = Rng::new(3).normals(1000);
    let mut x = Tensor::from_f32(&device, &data, &[1000], DType::F32).unwrap();
    comms.all_reduce_sum(&mut [&mut x]).unwrap();
    assert_eq!(
        x.to_f32_vec().unwrap(),
        data,
        "a one-rank sum changed the data"
    );
    let part = Tensor::from_f32(&device, &data[..300], &[300], DType::Bf16).unwrap();
    let mut got = vec![vec![Tensor::zeros(&device, &[300], DType::Bf16).unwrap()]];
    comms.broadcast_parts(&[(0, &part)], &mut got).unwrap();
    assert_eq!(got[0][0].to_f32_vec().unwrap(), part.to_f32_vec().unwrap());
    // Wrong sizes and devices are errors.
    let mut small = vec![vec![Tensor::zeros(&device, &[10], DType::Bf16).unwrap()]];
    assert!(comms.broadcast_parts(&[(0, &part)], &mut small).is_err());
    let host = Tensor::from_f32(&Device::cpu(), &data, &[1000], DType::F32).unwrap();
    let mut host2 = host.clone();
    assert!(comms.all_reduce_sum(&mut [&mut host2]).is_err());
}

#[test]
fn dcp_across_devices_matches_reference() {
    let _serial = serial();
    let n = device_count();
    if n == 0 {
        report!("SKIP dcp_across_devices_matches_reference: no CUDA device");
        return;
    }
    if let Err(why) = nccl_status() {
        report!("SKIP dcp_across_devices_matches_reference: NCCL unavailable: {why}");
        return;
    }
    if n < 2 {
        report!(
            "[dcp_across_devices] one CUDA device: the across-devices path runs over one rank; \
             2..=4 ranks need a machine with that many GPUs (skipped)"
        );
    }
    let world = n.min(4);
    let backends: Vec<_> = (0..world)
        .map(polyattn::backends::cuda::CudaBackend::with_ordinal)
        .collect();
    let params = AttentionParams::new(8, 128, 2);
    let bs = 16;
    let case = CaseConfig::new(params.clone(), DType::Bf16, bs);
    let spec = BatchSpec::new(&[(1, 4 * world * bs + 9), (1, 3 * bs + 2), (1, 5), (1, 1)]);
    let batch = RandomBatch::generate(&backends[0], &case, &spec, 91).unwrap();
    let want = reference::attention(&batch).unwrap();
    let dcp = DcpDecodeBatch::from_unsharded(&batch.desc, world).unwrap();
    let kv_spec = KvCacheSpec {
        block_size: bs,
        num_kv_heads: 2,
        head_size: 128,
        dtype: DType::Bf16,
        cache_dtype: polyattn::CacheDType::Auto,
    };
    let devices: Vec<CudaDevice> = (0..world).map(|o| CudaDevice::new(o).unwrap()).collect();
    let mut comms = NcclComms::new(&devices).unwrap();
    let mut fixed = Vec::new();
    let mut owned = Vec::new();
    for (r, b) in backends.iter().enumerate() {
        let device = Device::Cuda(devices[r].clone());
        let imp = polyattn::AttentionBackend::make_impl(b, params.clone()).unwrap();
        let builder = polyattn::AttentionBackend::make_builder(b, &kv_spec).unwrap();
        let md = dcp.build_rank(r, &device, builder.as_ref()).unwrap();
        fixed.push((
            imp,
            md,
            batch.query.to_device(&device).unwrap(),
            batch.key.to_device(&device).unwrap(),
            batch.value.to_device(&device).unwrap(),
        ));
        // The rank's cache: poisoned outside the blocks it owns.
        let mut cache = batch.kv_cache.to_device(&Device::cpu()).unwrap();
        let desc = dcp.rank_description(r).unwrap();
        let mut keep = std::collections::BTreeSet::new();
        for (i, &(_, s)) in spec.requests.iter().enumerate().take(dcp.holding(r)) {
            for pos in 0..dcp.layout().local_len(s, r) {
                let block = desc.block_table[i * desc.max_blocks_per_req + pos / bs];
                keep.insert(block as usize * bs + pos % bs);
            }
        }
        fill_cache_outside(&mut cache, &keep, StaleFill::Nan, 5).unwrap();
        owned.push((
            cache.to_device(&device).unwrap(),
            Tensor::zeros(&device, batch.query.shape(), DType::Bf16).unwrap(),
        ));
    }
    // Once with buffers of its own, then twice through one workspace (made, then reused;
    // rewriting the step's new token writes the same key and value again).
    let mut workspace = dcp::DcpWorkspace::default();
    for call in 0..3 {
        for (_, out) in owned.iter_mut() {
            *out = Tensor::zeros(out.device(), out.shape(), DType::Bf16).unwrap();
        }
        let mut ranks: Vec<DcpRank<'_>> = fixed
            .iter()
            .zip(owned.iter_mut())
            .map(|((imp, md, q, k, v), (cache, out))| DcpRank {
                imp: imp.as_ref(),
                query: q,
                key: Some(k),
                value: Some(v),
                cache,
                metadata: md.as_deref(),
                output: out,
            })
            .collect();
        match call {
            0 => dcp::forward_decode_across(&mut comms, &batch.layer, &dcp, &mut ranks),
            _ => dcp::forward_decode_across_in(
                &mut comms,
                &batch.layer,
                &dcp,
                &mut ranks,
                &mut workspace,
            ),
        }
        .unwrap();
        drop(ranks);
        for (r, o) in owned.iter().enumerate() {
            let got = o.1.to_f32_vec().unwrap();
            let cmp = reference::compare(&got, &want.out, Tolerance::for_dtype(DType::Bf16));
            assert!(cmp.pass, "call {call}: rank {r}'s combined output: {cmp}");
        }
    }
    report!("[dcp_across_devices] {world} rank(s) over NCCL match the f64 reference");
}

/// `RankGroup` picks NCCL for distinct GPUs and host sums for two ranks on one GPU, and both
/// leave the sum on every rank.
#[test]
fn rank_groups_sum_through_nccl_or_the_host() {
    let _serial = serial();
    let n = device_count();
    if n == 0 {
        report!("SKIP rank_groups_sum_through_nccl_or_the_host: no CUDA device");
        return;
    }
    let gpus: Vec<Device> = (0..n.min(4))
        .map(|o| Device::Cuda(CudaDevice::new(o).unwrap()))
        .collect();
    let shared = vec![gpus[0].clone(), gpus[0].clone()];
    for devices in [gpus.clone(), shared] {
        let mut group = RankGroup::new(devices.clone()).unwrap();
        let distinct = devices.len() == 1 || devices[0] != devices[1];
        match (group.transport(), nccl_status(), distinct) {
            (Transport::Nccl, Ok(_), true) => {}
            (Transport::Host { why }, Err(_), true) => {
                assert!(why.contains("unavailable"), "{why}")
            }
            (Transport::Host { why }, _, false) => assert!(why.contains("share GPU 0"), "{why}"),
            (t, status, _) => panic!("{} ranks, NCCL {status:?}: transport {t}", devices.len()),
        }
        let mut rng = Rng::new(17);
        let parts: Vec<Vec<f32>> = devices.iter().map(|_| rng.normals(4096)).collect();
        let mut ts: Vec<Tensor> = parts
            .iter()
            .zip(&devices)
            .map(|(p, d)| Tensor::from_f32(d, p, &[4, 1024], DType::F32).unwrap())
            .collect();
        let mut refs: Vec<&mut Tensor> = ts.iter_mut().collect();
        group.all_reduce_sum(&mut refs).unwrap();
        let want: Vec<f32> = (0..4096)
            .map(|i| parts.iter().map(|p| p[i]).sum())
            .collect();
        for (r, t) in ts.iter().enumerate() {
            let got = t.to_f32_vec().unwrap();
            let worst = got
                .iter()
                .zip(&want)
                .map(|(g, w)| (g - w).abs())
                .fold(0.0f32, f32::max);
            assert!(
                worst <= 1e-5,
                "rank {r}: off by {worst} ({})",
                group.transport()
            );
        }
        report!(
            "[rank_groups] {} rank(s) on {} GPU(s): {}",
            devices.len(),
            if distinct { devices.len() } else { 1 },
            group.transport()
        );
    }
}

/// The multi-GPU run of decode context parallelism: one request with 1M cached tokens
/// (Llama-3-8B's 32 / 8 heads, bf16, 4 GiB of KV) decoded with its cache over two GPUs equals
/// the same decode on one GPU. Needs ~9 GB free on the first GPU (the zeroed cache and its
/// random contents), ~5 GB on the second and ~9 GB of host memory.
#[test]
fn a_million_token_context_over_two_gpus_equals_one_gpu() {
    let _serial = serial();
    let n = device_count();
    if n < 2 {
        report!(
            "SKIP a_million_token_context_over_two_gpus_equals_one_gpu: {n} CUDA device(s); \
             the run needs 2"
        );
        return;
    }
    if let Err(why) = nccl_status() {
        report!(
            "SKIP a_million_token_context_over_two_gpus_equals_one_gpu: NCCL unavailable: {why}"
        );
        return;
    }
    let (s, bs, hq, hk, d) = (1usize << 20, 16, 32, 8, 128);
    let params = AttentionParams::new(hq, d, hk);
    let spec = KvCacheSpec {
        block_size: bs,
        num_kv_heads: hk,
        head_size: d,
        dtype: DType::Bf16,
        cache_dtype: polyattn::CacheDType::Auto,
    };
    let blocks = s / bs;
    let desc = polyattn::metadata::BatchDescription {
        query_start_loc: vec![0, 1],
        seq_lens: vec![s as i32],
        block_table: (0..blocks as i32).collect(),
        max_blocks_per_req: blocks,
        slot_mapping: vec![-1],
        causal: true,
        block_size: bs,
        is_prefilling: None,
    };
    let backends: Vec<_> = (0..2)
        .map(polyattn::backends::cuda::CudaBackend::with_ordinal)
        .collect();
    let gpus: Vec<CudaDevice> = (0..2).map(|o| CudaDevice::new(o).unwrap()).collect();
    let devices: Vec<Device> = gpus.iter().cloned().map(Device::Cuda).collect();
    // Random keys and values: a chunk of normals whose length is no multiple of a block,
    // repeated, so that every block differs from every other.
    let chunk = Rng::new(5).normals((1 << 24) + 7);
    let mut cache = polyattn::KvCache::new(&backends[0], spec, blocks).unwrap();
    let shape = cache.data().shape().to_vec();
    let numel: usize = shape.iter().product();
    let data: Vec<half::bf16> = (0..numel)
        .map(|i| half::bf16::from_f32(chunk[i % chunk.len()]))
        .collect();
    *cache.data_mut() = Tensor::from_cpu_storage(
        &devices[0],
        polyattn::device::CpuStorage::Bf16(data),
        &shape,
        DType::Bf16,
    )
    .unwrap();
    let q_host = Rng::new(6).normals(hq * d);
    let query = Tensor::from_f32(&devices[0], &q_host, &[1, hq, d], DType::Bf16).unwrap();

    // One GPU.
    let imp = polyattn::AttentionBackend::make_impl(&backends[0], params.clone()).unwrap();
    let builder = polyattn::AttentionBackend::make_builder(&backends[0], &spec).unwrap();
    let common = polyattn::CommonAttentionMetadata::new(&devices[0], desc.clone()).unwrap();
    let md = builder.build(0, &common, false).unwrap();
    let layer = polyattn::AttentionLayer::new("dcp-1m");
    let mut one = Tensor::zeros(&devices[0], &[1, hq, d], DType::Bf16).unwrap();
    imp.forward(
        &layer,
        &query,
        None,
        None,
        &mut cache,
        md.as_ref(),
        &mut one,
    )
    .unwrap();
    let want: Vec<f64> = one
        .to_f32_vec()
        .unwrap()
        .iter()
        .map(|&x| x as f64)
        .collect();

    // Two GPUs: each rank's cache is a copy of the pool (from_unsharded keeps block ids), of
    // which it reads its own blocks.
    let dcp = DcpDecodeBatch::from_unsharded(&desc, 2).unwrap();
    let mut comms = NcclComms::new(&gpus).unwrap();
    let imps: Vec<_> = backends
        .iter()
        .map(|b| polyattn::AttentionBackend::make_impl(b, params.clone()).unwrap())
        .collect();
    let mds: Vec<_> = (0..2)
        .map(|r| {
            let builder = polyattn::AttentionBackend::make_builder(&backends[r], &spec).unwrap();
            dcp.build_rank(r, &devices[r], builder.as_ref()).unwrap()
        })
        .collect();
    let queries: Vec<Tensor> = devices
        .iter()
        .map(|dev| query.to_device(dev).unwrap())
        .collect();
    let mut caches = vec![cache.to_device(&devices[1]).unwrap()];
    caches.insert(0, cache);
    let mut outs: Vec<Tensor> = devices
        .iter()
        .map(|dev| Tensor::zeros(dev, &[1, hq, d], DType::Bf16).unwrap())
        .collect();
    let mut ranks: Vec<DcpRank<'_>> = imps
        .iter()
        .zip(&queries)
        .zip(caches.iter_mut())
        .zip(&mds)
        .zip(outs.iter_mut())
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
    dcp::forward_decode_across(&mut comms, &layer, &dcp, &mut ranks).unwrap();
    drop(ranks);
    for (r, o) in outs.iter().enumerate() {
        let got = o.to_f32_vec().unwrap();
        let cmp = reference::compare(&got, &want, Tolerance::for_dtype(DType::Bf16));
        assert!(cmp.pass, "rank {r}'s combined output vs one GPU: {cmp}");
    }
    report!("[dcp_1m] 1M cached tokens over 2 GPUs (NCCL) equal the one-GPU decode");
}
