//! `polyattn check`: one random batch on every available backend (or the one
//! `POLYATTN_BACKEND` forces), for each dtype and KV-cache dtype it supports, compared with
//! the f64 reference.

use std::time::Instant;

use clap::Args;
use polyattn::reference::{self, compare};
use polyattn::selector::{self, BACKEND_ENV};
use polyattn::testing::{BatchSpec, CaseConfig, RandomBatch, Tolerance};
use polyattn::{
    registry, AttentionParams, BackendRef, CacheDType, CommonAttentionMetadata, DType, Error,
    Result, SelectorConfig, Tensor,
};

/// Arguments of `polyattn check`.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Query heads.
    #[arg(long, default_value_t = 8)]
    num_heads: usize,
    /// KV heads.
    #[arg(long, default_value_t = 2)]
    num_kv_heads: usize,
    /// Head size.
    #[arg(long, default_value_t = 128)]
    head_size: usize,
    /// Tokens per KV-cache block.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Only this activation dtype (default: f32, f16 and bf16).
    #[arg(long)]
    dtype: Option<DType>,
    /// Only this KV-cache dtype (default: auto, plus fp8_e4m3 and fp8_e5m2).
    #[arg(long)]
    kv_dtype: Option<CacheDType>,
    /// Seed of the random batch.
    #[arg(long, default_value_t = 2024)]
    seed: u64,
}

/// The embedded default batch: `(query_len, seq_len)` of two decodes, a prefill and a
/// chunked prefill whose context is not a multiple of the block size.
const DEFAULT_BATCH: [(usize, usize); 4] = [(1, 37), (1, 300), (57, 57), (23, 123)];

fn cases(args: &CheckArgs) -> Vec<(DType, CacheDType)> {
    let all = [
        (DType::F32, CacheDType::Auto),
        (DType::F16, CacheDType::Auto),
        (DType::Bf16, CacheDType::Auto),
        (DType::Bf16, CacheDType::Fp8E4m3),
        (DType::F16, CacheDType::Fp8E5m2),
    ];
    all.into_iter()
        .filter(|(d, k)| {
            args.dtype.is_none_or(|x| x == *d) && args.kv_dtype.is_none_or(|x| x == *k)
        })
        .chain(match (args.dtype, args.kv_dtype) {
            // An explicit pair not in the default list still runs.
            (Some(d), Some(k)) if !all.contains(&(d, k)) => Some((d, k)),
            _ => None,
        })
        .collect()
}

/// One row of the report.
struct Row {
    backend: String,
    dtype: DType,
    kv: CacheDType,
    outcome: std::result::Result<(reference::Comparison, reference::Comparison, f64), String>,
}

fn run_one(
    backend: &BackendRef,
    args: &CheckArgs,
    dtype: DType,
    kv: CacheDType,
) -> Result<(reference::Comparison, reference::Comparison, f64)> {
    let mut params = AttentionParams::new(args.num_heads, args.head_size, args.num_kv_heads);
    params.kv_cache_dtype = kv;
    let case = CaseConfig::new(params.clone(), dtype, args.block_size);
    let mut batch = RandomBatch::generate(
        backend.as_ref(),
        &case,
        &BatchSpec::new(&DEFAULT_BATCH),
        args.seed,
    )?;
    let want = reference::attention(&batch)?;
    let device = backend.device()?;
    let spec = *batch.kv_cache.spec();
    let builder = backend.make_builder(&spec)?;
    let imp = backend.make_impl(params)?;
    let common = CommonAttentionMetadata::new(&device, batch.desc.clone())?;
    let metadata = builder.build(0, &common, false)?;
    let mut out = batch.empty_output()?;
    let n = batch.spec.num_tokens();
    let mut lse = Tensor::zeros(&device, &[args.num_heads, n], DType::F32)?;
    let t0 = Instant::now();
    imp.forward_with_lse(
        &batch.layer,
        &batch.query,
        Some(&batch.key),
        Some(&batch.value),
        &mut batch.kv_cache,
        metadata.as_ref(),
        &mut out,
        Some(&mut lse),
    )?;
    device.synchronize()?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let tol = Tolerance::for_dtype(dtype);
    let out_cmp = compare(&out.to_f32_vec()?, &want.out, tol);
    // LSEs are f32 on every backend: the f32 tolerance scaled by the output dtype's.
    let lse_cmp = compare(&lse.to_f32_vec()?, &want.lse, tol);
    Ok((out_cmp, lse_cmp, ms))
}

/// Runs the check; returns false when any backend is out of tolerance or fails.
pub fn run(args: &CheckArgs) -> Result<bool> {
    let list = super::run_on(selector::forced_backend_from_env())?;
    println!(
        "polyattn check: {} heads / {} KV heads, head size {}, block size {}, seed {}",
        args.num_heads, args.num_kv_heads, args.head_size, args.block_size, args.seed
    );
    println!(
        "batch (query_len, seq_len): {:?} — two decodes, a prefill, a chunked prefill",
        DEFAULT_BATCH
    );
    if let Some(f) = selector::forced_backend_from_env() {
        println!("{BACKEND_ENV}={f}: checking only that backend");
    }
    println!();
    let mut rows = Vec::new();
    for b in &list {
        if let polyattn::Availability::Unavailable(why) = b.availability() {
            return Err(Error::ForcedBackendInvalid {
                name: b.name().into(),
                reasons: vec![polyattn::Reason::new("backend unavailable", why)],
                valid: registry::global().names(),
            });
        }
        for (dtype, kv) in cases(args) {
            let mut cfg = SelectorConfig::new(args.head_size, dtype, kv);
            cfg.block_size = Some(args.block_size as u32);
            let reasons = b.validate_configuration(&cfg);
            let outcome = if reasons.is_empty() {
                run_one(b, args, dtype, kv).map_err(|e| e.to_string())
            } else {
                Err(format!(
                    "skipped: {}",
                    reasons
                        .iter()
                        .map(|r| r.to_string())
                        .collect::<Vec<_>>()
                        .join("; ")
                ))
            };
            rows.push(Row {
                backend: b.name().to_string(),
                dtype,
                kv,
                outcome,
            });
        }
    }
    println!(
        "{:<8} {:<5} {:<9} {:>10} {:>10} {:>10} {:>16} {:>9}  result",
        "backend", "dtype", "kv_cache", "max_abs", "max_rel", "lse_abs", "tol (atol+rtol)", "ms"
    );
    let mut all_ok = true;
    let mut ran = 0;
    for r in &rows {
        match &r.outcome {
            Ok((o, l, ms)) => {
                ran += 1;
                let ok = o.pass && l.pass;
                all_ok &= ok;
                println!(
                    "{:<8} {:<5} {:<9} {:>10.2e} {:>10.2e} {:>10.2e} {:>7.1e}+{:<7.1e} {:>9.2}  {}",
                    r.backend,
                    r.dtype.as_str(),
                    r.kv.as_str(),
                    o.max_abs,
                    o.max_rel,
                    l.max_abs,
                    o.tol.atol,
                    o.tol.rtol,
                    ms,
                    if ok { "PASS" } else { "FAIL" }
                );
                if !ok {
                    println!("         worst: {o}; lse: {l}");
                }
            }
            Err(e) if e.starts_with("skipped") => {
                println!(
                    "{:<8} {:<5} {:<9} {e}",
                    r.backend,
                    r.dtype.as_str(),
                    r.kv.as_str()
                );
            }
            Err(e) => {
                all_ok = false;
                println!(
                    "{:<8} {:<5} {:<9} ERROR: {e}  FAIL",
                    r.backend,
                    r.dtype.as_str(),
                    r.kv.as_str()
                );
            }
        }
    }
    println!();
    if ran == 0 {
        println!("no configuration ran: nothing was checked");
        return Ok(false);
    }
    println!(
        "{}",
        if all_ok {
            "all within tolerance"
        } else {
            "FAILED: see the rows above"
        }
    );
    Ok(all_ok)
}
