//! `polyattn info`: every backend, available or why not, and the selection for a
//! configuration with the reasons of every backend that was passed over.

use clap::Args;
use polyattn::registry;
use polyattn::selector::{self, BACKEND_ENV};
use polyattn::{Availability, Result};

use super::config::ConfigArgs;

/// Arguments of `polyattn info`.
#[derive(Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    config: ConfigArgs,
}

/// Device families the selector ranks but this build has no backend for yet.
const NOT_YET_BUILT: [(&str, u32); 3] = [("CUDA", 100), ("VULKAN", 300), ("WGPU", 400)];

/// Prints the report; returns false when no backend can be selected.
pub fn run(args: &InfoArgs) -> Result<bool> {
    let reg = registry::global();
    let config = args.config.selector_config();
    println!("polyattn {}", env!("CARGO_PKG_VERSION"));
    println!();
    println!("Backends (ranked; lower runs first):");
    for c in reg.explain(&config) {
        let status = match &c.availability {
            Availability::Available(dev) => format!("available  {dev}"),
            Availability::Unavailable(why) => format!("unavailable: {why}"),
        };
        println!("  {:>5}  {:<8} {status}", c.priority, c.name);
    }
    let built: Vec<String> = reg.names();
    let missing: Vec<String> = NOT_YET_BUILT
        .iter()
        .filter(|(n, _)| !built.iter().any(|b| b.eq_ignore_ascii_case(n)))
        .map(|(n, p)| format!("{n} ({p})"))
        .collect();
    if !missing.is_empty() {
        println!("  not in this build yet: {}", missing.join(", "));
    }
    // The native Vulkan runtime exists without its backend: say what it would open.
    if missing.iter().any(|m| m.starts_with("VULKAN")) {
        let status = match polyattn::device::vulkan::VulkanDevice::open(Default::default()) {
            Ok(d) => format!("opens {}", d.name()),
            Err(e) => e.to_string(),
        };
        println!("  native Vulkan runtime (no backend yet): {status}");
    }
    // Collectives between GPUs (decode context parallelism across devices).
    let nccl = match polyattn::device::cuda::nccl_status() {
        Ok(v) => format!("available (version code {v})"),
        Err(why) => format!("unavailable: {why}"),
    };
    println!("  NCCL (DCP across CUDA devices): {nccl}");
    println!();
    println!("Configuration: {config}");
    for c in reg.explain(&config) {
        if c.is_usable() {
            println!("  {:<8} valid", c.name);
        } else {
            let mut why: Vec<String> = c.reasons.iter().map(|r| r.to_string()).collect();
            if let Availability::Unavailable(u) = &c.availability {
                why.insert(0, format!("unavailable: {u}"));
            }
            println!("  {:<8} rejected: {}", c.name, why.join("; "));
        }
    }
    println!();
    let forced = selector::forced_backend_from_env();
    match selector::get_attn_backend(&config) {
        Ok(b) => {
            let why = match &forced {
                Some(f) => format!("forced by {BACKEND_ENV}={f}"),
                None => "the best-ranked backend that is available and valid".to_string(),
            };
            println!("Selected: {} ({why})", b.name());
            if b.name() == "CUDA" {
                print_cuda_prefill(&config);
            }
            Ok(true)
        }
        Err(e) => {
            println!("Selected: none");
            eprintln!("error: {e}");
            Ok(false)
        }
    }
}

/// The CUDA backend's prefill kernel for `config` on the device it opens, with the rule that
/// picked it (the fallback from the Hopper kernel to `mma.sync` and to CUDA cores).
fn print_cuda_prefill(config: &polyattn::SelectorConfig) {
    use polyattn::backends::cuda::{prefill_choice, CudaKernel, CudaTuning};
    let tuning = CudaTuning::get();
    let dev = match polyattn::device::cuda::CudaDevice::new(tuning.device) {
        Ok(d) => d,
        Err(e) => return println!("  prefill kernel: unknown ({e})"),
    };
    let cache = config.kv_cache_dtype.storage_dtype(config.dtype);
    let c = prefill_choice(
        dev.compute_capability(),
        config.dtype,
        cache,
        config.head_size,
        tuning,
    );
    let kernel = match c.kernel {
        Some(
            CudaKernel::Wgmma(name) | CudaKernel::Mma(name) | CudaKernel::AmdMatrixEmulated(name),
        ) => name.to_string(),
        Some(other) => format!("{other:?}"),
        None => "paged_attention (CUDA cores)".to_string(),
    };
    let (major, minor) = dev.compute_capability();
    println!(
        "  prefill kernel on compute capability {major}.{minor}: {kernel}; {}",
        c.rule
    );
}
