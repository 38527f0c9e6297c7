//! What every runtime of the WGSL family offers the family's users, as one trait
//! ([`WgslRuntime`]): the wgpu runtime ([`super::wgpu`]) and the native Vulkan runtime
//! ([`super::vulkan`]) both implement it, so the backends and model ops written over it run
//! the same kernels, parameter blocks and dispatch order on either.
//!
//! The contract is the WGSL family's binding model: every kernel declares a uniform block of
//! at most [`PARAM_WORDS`] u32 words at binding 0 and storage buffers at the bindings its
//! [`Bindings`] set lists. A caller keeps a [`WgslRuntime::Params`] block of parameter slots
//! per object that dispatches (one per attention layer), fills slots with [`Words`], and
//! submits [`Dispatch`]es that name their slot, their storage buffers and their workgroups;
//! the runtime binds the slot at binding 0 and runs the dispatches in order, each one's
//! writes visible to the next.
//!
//! What a runtime's device can do is plain data ([`WgslDeviceInfo`]): the family's tile
//! policy and form choice read only that, never a runtime's own types.

use std::fmt::Debug;

use crate::device::{Device, Tensor};
use crate::error::{Error, Result};
use crate::kernels::wgsl::Bindings;

/// Bytes of one uniform parameter slot (WebGPU's largest uniform offset alignment).
pub const PARAM_SLOT_BYTES: u64 = 256;

/// u32 words in one parameter slot.
pub const PARAM_WORDS: usize = 64;

/// One parameter slot's words.
pub type Slot = [u32; PARAM_WORDS];

/// Whether the translator adds its loop-bounding counters to a shader's loops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoopBounding {
    /// wgpu's default: every loop also counts down a 64-bit budget and breaks when it runs
    /// out. It guards against infinite loops, and its extra exit keeps drivers from fully
    /// unrolling short constant loops (so register arrays indexed by them spill).
    Forced,
    /// No counters, for shaders whose every loop has a bound that strictly advances (a
    /// constant, or a u32 counter stepping towards a bound it cannot overflow past);
    /// bounds checks on memory accesses stay on.
    Off,
}

/// Builds a parameter slot from words (f32 values go in as their bits).
#[derive(Clone, Copy, Debug)]
pub struct Words {
    /// The slot.
    pub w: Slot,
    n: usize,
}

impl Words {
    /// An empty slot.
    pub fn new() -> Self {
        Words {
            w: [0; PARAM_WORDS],
            n: 0,
        }
    }

    /// Appends a u32.
    pub fn u(mut self, v: u32) -> Self {
        self.w[self.n] = v;
        self.n += 1;
        self
    }

    /// Appends an f32.
    pub fn f(self, v: f32) -> Self {
        self.u(v.to_bits())
    }
}

impl Default for Words {
    fn default() -> Self {
        Self::new()
    }
}

/// What a device of a WGSL runtime offers the family's kernels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgslDeviceInfo {
    /// The device's name as its driver gives it.
    pub name: String,
    /// A CPU implementation (lavapipe, llvmpipe, WARP, SwiftShader).
    pub is_cpu: bool,
    /// Subgroup operations in compute shaders (basic, vote, arithmetic, ballot, shuffle).
    pub subgroups: bool,
    /// The smallest and largest subgroup a compute dispatch may run with.
    pub subgroup_sizes: (u32, u32),
    /// f16 arithmetic and 16-bit storage in shaders.
    pub f16: bool,
    /// The 16 × 16 × 16 f16 / f32 cooperative matrices the family's coop form uses.
    pub coop: bool,
    /// The same for bf16 inputs (bf16 × bf16 → f32), which the coop form over bf16 needs;
    /// only the native Vulkan runtime offers them (`VK_KHR_shader_bfloat16`).
    pub coop_bf16: bool,
    /// Workgroup memory per workgroup, in bytes.
    pub max_workgroup_storage: u32,
    /// Invocations per workgroup.
    pub max_invocations: u32,
    /// Workgroup size along x.
    pub max_workgroup_size_x: u32,
    /// Workgroups along each dispatch dimension.
    pub max_workgroups_per_dim: u32,
    /// Bytes one storage binding may cover.
    pub max_binding_bytes: u64,
    /// Binding arrays of storage buffers (the native Vulkan runtime): a tensor larger than
    /// one binding is then stored in chunks and bound as an array of them
    /// ([`WgslRuntime::tensor_chunks`]).
    pub binding_arrays: bool,
    /// Bytes of device memory a tensor may take at most (the largest device-local heap on
    /// the Vulkan runtime; `u64::MAX` where the runtime does not say).
    pub memory_bytes: u64,
    /// The largest buffer a chunked tensor's chunk may be (one binding and one allocation;
    /// `max_binding_bytes` where tensors are never chunked).
    pub chunk_bytes: u64,
    /// Chunks one binding array may bind: the device's storage-buffer descriptors per
    /// kernel less those of a kernel's other bindings (1 where tensors are never chunked).
    pub max_chunks: u32,
    /// Binding arrays indexed by non-uniform values (Vulkan's
    /// `shaderStorageBufferArrayNonUniformIndexing`); without it kernels pick a chunk through
    /// a `switch` of constant indices.
    pub binding_array_any_index: bool,
}

impl WgslDeviceInfo {
    /// Workgroups `(x, z)` for `groups` flat workgroups: x ≤ the per-dimension limit, z the
    /// overflow (shaders recover the flat index as `z·nx + x` and skip indices ≥ `groups`).
    pub fn grid(&self, groups: u64) -> Result<(u32, u32)> {
        let max = u64::from(self.max_workgroups_per_dim.max(1));
        let x = groups.clamp(1, max);
        let z = groups.div_ceil(x).max(1);
        if z > max {
            return Err(Error::config(format!(
                "{groups} workgroups exceed this device's dispatch limit ({max}²)"
            )));
        }
        Ok((x as u32, z as u32))
    }

    /// Errors when a KV cache of `bytes` in blocks of `page_bytes` cannot be held or bound: it
    /// must fit the device's memory and one storage binding, or — where the device binds
    /// arrays of storage buffers (the cache is then stored and bound in chunks of whole
    /// blocks) — one block must fit a chunk and the chunks one binding array (`page_bytes`
    /// 0: the block is not known yet).
    pub fn check_cache(&self, bytes: u64, page_bytes: u64) -> Result<()> {
        if bytes > self.memory_bytes {
            return Err(Error::config(format!(
                "the KV cache is {bytes} bytes, more than {} has ({} bytes of device memory)",
                self.name, self.memory_bytes
            )));
        }
        if !self.binding_arrays || bytes <= self.max_binding_bytes {
            return self.check_binding(bytes, "the KV cache");
        }
        // Stored in chunks of whole blocks: a block must fit a chunk, and the chunks one
        // binding array.
        if page_bytes > self.chunk_bytes || !page_bytes.is_multiple_of(4) {
            return Err(Error::config(format!(
                "a KV cache block of {page_bytes} bytes does not fit the {}-byte chunks a \
                 cache larger than one binding is stored in on {} (whole 4-byte words)",
                self.chunk_bytes, self.name
            )));
        }
        let per_chunk = match page_bytes {
            0 => self.chunk_bytes,
            p => self.chunk_bytes / p * p,
        };
        let chunks = bytes.div_ceil(per_chunk.max(1));
        if chunks > u64::from(self.max_chunks) {
            return Err(Error::config(format!(
                "the KV cache is {bytes} bytes: {chunks} chunks of at most {per_chunk} bytes, \
                 more than the {} one kernel may bind on {}",
                self.max_chunks, self.name
            )));
        }
        Ok(())
    }

    /// Errors when a buffer of `bytes` cannot be bound as one storage binding.
    pub fn check_binding(&self, bytes: u64, what: &str) -> Result<()> {
        let max = self.max_binding_bytes;
        if bytes > max {
            return Err(Error::config(format!(
                "{what} is {bytes} bytes, more than this device's largest storage binding \
                 ({max} bytes on {}); use a smaller KV cache (fewer blocks) or batch",
                self.name
            )));
        }
        Ok(())
    }
}

/// Rows of `row_bytes` in `bytes`, at least 1 and at most `u32::MAX` (the rows a chunk of a
/// tensor holds, [`WgslRuntime::tensor_chunks`]).
pub(crate) fn whole_rows(bytes: u64, row_bytes: u64) -> u32 {
    (bytes / row_bytes.max(1)).clamp(1, u64::from(u32::MAX)) as u32
}

/// One dispatch: a pipeline, the parameter slot bound at binding 0, the storage buffers at
/// their bindings, and the workgroups along x, y, z.
#[derive(Clone, Debug)]
pub struct Dispatch<R: WgslRuntime> {
    /// The kernel's pipeline.
    pub pipeline: R::Pipeline,
    /// Index of the parameter slot bound at binding 0.
    pub slot: usize,
    /// `(binding, buffer)` of every storage binding of the kernel's [`Bindings`] set.
    pub buffers: Vec<(u32, R::Buffer)>,
    /// Workgroups along x, y, z.
    pub groups: (u32, u32, u32),
}

/// A runtime that runs the WGSL family's modules (see the module docs).
pub trait WgslRuntime: Clone + Debug + PartialEq + Send + Sync + 'static {
    /// A storage buffer (cheap to clone: a shared handle).
    type Buffer: Clone + Debug + Send + Sync + 'static;
    /// A compiled pipeline (cheap to clone).
    type Pipeline: Clone + Debug + Send + Sync + 'static;
    /// A block of parameter slots.
    type Params: Debug + Send + Sync + 'static;

    /// The runtime's name in errors ("wgpu", "VULKAN").
    const NAME: &'static str;

    /// Whether the runtime captures submissions into graphs that replay them (Vulkan's
    /// [`VulkanDevice::capture`](crate::device::VulkanDevice::capture); wgpu has no
    /// re-submittable command buffers): the family's graph-mode metadata exists only then.
    const CAPTURES: bool;

    /// What the device offers the kernels.
    fn info(&self) -> &WgslDeviceInfo;

    /// Whether the calling thread is capturing this device's submissions (never, on a
    /// runtime without captures).
    fn is_capturing(&self) -> bool;

    /// The device as a [`Device`] (where tensors for it are made).
    fn device(&self) -> Device;

    /// The pipeline of the module `key` (`source` runs only when it is not cached yet), with
    /// the bindings of `bindings`; `subgroups`: the module uses subgroup operations.
    fn pipeline(
        &self,
        key: &str,
        source: &dyn Fn() -> String,
        bindings: Bindings,
        subgroups: bool,
        loops: LoopBounding,
    ) -> Result<Self::Pipeline>;

    /// The buffer of `t`, checked to live on this device and to fit one storage binding
    /// (`what` names it in errors).
    fn tensor_buffer(&self, t: &Tensor, what: &'static str) -> Result<Self::Buffer>;

    /// The buffers of `t` as a kernel that binds them as one binding array sees them, with
    /// the outermost rows of `row_bytes` bytes (a KV cache's blocks) each holds: the chunks
    /// of a tensor stored in several buffers (only where the device has
    /// [`WgslDeviceInfo::binding_arrays`]), each within one binding, or `t`'s one buffer
    /// ([`WgslRuntime::tensor_buffer`]'s checks) with all its rows. An error when the chunks
    /// are not whole rows.
    fn tensor_chunks(
        &self,
        t: &Tensor,
        row_bytes: u64,
        what: &'static str,
    ) -> Result<(Vec<Self::Buffer>, u32)> {
        let b = self.tensor_buffer(t, what)?;
        let rows = whole_rows(Self::buffer_bytes(&b), row_bytes);
        Ok((vec![b], rows))
    }

    /// A buffer's size in bytes.
    fn buffer_bytes(buffer: &Self::Buffer) -> u64;

    /// A storage buffer holding `words`.
    fn upload_words(&self, label: &str, words: &[u32]) -> Result<Self::Buffer>;

    /// Overwrites the first `words.len()` words of `buffer`, ordered after every earlier
    /// submission and before every later one (graph mode's persistent metadata).
    fn write_words(&self, buffer: &Self::Buffer, words: &[u32]) -> Result<()>;

    /// A storage buffer of at least `bytes` bytes (its contents unspecified).
    fn scratch(&self, label: &str, bytes: u64) -> Result<Self::Buffer>;

    /// One of four distinct small buffers (`slot % 4`) to bind where a kernel's optional
    /// input or output is unused; a different slot for each binding of one dispatch.
    fn placeholder(&self, slot: usize) -> Result<Self::Buffer>;

    /// A block of `slots` parameter slots.
    fn params(&self, slots: usize) -> Result<Self::Params>;

    /// Writes `slots` into the first slots of `params` (skipped where they already hold
    /// them) and submits `dispatches` in order.
    fn submit(
        &self,
        params: &Self::Params,
        slots: &[Slot],
        dispatches: &[Dispatch<Self>],
    ) -> Result<()>;

    /// Submits one dispatch with its own parameters `words` (slot 0 of a block the device
    /// keeps for one-off dispatches: the model ops, `merge_attn_states`).
    fn submit_one(&self, words: Slot, dispatch: Dispatch<Self>) -> Result<()>;
}
