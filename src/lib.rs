//! # polyattn
//!
//! One attention layer for Rust inference engines, with native kernels for every GPU API and
//! the CPU: the Rust counterpart of vLLM's `AttentionBackend` layer (v0.25.1).
//!
//! The layers, top to bottom (see `ARCHITECTURE.md` in the repository):
//!
//! - **model code** holds one [`Attention`] per model layer and calls its `forward`; the
//!   operations around attention (embedding, RMSNorm, linear, RoPE, SiLU·mul, residual add)
//!   run on the same device through [`compute`], and [`runner::ModelRunner`] drives a model
//!   ([`runner::CausalLm`]) with a paged KV cache and continuous batching
//!   (`tools/examples/generate` is a complete Llama);
//! - the **abstraction**: backend descriptors ([`AttentionBackend`]), per-batch metadata
//!   ([`CommonAttentionMetadata`] → [`AttentionMetadataBuilder`]), impls ([`AttentionImpl`],
//!   [`MlaAttentionImpl`]), the [`registry`] and the [`selector`]; [`mla`] holds what an MLA
//!   layer brings besides (its sizes, the weight absorption, the latent cache), run by the
//!   MLA backends `CPU_MLA`, `CUDA_MLA`, `HIP_MLA` and `WGPU_MLA` (`examples/mla.rs`);
//! - the **forward driver** in [`forward`]: every backend's `forward` — checks, cache write,
//!   cascade passes, the decode / prefill split — written once over the kernels a backend
//!   provides ([`forward::ForwardKernels`]);
//! - **backends** in [`backends`], one folder per device family, all of the same shape;
//! - **devices** in [`device`]: [`Device`] and [`Tensor`], and each GPU runtime (compile,
//!   cache, launch: [`device::cuda`], [`device::hip`], [`device::wgpu`]);
//! - the **work plan** in [`plan`]: the work items every GPU kernel runs, planned once for
//!   every GPU backend;
//! - **kernel families** in [`kernels`]: the CUDA C++ and WGSL kernels, their variants,
//!   parameter blocks and knobs, independent of the runtime that runs them;
//! - **across ranks** in [`parallel`]: decode context parallelism (a request's KV cache
//!   sharded over ranks, partial results combined by LSE) and head sharding for tensor
//!   parallelism, on one device or one rank per CUDA device over NCCL;
//! - the f64 [`reference`](mod@reference) every backend is tested against;
//! - [`probe`]: the ceilings and region timer a device reports to a benchmark, which the GPU
//!   backends implement. The tools themselves (`polyattn info / check / bench / fuzz`, the
//!   benchmark harness) are the `polyattn-tools` crate of the repository's workspace.
//!
//! ```
//! use polyattn::*;
//!
//! // Pick a backend for a Llama-style layer (POLYATTN_BACKEND=cpu forces one).
//! let config = SelectorConfig::new(128, DType::F32, CacheDType::Auto);
//! let backend = selector::get_attn_backend(&config)?;
//! println!("running on {}", backend.name());
//! # Ok::<(), polyattn::Error>(())
//! ```

#![warn(missing_docs)]

pub mod attention;
pub mod backend;
pub mod backends;
pub mod capability;
pub mod compute;
pub mod device;
pub mod dtype;
pub mod error;
pub mod forward;
pub mod fp8;
pub mod kernels;
pub mod kv_cache;
pub mod layer;
pub mod metadata;
pub mod mla;
pub mod ops;
pub mod parallel;
pub mod plan;
pub mod probe;
pub mod reference;
pub mod registry;
pub mod rng;
pub mod runner;
pub mod selector;
pub mod testing;

/// The README's code blocks, compiled and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub use attention::{AttentionImpl, AttentionLayer, AttentionParams, MlaAttentionImpl};
pub use backend::{
    AttentionBackend, AttentionType, Availability, BackendCapabilities, BackendRef, BlockSize,
    DeviceCapability, GraphCaptureSupport, HeadSizes, KvLayout, Reason, SelectorConfig,
};
pub use device::{Device, DeviceGraph, DeviceKind, Tensor};
pub use dtype::{CacheDType, DType};
pub use error::{Error, Result};
pub use kv_cache::{BlockPool, KvCache, KvCacheSpec};
pub use layer::Attention;
pub use metadata::{
    AttentionMetadata, AttentionMetadataBuilder, BatchDescription, CommonAttentionMetadata,
    DecodePrefillSplit, PAD_SLOT_ID,
};

#[cfg(test)]
mod layering {
    //! The import graph follows the layers: a module may use only modules of its own rank or
    //! below. The ranks are the crate's layers from the leaf contracts up to the runner (the
    //! tools, `polyattn info / check / bench / fuzz`, are the `polyattn-tools` crate);
    //! `KNOWN` lists the imports that still run upward, each with what would remove it, so a
    //! new upward import fails here. The kernel families (`kernels/`) sit below the runtimes
    //! (`device/`), which sit below everything that plans or runs attention, and a family
    //! also names no runtime crate (`RUNTIME_CRATES`), so one family can serve several
    //! runtimes. Test modules (everything after a file's `#[cfg(test)]`) may use anything.

    use std::path::Path;

    const RANKS: &[(&str, u32)] = &[
        ("capability", 0),
        ("error", 1),
        ("dtype", 2),
        ("fp8", 3),
        ("rng", 3),
        ("plan", 3),
        ("kernels", 4),
        ("device", 5),
        ("metadata", 6),
        ("probe", 6),
        ("kv_cache", 7),
        ("attention", 8),
        ("mla", 8),
        ("forward", 9),
        ("backend", 9),
        ("backends", 10),
        ("registry", 11),
        ("selector", 12),
        ("layer", 13),
        ("compute", 14),
        ("ops", 14),
        ("reference", 14),
        ("parallel", 14),
        ("testing", 15),
        ("runner", 16),
    ];

    /// Crates of a runtime, which no kernel family names: a family is sources and plain
    /// types, compiled and launched by `device/`.
    const RUNTIME_CRATES: &[&str] = &["cudarc", "wgpu", "naga", "libloading"];

    /// (from, to): imports that run upward today.
    const KNOWN: &[(&str, &str, &str)] = &[(
        "reference",
        "testing",
        "the batch-level reference takes a testing::RandomBatch",
    )];

    fn rank(m: &str) -> Option<u32> {
        RANKS.iter().find(|(n, _)| *n == m).map(|&(_, r)| r)
    }

    fn visit(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                visit(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    #[test]
    fn imports_follow_the_layers() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        if !src.is_dir() {
            // A test binary carried to another machine (the GPU host) without the sources.
            eprintln!(
                "SKIP imports_follow_the_layers: no source tree at {}",
                src.display()
            );
            return;
        }
        let mut files = Vec::new();
        visit(&src, &mut files);
        let mut upward = Vec::new();
        let mut seen_known = std::collections::BTreeSet::new();
        for f in &files {
            let rel = f.strip_prefix(&src).unwrap();
            let first = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let module = first.trim_end_matches(".rs").to_string();
            let Some(from) = rank(&module) else { continue };
            let text = std::fs::read_to_string(f).unwrap();
            for (i, line) in text.lines().enumerate() {
                let t = line.trim_start();
                if t.starts_with("#[cfg(test)]") {
                    break;
                }
                if t.starts_with("//") {
                    continue;
                }
                if module == "kernels" {
                    for c in RUNTIME_CRATES {
                        // `wgpu::…` as a path root, not a segment (`crate::x::wgpu::…`).
                        let path = format!("{c}::");
                        let named = t.match_indices(&path).any(|(at, _)| {
                            !t[..at]
                                .chars()
                                .next_back()
                                .is_some_and(|p| p.is_ascii_alphanumeric() || p == '_' || p == ':')
                        });
                        if named {
                            upward.push(format!(
                                "{}:{}: kernels names the runtime crate {c}",
                                rel.display(),
                                i + 1
                            ));
                        }
                    }
                }
                for (at, _) in t.match_indices("crate::") {
                    let name: String = t[at + 7..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit())
                        .collect();
                    let Some(to) = rank(&name) else { continue };
                    if to <= from {
                        continue;
                    }
                    if KNOWN.iter().any(|(a, b, _)| *a == module && *b == name) {
                        seen_known.insert((module.clone(), name));
                        continue;
                    }
                    upward.push(format!("{}:{}: {module} uses {name}", rel.display(), i + 1));
                }
            }
        }
        assert!(
            upward.is_empty(),
            "imports against the layers:\n{}",
            upward.join("\n")
        );
        // A known exception that no longer occurs must leave the table.
        for (a, b, why) in KNOWN {
            assert!(
                seen_known.contains(&(a.to_string(), b.to_string())),
                "{a} -> {b} ({why}) no longer occurs: remove it from KNOWN"
            );
        }
    }
}
