//! Glue between the CUDA backend and `kernels-cuda/`: the embedded sources, NVRTC compilation
//! for the device's own architecture (cached in memory per device and on disk), the
//! parameter blocks the kernels take, and the launches.
//!
//! Sources are embedded with `include_str!`, so binaries run without the source tree. NVRTC
//! compiles each source to a cubin for `sm_XY` of the device (no PTX JIT, so the driver's PTX
//! ISA version never matters). `common.cuh` is pasted in place of `#include "common.cuh"`; no
//! other header is used (NVRTC 13 ships no `cuda_fp16.h`), so no include path is needed.
//!
//! Disk cache: `$POLYATTN_CACHE_DIR`, else `$XDG_CACHE_HOME/polyattn`, else
//! `$HOME/.cache/polyattn`; one file per (source, arch, options, NVRTC version), named by an
//! FNV-1a hash of all four. Best effort: any I/O error just means a recompile.
//!
//! NVRTC (`libnvrtc.so`) is loaded at run time; cudarc panics when it is missing, so
//! [`nvrtc_status`] probes with `is_culib_present()` first and every compile goes through it.

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaModule, DeviceRepr, LaunchConfig, PushKernelArg};

use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// One kernel source file of `kernels-cuda/` and the entry points it defines.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    /// Module name (the file name without `.cu`).
    pub name: &'static str,
    /// The file's text.
    pub source: &'static str,
    /// Its `extern "C"` entry points.
    pub functions: &'static [&'static str],
}

/// `kernels-cuda/common.cuh`, pasted into every source.
pub const COMMON: &str = include_str!("../../../kernels-cuda/common.cuh");

/// `reshape_and_cache.cu`.
pub const RESHAPE_AND_CACHE: KernelSource = KernelSource {
    name: "reshape_and_cache",
    source: include_str!("../../../kernels-cuda/reshape_and_cache.cu"),
    functions: &["reshape_and_cache"],
};

/// `paged_attention.cu`.
pub const PAGED_ATTENTION: KernelSource = KernelSource {
    name: "paged_attention",
    source: include_str!("../../../kernels-cuda/paged_attention.cu"),
    functions: &[
        "paged_attention_dpl1",
        "paged_attention_dpl2",
        "paged_attention_dpl3",
        "paged_attention_dpl4",
        "paged_attention_dpl5",
        "paged_attention_dpl6",
        "paged_attention_dpl7",
        "paged_attention_dpl8",
        "combine_splits",
    ],
};

/// `paged_attention_mma.cu` (tensor cores; f16 / bf16, head sizes 64, 96, 128).
pub const PAGED_ATTENTION_MMA: KernelSource = KernelSource {
    name: "paged_attention_mma",
    source: include_str!("../../../kernels-cuda/paged_attention_mma.cu"),
    functions: &[
        "paged_attention_mma_f16_d64",
        "paged_attention_mma_f16_d96",
        "paged_attention_mma_f16_d128",
        "paged_attention_mma_bf16_d64",
        "paged_attention_mma_bf16_d96",
        "paged_attention_mma_bf16_d128",
    ],
};

/// `paged_decode.cu` (split-KV decode on tensor cores; f16 / bf16 with a same-dtype, E4M3 or
/// E5M2 cache, head sizes 64, 96, 128).
pub const PAGED_DECODE: KernelSource = KernelSource {
    name: "paged_decode",
    source: include_str!("../../../kernels-cuda/paged_decode.cu"),
    functions: &[
        "paged_decode_f16_d64",
        "paged_decode_f16_d96",
        "paged_decode_f16_d128",
        "paged_decode_f16_e4m3_d64",
        "paged_decode_f16_e4m3_d96",
        "paged_decode_f16_e4m3_d128",
        "paged_decode_f16_e5m2_d64",
        "paged_decode_f16_e5m2_d96",
        "paged_decode_f16_e5m2_d128",
        "paged_decode_bf16_d64",
        "paged_decode_bf16_d96",
        "paged_decode_bf16_d128",
        "paged_decode_bf16_e4m3_d64",
        "paged_decode_bf16_e4m3_d96",
        "paged_decode_bf16_e4m3_d128",
        "paged_decode_bf16_e5m2_d64",
        "paged_decode_bf16_e5m2_d96",
        "paged_decode_bf16_e5m2_d128",
    ],
};

/// `merge_states.cu`.
pub const MERGE_STATES: KernelSource = KernelSource {
    name: "merge_states",
    source: include_str!("../../../kernels-cuda/merge_states.cu"),
    functions: &["merge_attn_states", "merge_attn_states_vec"],
};

/// `probes.cu` (the benchmark's f32 FMA ceiling).
pub const PROBES: KernelSource = KernelSource {
    name: "probes",
    source: include_str!("../../../kernels-cuda/probes.cu"),
    functions: &["fma_probe"],
};

/// Every kernel source, for compile checks.
pub const ALL_SOURCES: [KernelSource; 7] = [
    RESHAPE_AND_CACHE,
    PAGED_ATTENTION,
    PAGED_ATTENTION_MMA,
    PAGED_DECODE,
    MERGE_STATES,
    PROBES,
    crate::compute::CUDA_MODEL_OPS,
];

/// The source as NVRTC compiles it: `common.cuh` pasted in place of its include line.
pub fn full_source(k: &KernelSource) -> String {
    k.source.replace("#include \"common.cuh\"", COMMON)
}

/// The element-type code of `dtype` as the kernels read it (`PA_F32` ... in `common.cuh`);
/// `None` for integer dtypes.
pub fn dtype_code(dtype: DType) -> Option<i32> {
    Some(match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::Bf16 => 2,
        DType::Fp8E4m3 => 3,
        DType::Fp8E5m2 => 4,
        DType::I32 | DType::I64 => return None,
    })
}

pub(crate) fn code(dtype: DType) -> Result<i32> {
    dtype_code(dtype).ok_or_else(|| Error::DType {
        what: "cuda kernel operand",
        got: dtype.to_string(),
        expected: "f32, f16, bf16, fp8_e4m3 or fp8_e5m2".into(),
    })
}

fn nvrtc_error(message: impl Into<String>) -> Error {
    Error::Device {
        backend: "cuda".into(),
        message: message.into(),
    }
}

/// Whether NVRTC can be loaded here (probed once; never panics). `Ok((major, minor))` is its
/// version; `Err` says why not.
pub fn nvrtc_status() -> std::result::Result<(i32, i32), String> {
    static STATUS: OnceLock<std::result::Result<(i32, i32), String>> = OnceLock::new();
    STATUS
        .get_or_init(|| {
            // SAFETY: only tries to dlopen the library names; no symbol is called.
            if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                return Err(
                    "libnvrtc.so not found (install the CUDA toolkit's NVRTC, e.g. \
                            the nvidia-cuda-nvrtc wheel, and put its lib folder on \
                            LD_LIBRARY_PATH before the process starts)"
                        .into(),
                );
            }
            std::panic::catch_unwind(|| {
                let (mut major, mut minor) = (0, 0);
                // SAFETY: the library is present; out-pointers to locals.
                let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
                if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
                    return Err(format!("nvrtcVersion failed: {r:?}"));
                }
                Ok((major, minor))
            })
            .unwrap_or_else(|_| Err("libnvrtc.so could not be used".into()))
        })
        .clone()
}

/// `--gpu-architecture` value for a compute capability: `sm_90` for `(9, 0)`.
pub fn arch_for(capability: (u32, u32)) -> String {
    format!("sm_{}{}", capability.0, capability.1)
}

/// The options every compile uses, for `arch` (`sm_90`).
pub fn base_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "--generate-line-info".into(),
    ]
}

/// What one NVRTC compile produced.
#[derive(Clone, Debug)]
pub struct CompileOutput {
    /// The cubin (for `sm_XY` targets) or PTX (for `compute_XY` targets).
    pub image: Vec<u8>,
    /// NVRTC's program log (warnings; with `--ptxas-options=-v`, the ptxas report).
    pub log: String,
}

fn log_of(prog: cudarc::nvrtc::sys::nvrtcProgram) -> String {
    // SAFETY: `prog` is a live program.
    match unsafe { cudarc::nvrtc::result::get_program_log(prog) } {
        Ok(chars) => {
            let bytes: Vec<u8> = chars
                .iter()
                .map(|&c| c as u8)
                .take_while(|&b| b != 0)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        Err(e) => format!("(no log: {e:?})"),
    }
}

/// Compiles `k` with NVRTC for `arch` (`sm_80`, `sm_90`, ...; a `compute_XY` target yields
/// PTX), with `extra` options after the base ones. Errors carry NVRTC's log.
pub fn compile(k: &KernelSource, arch: &str, extra: &[&str]) -> Result<CompileOutput> {
    nvrtc_status().map_err(nvrtc_error)?;
    let src = CString::new(full_source(k))
        .map_err(|_| nvrtc_error(format!("{}: source contains a NUL byte", k.name)))?;
    let name = CString::new(format!("{}.cu", k.name))
        .map_err(|_| nvrtc_error("kernel name contains a NUL byte"))?;
    let mut options = base_options(arch);
    options.extend(extra.iter().map(|s| s.to_string()));
    let prog = cudarc::nvrtc::result::create_program(&src, Some(&name))
        .map_err(|e| nvrtc_error(format!("nvrtcCreateProgram({}): {e:?}", k.name)))?;
    let result = (|| {
        // SAFETY: `prog` was just created and is destroyed below, after its last use.
        let compiled = unsafe { cudarc::nvrtc::result::compile_program(prog, &options) };
        let log = log_of(prog);
        if let Err(e) = compiled {
            return Err(nvrtc_error(format!(
                "NVRTC failed to compile {} for {arch} ({e:?}); options {options:?}; log:\n{log}",
                k.name
            )));
        }
        let cubin = arch.starts_with("sm_");
        let mut size = 0usize;
        // SAFETY: out-pointer to a local; `prog` compiled successfully.
        let r = unsafe {
            if cubin {
                cudarc::nvrtc::sys::nvrtcGetCUBINSize(prog, &mut size)
            } else {
                cudarc::nvrtc::sys::nvrtcGetPTXSize(prog, &mut size)
            }
        };
        if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(nvrtc_error(format!(
                "{}: getting the image size: {r:?}",
                k.name
            )));
        }
        let mut image = vec![0u8; size];
        // SAFETY: `image` has the size NVRTC reported.
        let r = unsafe {
            if cubin {
                cudarc::nvrtc::sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast())
            } else {
                cudarc::nvrtc::sys::nvrtcGetPTX(prog, image.as_mut_ptr().cast())
            }
        };
        if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(nvrtc_error(format!("{}: getting the image: {r:?}", k.name)));
        }
        Ok(CompileOutput { image, log })
    })();
    // SAFETY: created above, not used after this.
    let _ = unsafe { cudarc::nvrtc::result::destroy_program(prog) };
    result
}

/// One function's line of a ptxas `-v` report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PtxasReport {
    /// Entry point.
    pub function: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of stack frame.
    pub stack_bytes: u32,
    /// Bytes spilled to local memory (stores).
    pub spill_stores: u32,
    /// Bytes reloaded from spills.
    pub spill_loads: u32,
}

fn number_before(line: &str, unit: &str) -> Option<u32> {
    let at = line.find(unit)?;
    line[..at].split_whitespace().last()?.parse().ok()
}

/// Parses the ptxas `-v` lines of an NVRTC log into one report per function.
pub fn parse_ptxas_report(log: &str) -> Vec<PtxasReport> {
    let mut out: Vec<PtxasReport> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            out.push(PtxasReport {
                function: rest.trim().to_string(),
                ..Default::default()
            });
        } else if let Some(r) = out.last_mut() {
            if line.contains("bytes spill stores") {
                r.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
                r.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                r.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            } else if line.contains("Used") && line.contains("registers") {
                r.registers = number_before(line, "registers").unwrap_or(0);
            }
        }
    }
    out
}

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("POLYATTN_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("polyattn"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("polyattn"))
}

/// Compiles `k` for `arch` with `defines` (`-DNAME=VALUE` options selecting a variant),
/// through the on-disk cache.
fn compile_cached(k: &KernelSource, arch: &str, defines: &[&str]) -> Result<Vec<u8>> {
    let (major, minor) = nvrtc_status().map_err(nvrtc_error)?;
    let src = full_source(k);
    let mut options = base_options(arch);
    options.extend(defines.iter().map(|d| d.to_string()));
    let options = options.join(" ");
    let version = format!("nvrtc {major}.{minor}");
    let hash = fnv1a(&[
        src.as_bytes(),
        arch.as_bytes(),
        options.as_bytes(),
        version.as_bytes(),
    ]);
    let path = cache_dir().map(|d| d.join(format!("{}-{arch}-{hash:016x}.cubin", k.name)));
    if let Some(p) = &path {
        if let Ok(bytes) = std::fs::read(p) {
            // A cubin is an ELF file; anything else (a truncated write) is recompiled.
            if bytes.len() > 64 && bytes.starts_with(b"\x7fELF") {
                return Ok(bytes);
            }
        }
    }
    let out = compile(k, arch, defines)?;
    if let Some(p) = &path {
        if let Some(dir) = p.parent() {
            if std::fs::create_dir_all(dir).is_ok() {
                let tmp = p.with_extension(format!("tmp{}", std::process::id()));
                if std::fs::write(&tmp, &out.image).is_ok() && std::fs::rename(&tmp, p).is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
            }
        }
    }
    Ok(out.image)
}

/// The module of `k` (the variant selected by `defines`) on `device`, compiled for the
/// device's architecture on first use.
pub(crate) fn module(
    device: &CudaDevice,
    k: &KernelSource,
    defines: &[&str],
) -> Result<Arc<CudaModule>> {
    let arch = arch_for(device.compute_capability());
    let key = format!("{}:{arch}:{}", k.name, defines.join(" "));
    device.module(&key, || compile_cached(k, &arch, defines))
}

/// Entry point `name` of `k`'s variant `defines` on `device`.
pub(crate) fn function(
    device: &CudaDevice,
    k: &KernelSource,
    defines: &[&str],
    name: &str,
) -> Result<CudaFunction> {
    module(device, k, defines)?
        .load_function(name)
        .map_err(|e| nvrtc_error(format!("{}: no function {name}: {e}", k.name)))
}

/// The `-D` option that builds only the attention bucket of `head_size`
/// (`PA_ONLY_DPL`, see paged_attention.cu).
pub fn attention_variant(head_size: usize) -> String {
    format!("-DPA_ONLY_DPL={}", head_size.div_ceil(32))
}

/// The `-D` options that build only the tensor-core variant for `dtype`, `head_size`,
/// `shape` (`PA_MMA_MT` = rows / (16 warps) m16 tiles per warp, `PA_MMA_WARPS`) and the
/// layer's modifiers (`PA_MMA_PLAIN`: `plain` = no soft cap and no ALiBi; the plain build
/// has its own register allocation, which fits 64-key softmax steps at two m-tiles); see
/// paged_attention_mma.cu.
pub fn mma_variant(dtype: DType, head_size: usize, shape: MmaShape, plain: bool) -> [String; 5] {
    [
        format!("-DPA_MMA_D={head_size}"),
        format!("-DPA_MMA_BF16={}", i32::from(dtype == DType::Bf16)),
        format!("-DPA_MMA_MT={}", shape.tiles_per_warp()),
        format!("-DPA_MMA_WARPS={}", shape.warps),
        format!("-DPA_MMA_PLAIN={}", i32::from(plain)),
    ]
}

/// The decode kernel's code for a cache dtype (`PD_KV`): 0 for a cache of the activation
/// dtype, 1 for E4M3, 2 for E5M2.
fn decode_kv_code(cache_dtype: DType) -> u32 {
    match cache_dtype {
        DType::Fp8E4m3 => 1,
        DType::Fp8E5m2 => 2,
        _ => 0,
    }
}

/// The `-D` options that build only the decode variant for `dtype`, `cache_dtype` and
/// `head_size` (see paged_decode.cu).
pub fn decode_variant(dtype: DType, cache_dtype: DType, head_size: usize) -> [String; 3] {
    [
        format!("-DPD_D={head_size}"),
        format!("-DPD_BF16={}", i32::from(dtype == DType::Bf16)),
        format!("-DPD_KV={}", decode_kv_code(cache_dtype)),
    ]
}

/// Launches `f` on the device's stream with one by-value parameter block (and optionally a
/// second pointer argument), raising the dynamic shared-memory limit first when needed.
pub(crate) fn launch<P: DeviceRepr>(
    device: &CudaDevice,
    f: &CudaFunction,
    cfg: LaunchConfig,
    params: &P,
    extra_ptr: Option<u64>,
) -> Result<()> {
    if cfg.grid_dim.0 == 0 || cfg.grid_dim.1 == 0 || cfg.grid_dim.2 == 0 {
        return Ok(());
    }
    // The driver's grid limits (x < 2^31, y and z ≤ 65535, 1024 threads a block): a grid
    // past them is a typed error here, not a launch failure that names no size.
    let (gx, gy, gz) = cfg.grid_dim;
    let (bx, by, bz) = cfg.block_dim;
    if gx > i32::MAX as u32 || gy > 65535 || gz > 65535 || bx * by * bz > 1024 {
        return Err(Error::config(format!(
            "a CUDA launch of grid {:?} × block {:?} exceeds the device's limits (grid x < 2^31, \
             y and z ≤ 65535, 1024 threads a block): the batch is too large for one launch",
            cfg.grid_dim, cfg.block_dim
        )));
    }
    if cfg.shared_mem_bytes > 48 * 1024 {
        if cfg.shared_mem_bytes > device.max_shared_memory_per_block() {
            return Err(nvrtc_error(format!(
                "kernel needs {} bytes of shared memory; the device allows {}",
                cfg.shared_mem_bytes,
                device.max_shared_memory_per_block()
            )));
        }
        // SAFETY: `f` is a live function of this device's context.
        unsafe {
            cudarc::driver::result::function::set_function_attribute(
                f.cu_function(),
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                cfg.shared_mem_bytes as i32,
            )
        }
        .map_err(|e| nvrtc_error(format!("raising the shared-memory limit: {e}")))?;
    }
    device.check_healthy()?;
    let stream = device.stream();
    let mut b = stream.launch_builder(f);
    b.arg(params);
    if let Some(p) = extra_ptr.as_ref() {
        b.arg(p);
    }
    // SAFETY: the parameter blocks mirror the kernels' structs (sizes asserted on both
    // sides); every pointer in them belongs to a live buffer of this device sized as the
    // kernel's header requires (checked by the impl before the launch); work is stream-ordered.
    unsafe { b.launch(cfg) }
        .map(|_| ())
        .map_err(|e| device.driver_error("kernel launch", e))
}

/// `ReshapeParams` of `reshape_and_cache.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ReshapeParams {
    /// `[T][Hkv][D]` keys.
    pub key: u64,
    /// `[T][Hkv][D]` values.
    pub value: u64,
    /// The cache buffer.
    pub cache: u64,
    /// `[T]` i64 slots.
    pub slot_mapping: u64,
    /// Activation dtype code.
    pub in_dtype: i32,
    /// Cache storage dtype code.
    pub cache_dtype: i32,
    /// 1 for HND.
    pub layout_hnd: i32,
    /// Tokens (slot-mapping length).
    pub num_tokens: i32,
    /// KV heads.
    pub num_kv_heads: i32,
    /// Head size.
    pub head_size: i32,
    /// Tokens per block.
    pub block_size: i32,
    /// Key scale (1.0 unless fp8).
    pub k_scale: f32,
    /// Value scale.
    pub v_scale: f32,
    /// Padding.
    pub pad_: i32,
}

/// `MergeParams` of `merge_states.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MergeParams {
    /// Prefix outputs.
    pub o_p: u64,
    /// Suffix outputs.
    pub o_s: u64,
    /// Prefix LSEs.
    pub lse_p: u64,
    /// Suffix LSEs.
    pub lse_s: u64,
    /// Output.
    pub out: u64,
    /// Output LSEs (0: none).
    pub out_lse: u64,
    /// Input dtype code.
    pub in_dtype: i32,
    /// Output dtype code.
    pub out_dtype: i32,
    /// Tokens.
    pub num_tokens: i32,
    /// Heads.
    pub num_heads: i32,
    /// Head size.
    pub head_size: i32,
    /// Tokens at or after this copy the suffix.
    pub prefill_tokens: i32,
}

/// The work item the attention kernels read (`WorkItem` in `common.cuh`).
pub use crate::plan::WorkItem;

/// `AttnParams` of `paged_attention.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AttnParams {
    /// Queries.
    pub q: u64,
    /// Paged cache.
    pub cache: u64,
    /// Dense keys (encoder).
    pub k_dense: u64,
    /// Dense values (encoder).
    pub v_dense: u64,
    /// Block table.
    pub block_table: u64,
    /// Sequence lengths.
    pub seq_lens: u64,
    /// Query start offsets.
    pub query_start_loc: u64,
    /// Work items.
    pub items: u64,
    /// ALiBi slopes (0: none).
    pub alibi: u64,
    /// Sinks (0: none).
    pub sinks: u64,
    /// Output.
    pub out: u64,
    /// LSE output (0: none).
    pub lse: u64,
    /// Split partial outputs.
    pub part_out: u64,
    /// Split partial LSEs.
    pub part_lse: u64,
    /// `[n_part_tokens][num_heads]` i32 arrival counters of the decode kernel's fused split
    /// combine, zero between launches.
    pub split_counters: u64,
    /// Query dtype code.
    pub q_dtype: i32,
    /// Cache dtype code.
    pub cache_dtype: i32,
    /// Output dtype code.
    pub out_dtype: i32,
    /// 1: dense K/V.
    pub dense: i32,
    /// 1: HND cache.
    pub layout_hnd: i32,
    /// Query heads.
    pub num_heads: i32,
    /// KV heads.
    pub num_kv_heads: i32,
    /// Head size.
    pub head_size: i32,
    /// Query heads per KV head.
    pub group: i32,
    /// Tokens per block.
    pub block_size: i32,
    /// Block-table row width.
    pub bt_stride: i32,
    /// Tokens of the batch (LSE row stride).
    pub num_tokens: i32,
    /// Tokens in the split partial buffers.
    pub n_part_tokens: i32,
    /// Causal mask.
    pub causal: i32,
    /// Sliding window (0: none).
    pub window: i32,
    /// Apply sinks.
    pub use_sinks: i32,
    /// Logit scale.
    pub scale: f32,
    /// Soft cap (0: off).
    pub soft_cap: f32,
    /// Key dequantisation scale.
    pub k_scale: f32,
    /// Value dequantisation scale.
    pub v_scale: f32,
}

const _: () = assert!(std::mem::size_of::<ReshapeParams>() == 72);
const _: () = assert!(std::mem::size_of::<MergeParams>() == 72);
const _: () = assert!(std::mem::size_of::<AttnParams>() == 200);

// SAFETY: plain `repr(C)` structs of integers and floats whose layouts match the kernels'
// structs (sizes asserted above and by `static_assert` in the .cu files).
unsafe impl DeviceRepr for ReshapeParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for MergeParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for AttnParams {}

/// Rows (query token × head pairs) of one attention work item; `paged_attention.cu`'s
/// `PA_ROWS`.
pub const ROWS_PER_ITEM: usize = 16;
/// Keys per chunk (`PA_KC`).
pub const KEYS_PER_CHUNK: usize = 16;
/// Threads per attention CTA.
pub const ATTN_THREADS: u32 = 128;

/// Dynamic shared memory of the attention kernel for `head_size`.
pub fn attention_smem_bytes(head_size: usize) -> u32 {
    let d = head_size;
    ((ROWS_PER_ITEM * d + KEYS_PER_CHUNK * (d + 2) + KEYS_PER_CHUNK * d) * 4) as u32
}

/// The CTA shape of the tensor-core prefill kernel: query rows per CTA (and per work item)
/// and warps per CTA. Every warp owns `rows / (16 warps)` m16 tiles (1 or 2) and every warp
/// reads each K/V tile of the CTA, so more rows per CTA means less K/V traffic per FLOP, and
/// two tiles per warp means less shared-memory traffic per FLOP (at more registers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmaShape {
    /// Query rows per CTA (`MMA_ROWS`).
    pub rows: usize,
    /// Warps per CTA (`MMA_WARPS`).
    pub warps: usize,
}

impl MmaShape {
    /// m16 tiles per warp (`PA_MMA_MT`).
    pub fn tiles_per_warp(self) -> usize {
        self.rows / (16 * self.warps)
    }

    /// Threads per CTA.
    pub fn threads(self) -> u32 {
        (self.warps * 32) as u32
    }
}

/// The CTA shapes the tensor-core kernel can be built for: 64 rows on 4 warps (one m16 tile
/// each), 128 rows on 4 warps (two each) or on 8 warps (one each), 256 rows on 8 warps.
pub const MMA_SHAPES: [MmaShape; 4] = [
    MmaShape { rows: 64, warps: 4 },
    MmaShape {
        rows: 128,
        warps: 4,
    },
    MmaShape {
        rows: 128,
        warps: 8,
    },
    MmaShape {
        rows: 256,
        warps: 8,
    },
];

/// Dynamic shared memory of the tensor-core kernel built for `rows` query rows: the Q tile
/// and two K and two V tiles (double-buffered, 64 keys each), rows of `head_size + 8` 16-bit
/// elements. (Its 1 KiB table of key-row addresses is static shared memory.)
pub fn mma_smem_bytes(head_size: usize, rows: usize) -> u32 {
    ((rows + 4 * 64) * (head_size + 8) * 2) as u32
}

/// The tensor-core entry point for `dtype` (f16 / bf16) and `head_size` (64, 96, 128).
pub fn mma_function_name(dtype: DType, head_size: usize) -> Option<&'static str> {
    let t = match dtype {
        DType::F16 => "f16",
        DType::Bf16 => "bf16",
        _ => return None,
    };
    let want = format!("paged_attention_mma_{t}_d{head_size}");
    PAGED_ATTENTION_MMA
        .functions
        .iter()
        .find(|f| **f == want)
        .copied()
}

/// Query heads per work item of the decode kernel (the m16 rows of its mma tiles).
pub const DECODE_ROWS_PER_ITEM: usize = 16;
/// Threads per decode CTA (`DEC_WARPS` warps).
pub const DECODE_THREADS: u32 = 128;
/// Ring stages per warp of the decode kernel (`DEC_STAGES`).
pub const DECODE_STAGES: usize = 3;
/// Keys per chunk of the decode kernel (`DEC_KEYS`).
pub const DECODE_KEYS_PER_CHUNK: usize = 16;

/// Dynamic shared memory of the decode kernel: Q `[16][D+8]` and, per warp, `DECODE_STAGES`
/// stages of K and V `[16][D+8]`, 16-bit elements; for an fp8 `cache_dtype`, per warp
/// `DECODE_STAGES` stages of raw K and V `[16][D+16]` bytes and one converted K and V
/// `[16][D+8]` tile.
pub fn decode_smem_bytes(head_size: usize, cache_dtype: DType) -> u32 {
    let row = (head_size + 8) * 2;
    let warps = DECODE_THREADS as usize / 32;
    let tile = DECODE_KEYS_PER_CHUNK * row;
    let per_warp = if cache_dtype.is_fp8() {
        DECODE_STAGES * 2 * DECODE_KEYS_PER_CHUNK * (head_size + 16) + 2 * tile
    } else {
        DECODE_STAGES * 2 * tile
    };
    (16 * row + warps * per_warp) as u32
}

/// The decode entry point for `dtype` (f16 / bf16), `cache_dtype` (`dtype`, E4M3 or E5M2)
/// and `head_size` (64, 96, 128).
pub fn decode_function_name(
    dtype: DType,
    cache_dtype: DType,
    head_size: usize,
) -> Option<&'static str> {
    let t = match dtype {
        DType::F16 => "f16",
        DType::Bf16 => "bf16",
        _ => return None,
    };
    let kv = match cache_dtype {
        c if c == dtype => "",
        DType::Fp8E4m3 => "_e4m3",
        DType::Fp8E5m2 => "_e5m2",
        _ => return None,
    };
    let want = format!("paged_decode_{t}{kv}_d{head_size}");
    PAGED_DECODE.functions.iter().find(|f| **f == want).copied()
}

/// The attention entry point for `head_size` (`paged_attention_dpl{ceil(D/32)}`).
pub fn attention_function_name(head_size: usize) -> Option<&'static str> {
    let dpl = head_size.div_ceil(32);
    PAGED_ATTENTION
        .functions
        .get(dpl.checked_sub(1)?)
        .copied()
        .filter(|n| n.starts_with("paged_attention_dpl"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device's fp8 encoder (`pa_f32_to_fp8` in common.cuh), step for step in f32, must
    /// agree with src/fp8.rs; this checks the algorithm (the H200 run checks the CUDA code).
    fn device_fp8(x: f32, mant: i32, bias: i32, maxv: f32) -> u8 {
        let u = x.to_bits();
        if (u & 0x7fff_ffff) > 0x7f80_0000 {
            return 0x7f;
        }
        let sign = ((u >> 24) & 0x80) as u8;
        let a = f32::from_bits(u & 0x7fff_ffff).min(maxv);
        let e = ((a.to_bits() >> 23) & 0xff) as i32 - 127;
        let min_normal = 1 - bias;
        let code = if e < min_normal {
            (a * 2f32.powi(mant - min_normal)).round_ties_even() as u32
        } else {
            let steps = (a * 2f32.powi(mant - e)).round_ties_even() as u32;
            (((e + bias) as u32) << mant) + steps - (1u32 << mant)
        };
        sign | code as u8
    }

    #[test]
    fn device_fp8_encoder_matches_the_host_one() {
        use crate::fp8::{encode_e4m3, encode_e5m2, E4M3_TABLE, E5M2_TABLE};
        let mut xs: Vec<f32> = (0..1u32 << 20)
            .map(|i| f32::from_bits(i << 12 | 0x5a5))
            .collect();
        // Exact midpoints between neighbouring codes and their f32 neighbours (the ties).
        for t in [&E4M3_TABLE, &E5M2_TABLE] {
            for w in t.windows(2) {
                if w[0].is_finite() && w[1].is_finite() {
                    let m = (w[0] + w[1]) / 2.0;
                    xs.extend([
                        m,
                        f32::from_bits(m.to_bits() + 1),
                        f32::from_bits(m.to_bits().wrapping_sub(1)),
                    ]);
                    xs.extend([w[0], w[1], -m]);
                }
            }
        }
        xs.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            448.0,
            464.0,
            480.0,
            57344.0,
            61440.0,
            1e-45,
        ]);
        for x in xs {
            assert_eq!(
                device_fp8(x, 3, 7, 448.0),
                encode_e4m3(x),
                "e4m3 {x:e} ({:#x})",
                x.to_bits()
            );
            assert_eq!(
                device_fp8(x, 2, 15, 57344.0),
                encode_e5m2(x),
                "e5m2 {x:e} ({:#x})",
                x.to_bits()
            );
        }
    }

    /// `pa_f32_to_bf16` in common.cuh against the `half` crate the host uses.
    #[test]
    fn device_bf16_rounding_matches_half() {
        let dev = |f: f32| -> u16 {
            let u = f.to_bits();
            if (u & 0x7fff_ffff) > 0x7f80_0000 {
                return ((u >> 16) | 0x40) as u16;
            }
            (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
        };
        for i in 0..1u32 << 20 {
            for low in [0u32, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1_8000] {
                let f = f32::from_bits((i << 12) ^ low);
                assert_eq!(
                    dev(f),
                    half::bf16::from_f32(f).to_bits(),
                    "{:#x}",
                    f.to_bits()
                );
            }
        }
    }

    #[test]
    fn ptxas_report_parses() {
        let log = "ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
                   ptxas info    : Function properties for k\n\
                   \x20   8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n\
                   ptxas info    : Used 40 registers, used 1 barriers, 560 bytes cmem[0]\n";
        let r = parse_ptxas_report(log);
        assert_eq!(
            r,
            vec![PtxasReport {
                function: "k".into(),
                registers: 40,
                stack_bytes: 8,
                spill_stores: 4,
                spill_loads: 4
            }]
        );
    }

    #[test]
    fn sources_paste_the_header() {
        for k in ALL_SOURCES {
            let s = full_source(&k);
            assert!(
                !s.lines().any(|l| l.trim_start().starts_with("#include")),
                "{}",
                k.name
            );
            assert!(s.contains("POLYATTN_COMMON_CUH"));
        }
        assert_eq!(attention_function_name(128), Some("paged_attention_dpl4"));
        assert_eq!(attention_function_name(256), Some("paged_attention_dpl8"));
        assert_eq!(attention_function_name(264), None);
        assert_eq!(
            attention_smem_bytes(256),
            (16 * 256 + 16 * 258 + 16 * 256) * 4
        );
        // Q [16][136] + 4 warps x 3 stages x (K + V) [16][136], 2 bytes each.
        assert_eq!(
            decode_smem_bytes(128, DType::Bf16),
            16 * 136 * 2 + 4 * 3 * 2 * 16 * 136 * 2
        );
        // fp8: Q, then 4 warps x (3 stages x raw K + V [16][144] bytes + K, V [16][136] x 2).
        assert_eq!(
            decode_smem_bytes(128, DType::Fp8E4m3),
            16 * 136 * 2 + 4 * (3 * 2 * 16 * 144 + 2 * 16 * 136 * 2)
        );
        assert_eq!(
            decode_function_name(DType::Bf16, DType::Bf16, 128),
            Some("paged_decode_bf16_d128")
        );
        assert_eq!(
            decode_function_name(DType::F16, DType::Fp8E5m2, 96),
            Some("paged_decode_f16_e5m2_d96")
        );
        assert_eq!(
            decode_variant(DType::Bf16, DType::Fp8E4m3, 64),
            ["-DPD_D=64", "-DPD_BF16=1", "-DPD_KV=1"]
        );
        assert_eq!(decode_function_name(DType::F16, DType::Bf16, 128), None);
        assert_eq!(decode_function_name(DType::F32, DType::F32, 128), None);
        assert_eq!(decode_function_name(DType::F16, DType::F16, 256), None);
    }
}
