//! Launching a kernel on a [`HipDevice`]: the grid, block and shared memory checked before the
//! launch (a typed [`Error::Config`] with the numbers, not a runtime failure that names none),
//! the device's health checked (a sticky fault is reported, not repeated), and the arguments
//! passed by value as one kernarg buffer through `hipModuleLaunchKernel`'s `extra`.
//!
//! The kernarg buffer ([`KernArgs`]) is the C struct layout of the kernel's explicit
//! arguments in order: each at the next offset that is a multiple of its alignment. It is
//! what the AMDGPU ABI gives a kernel's kernarg segment, and the runtime copies each argument
//! out of the buffer at the offset the code object's metadata gives it (`desc.offset_` in
//! `ihipModuleLaunchKernel`, ROCm/hipamd `rocm-5.2.3` and ROCm/clr `rocm-6.2.2`,
//! `hip_module.cpp`); hidden arguments (block counts, the heap) are the runtime's own. So
//! `combine_splits(const AttnParams p, const SplitGroup* groups)` takes the bytes of
//! `AttnParams`, padding to 8, then the 8-byte pointer.

use std::ffi::c_void;

use super::device::{HipDevice, Origin};
use super::module::HipFunction;
use crate::error::{Error, Result};

/// The keys of `hipModuleLaunchKernel`'s `extra` array, `void*` values in
/// `hip/hip_runtime_api.h`: `#define HIP_LAUNCH_PARAM_BUFFER_POINTER ((void*)0x01)`,
/// `HIP_LAUNCH_PARAM_BUFFER_SIZE ((void*)0x02)`, `HIP_LAUNCH_PARAM_END ((void*)0x03)` in the
/// ROCm/HIP tags `rocm-5.2.3` (lines 513-515), `rocm-6.0.0` (565-567) and `rocm-6.2.2`
/// (583-585), and in its `develop` branch (585-587). The runtime checks `extra[0]`,
/// `extra[2]` and `extra[4]` against them (`hip_module.cpp` of ROCm/hipamd `rocm-5.2.3` and
/// ROCm/clr `rocm-6.2.2`) and refuses anything else.
const HIP_LAUNCH_PARAM_BUFFER_POINTER: usize = 0x01;
/// See [`HIP_LAUNCH_PARAM_BUFFER_POINTER`].
const HIP_LAUNCH_PARAM_BUFFER_SIZE: usize = 0x02;
/// See [`HIP_LAUNCH_PARAM_BUFFER_POINTER`].
const HIP_LAUNCH_PARAM_END: usize = 0x03;

/// The most threads a block may have on every AMD GPU (`maxThreadsPerBlock`).
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;

/// A kernel's explicit arguments packed as the kernarg segment wants them: each argument's
/// bytes at the next multiple of its alignment, in order, the whole padded to the largest
/// alignment (the C layout of a struct of the arguments).
///
/// An argument must be the exact Rust mirror of the C type: a `#[repr(C)]` block for a
/// struct passed by value, `u64` for a pointer (a device address), `u32` / `i32` / `f32` for
/// scalars.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernArgs {
    /// The packed bytes, padded to `align`.
    bytes: Vec<u8>,
    /// Where the last argument ends (before the tail padding).
    end: usize,
    /// The largest alignment pushed (1 when empty).
    align: usize,
}

impl KernArgs {
    /// No arguments.
    pub fn new() -> Self {
        KernArgs {
            bytes: Vec::new(),
            end: 0,
            align: 1,
        }
    }

    /// Appends `value` at the next multiple of its alignment; returns that offset. Errors
    /// only when the buffer would pass `usize::MAX` bytes.
    pub fn push<T: bytemuck::Pod>(&mut self, value: &T) -> Result<usize> {
        let align = std::mem::align_of::<T>();
        let size = std::mem::size_of::<T>();
        let overflow = || {
            Error::overflow(
                "HIP kernel arguments",
                format!("{size} bytes aligned to {align} after {} bytes", self.end),
            )
        };
        let offset = align_up(self.end, align).ok_or_else(overflow)?;
        let end = offset.checked_add(size).ok_or_else(overflow)?;
        let align = self.align.max(align);
        let padded = align_up(end, align).ok_or_else(overflow)?;
        self.bytes.truncate(self.end);
        self.bytes.resize(offset, 0);
        self.bytes.extend_from_slice(bytemuck::bytes_of(value));
        self.bytes.resize(padded, 0);
        self.end = end;
        self.align = align;
        Ok(offset)
    }

    /// [`KernArgs::push`] as a builder.
    pub fn with<T: bytemuck::Pod>(mut self, value: &T) -> Result<Self> {
        self.push(value)?;
        Ok(self)
    }

    /// The packed buffer (its length a multiple of the largest alignment).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether no argument (or only zero-sized ones) was pushed.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

impl Default for KernArgs {
    fn default() -> Self {
        KernArgs::new()
    }
}

/// `n` rounded up to a multiple of `align` (a power of two), or `None` past `usize::MAX`.
fn align_up(n: usize, align: usize) -> Option<usize> {
    debug_assert!(align.is_power_of_two());
    Some(n.checked_add(align - 1)? & !(align - 1))
}

/// What a launch is checked against: the device's and the kernel's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Limits {
    /// The kernel's launch bounds, where known (else 1024).
    pub(super) max_threads_per_block: Option<u32>,
    /// The kernel's static shared memory, where known (else 0).
    pub(super) static_shared_bytes: Option<u32>,
    /// The device's shared memory per block.
    pub(super) max_shared_memory_per_block: usize,
}

/// Checks a launch of `name` before the runtime sees it: every block and grid dimension at
/// least 1, at most [`MAX_THREADS_PER_BLOCK`] threads a block (and no more than the kernel's
/// launch bounds, which the runtime reports as `hipErrorLaunchFailure`), fewer than 2^32
/// threads along each dimension (`hipModuleLaunchKernel`'s documented limit), and the static
/// plus dynamic shared memory within the device's per-block limit. An [`Error::Config`] with
/// the numbers otherwise.
pub(super) fn check_launch(
    name: &str,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_mem_bytes: u32,
    limits: Limits,
) -> Result<()> {
    let (gx, gy, gz) = grid;
    let (bx, by, bz) = block;
    if [gx, gy, gz, bx, by, bz].contains(&0) {
        return Err(Error::config(format!(
            "HIP launch of {name}: grid {grid:?} × block {block:?} has an empty dimension \
             (every grid and block dimension must be at least 1)"
        )));
    }
    let threads = u64::from(bx) * u64::from(by) * u64::from(bz);
    let bound = limits
        .max_threads_per_block
        .unwrap_or(MAX_THREADS_PER_BLOCK)
        .min(MAX_THREADS_PER_BLOCK);
    if threads > u64::from(bound) {
        let whose = if bound < MAX_THREADS_PER_BLOCK {
            format!("{name}'s launch bounds allow {bound}")
        } else {
            format!("AMD GPUs allow {MAX_THREADS_PER_BLOCK}")
        };
        return Err(Error::config(format!(
            "HIP launch of {name}: block {block:?} has {threads} threads; {whose}"
        )));
    }
    for (axis, g, b) in [("x", gx, bx), ("y", gy, by), ("z", gz, bz)] {
        if u64::from(g) * u64::from(b) >= 1 << 32 {
            return Err(Error::config(format!(
                "HIP launch of {name}: grid {grid:?} × block {block:?} has {} threads along \
                 {axis}; HIP allows fewer than 2^32 per dimension: the batch is too large for \
                 one launch",
                u64::from(g) * u64::from(b)
            )));
        }
    }
    let static_bytes = limits.static_shared_bytes.unwrap_or(0);
    let total = u64::from(shared_mem_bytes) + u64::from(static_bytes);
    if total > limits.max_shared_memory_per_block as u64 {
        return Err(Error::config(format!(
            "HIP launch of {name}: {shared_mem_bytes} bytes of dynamic shared memory + \
             {static_bytes} static = {total} bytes; the device allows {} per block",
            limits.max_shared_memory_per_block
        )));
    }
    Ok(())
}

impl HipDevice {
    /// Launches `f` on the device's stream with one argument passed by value: `params` must
    /// mirror the kernel's only parameter (a `#[repr(C)]` block for `k(const Params p)`, a
    /// `u64` for `k(float* p)`). See [`HipDevice::launch_args`].
    pub fn launch<T: bytemuck::Pod>(
        &self,
        f: &HipFunction,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_mem_bytes: u32,
        params: &T,
    ) -> Result<()> {
        let args = KernArgs::new().with(params)?;
        self.launch_args(f, grid, block, shared_mem_bytes, &args)
    }

    /// Launches `f` with two arguments by value, laid out as the kernel's two parameters
    /// (`combine_splits(const AttnParams p, const SplitGroup* groups)`: `a` the block, `b`
    /// the `u64` device address). See [`HipDevice::launch_args`].
    pub fn launch2<A: bytemuck::Pod, B: bytemuck::Pod>(
        &self,
        f: &HipFunction,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_mem_bytes: u32,
        a: &A,
        b: &B,
    ) -> Result<()> {
        let args = KernArgs::new().with(a)?.with(b)?;
        self.launch_args(f, grid, block, shared_mem_bytes, &args)
    }

    /// Launches `f` on the device's stream (asynchronously, ordered after the work queued
    /// before it) with `shared_mem_bytes` of dynamic shared memory and the packed `args`.
    ///
    /// Errors: an [`Error::Config`] for a launch outside the limits (see the module docs:
    /// empty dimensions, more than 1024 threads a block or the kernel's launch bounds, 2^32
    /// threads along a dimension, too much shared memory); an [`Error::Device`] for a
    /// function of another device, a faulted device, or the runtime's refusal.
    ///
    /// The runtime cannot check `args` against the kernel (it reads each parameter at the
    /// offset the code object gives it): that they mirror the kernel's parameters, and that
    /// every device address in them belongs to a live buffer sized as the kernel requires,
    /// is the caller's contract.
    pub fn launch_args(
        &self,
        f: &HipFunction,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_mem_bytes: u32,
        args: &KernArgs,
    ) -> Result<()> {
        if f.ordinal() != self.ordinal() {
            return Err(super::device_error(format!(
                "kernel {} was loaded on AMD GPU {}, launched on AMD GPU {}",
                f.name(),
                f.ordinal(),
                self.ordinal()
            )));
        }
        check_launch(
            f.name(),
            grid,
            block,
            shared_mem_bytes,
            Limits {
                max_threads_per_block: f.max_threads_per_block(),
                static_shared_bytes: f.static_shared_bytes(),
                max_shared_memory_per_block: self.info().max_shared_memory_per_block,
            },
        )?;
        self.bind()?;
        // A kernel without arguments still gets a valid pointer (the runtime reads nothing).
        let placeholder = [0u64; 1];
        let buffer: *const u8 = if args.is_empty() {
            placeholder.as_ptr().cast()
        } else {
            args.as_bytes().as_ptr()
        };
        let mut size: usize = args.len();
        let mut extra: [*mut c_void; 5] = [
            HIP_LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
            buffer as *mut c_void,
            HIP_LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
            (&mut size as *mut usize).cast(),
            HIP_LAUNCH_PARAM_END as *mut c_void,
        ];
        // SAFETY: `f` is a live function of this device (checked), current on this thread;
        // the dimensions are checked; `extra` is the documented five-entry array, and the
        // buffer and size it points to outlive the call (the runtime copies the arguments
        // into the launch command before returning). The arguments mirroring the kernel's
        // parameters is this function's documented contract with its callers.
        let code = unsafe {
            (self.rt().module_launch_kernel)(
                f.raw(),
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                shared_mem_bytes,
                self.stream(),
                std::ptr::null_mut(),
                extra.as_mut_ptr(),
            )
        };
        self.check(
            &format!(
                "hipModuleLaunchKernel({}, grid {grid:?}, block {block:?}, {shared_mem_bytes} \
                 bytes of shared memory)",
                f.name()
            ),
            code,
            Origin::Launch,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block like the family's parameter blocks: 4-byte fields, then an 8-byte address.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
    struct Params {
        a: u32,
        b: u32,
        c: u32,
        _pad: u32,
        out: u64,
    }

    #[test]
    fn arguments_are_packed_in_c_layout() {
        // (u32, u64): the pointer at 8, as in `k(int n, float* p)`.
        let mut a = KernArgs::new();
        assert_eq!(a.push(&7u32).unwrap(), 0);
        assert_eq!(a.push(&0x1122_3344_5566_7788u64).unwrap(), 8);
        assert_eq!(a.len(), 16);
        assert_eq!(&a.as_bytes()[..4], &7u32.to_le_bytes());
        assert_eq!(&a.as_bytes()[4..8], &[0; 4]);
        assert_eq!(&a.as_bytes()[8..], &0x1122_3344_5566_7788u64.to_le_bytes());

        // (u64, u32): the tail padded to 8, as a C struct's size is.
        let b = KernArgs::new().with(&1u64).unwrap().with(&2u32).unwrap();
        assert_eq!(b.len(), 16);
        // ... and padding is overwritten by a following argument, not kept before it.
        let c = b.clone().with(&3u32).unwrap();
        assert_eq!(c.len(), 16);
        assert_eq!(&c.as_bytes()[12..16], &3u32.to_le_bytes());

        // (u8, u16, u8, f32): 0, 2, 4, 8; size 12.
        let mut d = KernArgs::new();
        let offsets = [
            d.push(&1u8).unwrap(),
            d.push(&2u16).unwrap(),
            d.push(&3u8).unwrap(),
            d.push(&4.0f32).unwrap(),
        ];
        assert_eq!(offsets, [0, 2, 4, 8]);
        assert_eq!(d.len(), 12);
        assert_eq!(d.as_bytes()[1], 0);
        assert_eq!(&d.as_bytes()[8..12], &4.0f32.to_le_bytes());

        // A by-value block then a pointer (`combine_splits(const AttnParams p, const
        // SplitGroup* groups)`): the block's bytes at 0, the pointer after it, aligned.
        let p = Params {
            a: 1,
            b: 2,
            c: 3,
            _pad: 0,
            out: 0xdead_beef,
        };
        let mut e = KernArgs::new();
        assert_eq!(e.push(&p).unwrap(), 0);
        assert_eq!(
            e.push(&0xabcd_0000u64).unwrap(),
            std::mem::size_of::<Params>()
        );
        assert_eq!(&e.as_bytes()[..24], bytemuck::bytes_of(&p));
        // A block of odd size: (u32 × 3) is 12 bytes, so the pointer goes to 16.
        let f = KernArgs::new().with(&[1u32, 2, 3]).unwrap();
        assert_eq!(f.len(), 12);
        let mut f = f;
        assert_eq!(f.push(&9u64).unwrap(), 16);
        assert_eq!(f.len(), 24);

        assert!(KernArgs::new().is_empty());
        assert_eq!(KernArgs::default(), KernArgs::new());
        assert_eq!(KernArgs::new().as_bytes(), &[] as &[u8]);
    }

    /// The `.offset` values of a code object's AMDGPU metadata (MessagePack: the key as a
    /// fixstr, then a positive fixint or `uint 8/16/32`), in order: for a module of one
    /// kernel, its arguments' offsets, explicit ones first.
    fn metadata_offsets(code: &[u8]) -> Vec<u64> {
        let key = b"\xa7.offset";
        let mut out = Vec::new();
        let mut i = 0;
        while let Some(at) = code[i..].windows(key.len()).position(|w| w == key) {
            let v = i + at + key.len();
            let be = |n: usize| {
                code.get(v + 1..v + 1 + n)
                    .map(|b| b.iter().fold(0u64, |acc, &x| acc << 8 | u64::from(x)))
            };
            out.extend(match code.get(v) {
                Some(&b) if b < 0x80 => Some(u64::from(b)),
                Some(0xcc) => be(1),
                Some(0xcd) => be(2),
                Some(0xce) => be(4),
                _ => None,
            });
            i = v;
        }
        out
    }

    /// The packer against the compiler: hiprtc (no GPU needed) compiles kernels whose
    /// parameters are those the packer is given, and the code object's metadata must put each
    /// argument where the packer did.
    #[test]
    fn the_packer_agrees_with_the_compilers_kernarg_layout() {
        if let Err(why) = crate::device::hip::hiprtc::hiprtc_status() {
            eprintln!("SKIP the_packer_agrees_with_the_compilers_kernarg_layout: {why}");
            return;
        }
        let p = Params {
            a: 1,
            b: 2,
            c: 3,
            _pad: 0,
            out: 4,
        };
        // (kernel, the packer's offsets for its parameters pushed in order)
        let mut block_then_pointer = KernArgs::new();
        let mut odd_block_then_pointer = KernArgs::new();
        let mut scalars = KernArgs::new();
        let cases: [(&str, Vec<usize>); 3] = [
            (
                "struct P { unsigned a, b, c, pad; unsigned long long out; };
                 extern \"C\" __global__ void k(const P p, const unsigned* groups) {
                     ((unsigned*)p.out)[0] = groups[p.a]; }",
                vec![
                    block_then_pointer.push(&p).unwrap(),
                    block_then_pointer.push(&0u64).unwrap(),
                ],
            ),
            (
                "struct Q { unsigned a, b, c; };
                 extern \"C\" __global__ void k(const Q q, float* out) { out[q.a] = q.b + q.c; }",
                vec![
                    odd_block_then_pointer.push(&[1u32, 2, 3]).unwrap(),
                    odd_block_then_pointer.push(&0u64).unwrap(),
                ],
            ),
            (
                "extern \"C\" __global__ void k(int n, float* out, unsigned short h, double d,
                                                  unsigned char c, float f) {
                     out[n] = h + d + c + f; }",
                vec![
                    scalars.push(&0i32).unwrap(),
                    scalars.push(&0u64).unwrap(),
                    scalars.push(&0u16).unwrap(),
                    scalars.push(&0f64).unwrap(),
                    scalars.push(&0u8).unwrap(),
                    scalars.push(&0f32).unwrap(),
                ],
            ),
        ];
        assert_eq!(cases[0].1, [0, 24]);
        assert_eq!(cases[1].1, [0, 16]);
        assert_eq!(cases[2].1, [0, 8, 16, 24, 32, 36]);
        assert_eq!(scalars.len(), 40);
        for (src, packed) in &cases {
            let obj = crate::device::hip::hiprtc::compile(src, "args.hip", "gfx90a", &[]).unwrap();
            let compiled = metadata_offsets(&obj.code);
            let packed: Vec<u64> = packed.iter().map(|&o| o as u64).collect();
            assert!(compiled.len() >= packed.len(), "{compiled:?} for {src}");
            assert_eq!(&compiled[..packed.len()], packed.as_slice(), "{src}");
        }
    }

    #[test]
    fn align_up_rounds_and_refuses_overflow() {
        assert_eq!(align_up(0, 8), Some(0));
        assert_eq!(align_up(1, 8), Some(8));
        assert_eq!(align_up(8, 8), Some(8));
        assert_eq!(align_up(13, 4), Some(16));
        assert_eq!(align_up(usize::MAX, 8), None);
        assert_eq!(align_up(usize::MAX, 1), Some(usize::MAX));
    }

    #[test]
    fn the_launch_extra_keys_are_the_headers() {
        assert_eq!(HIP_LAUNCH_PARAM_BUFFER_POINTER, 1);
        assert_eq!(HIP_LAUNCH_PARAM_BUFFER_SIZE, 2);
        assert_eq!(HIP_LAUNCH_PARAM_END, 3);
        // Where ROCm's headers are installed (Debian's libamdhip64-dev), read them there too.
        let Ok(h) = std::fs::read_to_string("/usr/include/hip/hip_runtime_api.h") else {
            eprintln!("SKIP header check: no /usr/include/hip/hip_runtime_api.h");
            return;
        };
        for line in [
            "#define HIP_LAUNCH_PARAM_BUFFER_POINTER ((void*)0x01)",
            "#define HIP_LAUNCH_PARAM_BUFFER_SIZE ((void*)0x02)",
            "#define HIP_LAUNCH_PARAM_END ((void*)0x03)",
            "#define hipStreamNonBlocking 0x01",
        ] {
            assert!(h.contains(line), "the installed header lacks {line:?}");
        }
    }

    /// End to end where an AMD GPU is present (only there; SKIP elsewhere): buffers, a
    /// compiled kernel with one argument and one with a by-value block and a pointer, and the
    /// checks' errors.
    #[test]
    fn kernels_run_on_an_amd_gpu() {
        let dev = match HipDevice::new(0) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("SKIP kernels_run_on_an_amd_gpu: {e}");
                return;
            }
        };
        eprintln!("{}", dev.description());
        let arch = dev.arch().to_string();
        let src = r#"
            struct P { unsigned n; float scale; unsigned long long pad; };
            extern "C" __global__ void twice(float* p) { p[threadIdx.x] *= 2.0f; }
            extern "C" __global__ void scaled(const P p, float* out) {
                unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < p.n) out[i] = out[i] * p.scale + (float)p.pad;
            }"#;
        let key = format!("test-kernels:{arch}");
        let build = || crate::device::hip::compile_cached(src, "test.hip", &arch, &[]);
        let twice = dev.function(&key, build, "twice").unwrap();
        let scaled = dev
            .function(&key, || panic!("the module is cached"), "scaled")
            .unwrap();
        let missing = dev
            .function(&key, || panic!("the module is cached"), "nope")
            .unwrap_err()
            .to_string();
        assert!(missing.contains("has no function nope"), "{missing}");

        let host: Vec<f32> = (0..64).map(|i| i as f32).collect();
        let mut buf = dev.upload_pod(&host).unwrap();
        dev.launch(&twice, (1, 1, 1), (64, 1, 1), 0, &buf.device_ptr())
            .unwrap();
        let out: Vec<f32> = dev.download_pod(&buf).unwrap();
        assert_eq!(out, host.iter().map(|x| x * 2.0).collect::<Vec<_>>());

        #[repr(C)]
        #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
        struct P {
            n: u32,
            scale: f32,
            pad: u64,
        }
        let p = P {
            n: 60,
            scale: 0.5,
            pad: 1,
        };
        dev.launch2(&scaled, (2, 1, 1), (32, 1, 1), 0, &p, &buf.device_ptr())
            .unwrap();
        let out: Vec<f32> = dev.download_pod(&buf).unwrap();
        for (i, v) in out.iter().enumerate() {
            let want = if i < 60 {
                i as f32 + 1.0
            } else {
                i as f32 * 2.0
            };
            assert_eq!(*v, want, "element {i}");
        }

        dev.write_pod(&mut buf, 62, &[7.0f32, 8.0]).unwrap();
        assert!(dev.write_pod(&mut buf, 63, &[7.0f32, 8.0]).is_err());
        let mut copy = dev.zeros_bytes(buf.len_bytes()).unwrap();
        assert_eq!(dev.download_pod::<f32>(&copy).unwrap(), vec![0.0; 64]);
        dev.copy(&buf, &mut copy).unwrap();
        let c: Vec<f32> = dev.download_pod(&copy).unwrap();
        assert_eq!(&c[62..], &[7.0, 8.0]);
        dev.fill_zeros(&mut copy).unwrap();
        assert_eq!(dev.download_pod::<f32>(&copy).unwrap(), vec![0.0; 64]);
        let mut small = dev.zeros_bytes(16).unwrap();
        assert!(dev.copy(&buf, &mut small).is_err());
        let empty = dev.zeros_bytes(0).unwrap();
        assert_eq!(empty.device_ptr(), 0);
        assert!(dev.download_bytes(&empty).unwrap().is_empty());

        let e = dev
            .launch(&twice, (1, 1, 1), (2048, 1, 1), 0, &buf.device_ptr())
            .unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        let too_much = u32::try_from(dev.info().max_shared_memory_per_block + 1).unwrap();
        let e = dev
            .launch(&twice, (1, 1, 1), (64, 1, 1), too_much, &buf.device_ptr())
            .unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        dev.synchronize().unwrap();
        assert!(dev.fault().is_none());
    }

    #[test]
    fn launches_are_checked_before_the_runtime() {
        let limits = Limits {
            max_threads_per_block: Some(1024),
            static_shared_bytes: Some(4096),
            max_shared_memory_per_block: 65536,
        };
        let ok = |g, b, s| check_launch("k", g, b, s, limits);
        ok((1, 1, 1), (1, 1, 1), 0).unwrap();
        ok((65536, 8, 4), (256, 1, 1), 61440).unwrap();
        ok((1, 1, 1), (1024, 1, 1), 0).unwrap();
        ok((1, 1, 1), (8, 8, 16), 0).unwrap();
        let config = |r: Result<()>| match r {
            Err(Error::Config(m)) => m,
            other => panic!("expected a config error, got {other:?}"),
        };
        let m = config(ok((0, 1, 1), (64, 1, 1), 0));
        assert!(
            m.contains("empty dimension") && m.contains("(0, 1, 1)"),
            "{m}"
        );
        config(ok((1, 1, 1), (64, 0, 1), 0));
        let m = config(ok((1, 1, 1), (1025, 1, 1), 0));
        assert!(m.contains("1025 threads") && m.contains("1024"), "{m}");
        let m = config(ok((1, 1, 1), (16, 16, 8), 0));
        assert!(m.contains("2048 threads"), "{m}");
        // u32 products that would wrap are compared in u64.
        config(ok((1, 1, 1), (65536, 65536, 1), 0));
        let m = config(ok((u32::MAX, 1, 1), (256, 1, 1), 0));
        assert!(m.contains("2^32"), "{m}");
        let m = config(ok((1, 1, 1), (64, 1, 1), 61441));
        assert!(
            m.contains("61441") && m.contains("4096") && m.contains("65536"),
            "{m}"
        );
        // The kernel's launch bounds.
        let bounded = Limits {
            max_threads_per_block: Some(256),
            ..limits
        };
        let m = config(check_launch("attn", (1, 1, 1), (512, 1, 1), 0, bounded));
        assert!(m.contains("attn's launch bounds allow 256"), "{m}");
        // Unknown kernel attributes: the device's limits alone.
        let unknown = Limits {
            max_threads_per_block: None,
            static_shared_bytes: None,
            max_shared_memory_per_block: 65536,
        };
        check_launch("k", (1, 1, 1), (1024, 1, 1), 65536, unknown).unwrap();
        config(check_launch("k", (1, 1, 1), (1024, 1, 1), 65537, unknown));
    }
}
