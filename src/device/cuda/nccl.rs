//! NCCL collectives between the CUDA devices of one process: one communicator per device
//! (`ncclCommInitAll`), each collective queued on the devices' own streams, after the work
//! already queued there.
//!
//! NCCL is opened at run time. A machine without it reports "unavailable: …" (with the reason) through
//! [`nccl_status`] and every constructor's error, never a panic. Why not cudarc's NCCL
//! module: its loader looks for `libnccl.so` and CUDA-versioned names, not the
//! `libnccl.so.2` soname that NCCL's packages (the pip wheels, Debian's libnccl2) install, so
//! it finds no NCCL on most machines that have one. The few functions used here are bound
//! from `nccl.h` (NCCL 2.x; unchanged since 2.4).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::OnceLock;

use super::CudaDevice;
use crate::device::library::{bindings, Library};
use crate::device::{Device, Storage, Tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// `ncclResult_t`; `ncclSuccess` is 0.
type NcclResult = c_int;
/// `ncclComm_t`, an opaque pointer.
type NcclComm = *mut c_void;
/// `ncclDataType_t` values used here.
const NCCL_UINT8: c_int = 1;
const NCCL_FLOAT16: c_int = 6;
const NCCL_FLOAT32: c_int = 7;
const NCCL_BFLOAT16: c_int = 9;
/// `ncclRedOp_t`: `ncclSum`.
const NCCL_SUM: c_int = 0;

bindings! {
    /// The NCCL functions used. Signatures from `nccl.h` (NVIDIA/nccl, `src/nccl.h.in`).
    struct NcclApi {
        /// `ncclResult_t ncclGetVersion(int* version)`.
        fn ncclGetVersion(*mut c_int) -> NcclResult;
        /// `const char* ncclGetErrorString(ncclResult_t result)`.
        fn ncclGetErrorString(NcclResult) -> *const c_char;
        /// `ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist)`.
        fn ncclCommInitAll(*mut NcclComm, c_int, *const c_int) -> NcclResult;
        /// `ncclResult_t ncclCommDestroy(ncclComm_t comm)`.
        fn ncclCommDestroy(NcclComm) -> NcclResult;
        /// `ncclResult_t ncclGroupStart()`.
        fn ncclGroupStart() -> NcclResult;
        /// `ncclResult_t ncclGroupEnd()`.
        fn ncclGroupEnd() -> NcclResult;
        /// `ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
        /// ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)`.
        fn ncclBroadcast(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, *mut c_void) -> NcclResult;
        /// `ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
        /// ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)`.
        fn ncclAllReduce(*const c_void, *mut c_void, usize, c_int, c_int, NcclComm, *mut c_void) -> NcclResult;
    }
}

/// The names NCCL is looked for by (the loader's search: `LD_LIBRARY_PATH`, RUNPATH,
/// `ld.so.cache`): the soname first.
const NCCL_NAMES: &[&str] = &["libnccl.so.2", "libnccl.so"];

fn api() -> std::result::Result<&'static NcclApi, String> {
    static LIB: OnceLock<std::result::Result<Library, String>> = OnceLock::new();
    static API: OnceLock<std::result::Result<NcclApi, String>> = OnceLock::new();
    API.get_or_init(|| {
        let lib = LIB
            .get_or_init(|| {
                let names: Vec<PathBuf> = NCCL_NAMES.iter().map(PathBuf::from).collect();
                Library::open_first(&names).ok_or_else(|| {
                    format!(
                        "{} not found (NCCL is not installed, or not on the loader path: for \
                         the pip wheel nvidia-nccl-cu13 add its nvidia/nccl/lib to \
                         LD_LIBRARY_PATH)",
                        NCCL_NAMES.join(" / ")
                    )
                })
            })
            .as_ref()
            .map_err(Clone::clone)?;
        Ok(NcclApi::resolve(lib))
    })
    .as_ref()
    .map_err(Clone::clone)
}

impl NcclApi {
    /// `Ok` for `ncclSuccess`, else "`what`: <NCCL's sentence> (code)".
    fn check(&self, what: &str, code: NcclResult) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        let text = self
            .ncclGetErrorString()
            .ok()
            .map(|f| {
                // SAFETY: takes an integer; returns a static string or null.
                let p = unsafe { f(code) };
                if p.is_null() {
                    String::new()
                } else {
                    // SAFETY: non-null, NUL-terminated, static in the library.
                    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
                }
            })
            .unwrap_or_default();
        Err(nccl_error(format!("{what}: {text} (ncclResult {code})")))
    }
}

fn nccl_error(message: impl Into<String>) -> Error {
    Error::Device {
        backend: "nccl".into(),
        message: message.into(),
    }
}

/// NCCL's version code (`2.27.3` is 22703) when it can be used on this machine, else the
/// sentence saying why not.
pub fn nccl_status() -> std::result::Result<i32, String> {
    static STATUS: OnceLock<std::result::Result<i32, String>> = OnceLock::new();
    STATUS
        .get_or_init(|| {
            let api = api()?;
            let f = api.ncclGetVersion()?;
            let mut v: c_int = 0;
            // SAFETY: writes one int through a pointer to a local.
            let r = unsafe { f(&mut v) };
            api.check("ncclGetVersion", r).map_err(|e| e.to_string())?;
            Ok(v)
        })
        .clone()
}

/// One NCCL communicator per device of one process; rank `r` is `devices[r]`.
///
/// Collectives take `&mut self`: a communicator serves one collective call at a time. Two
/// sets of communicators over the same GPUs must not run collectives from different threads
/// at once: every device runs polyattn's work on one stream, and two collectives queued in
/// opposite orders on two GPUs would each wait for the other forever.
pub struct NcclComms {
    api: &'static NcclApi,
    devices: Vec<CudaDevice>,
    comms: Vec<NcclComm>,
}

// SAFETY: an NCCL communicator may be used from any thread; every call that uses one takes
// `&mut self`, so no two calls on the same communicators overlap.
unsafe impl Send for NcclComms {}
// SAFETY: `&self` methods read only the device list.
unsafe impl Sync for NcclComms {}

impl std::fmt::Debug for NcclComms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComms")
            .field(
                "ordinals",
                &self.devices.iter().map(|d| d.ordinal()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl NcclComms {
    /// Communicators over `devices` (distinct GPUs; NCCL refuses two ranks on one GPU).
    pub fn new(devices: &[CudaDevice]) -> Result<Self> {
        let api = api().map_err(|why| nccl_error(format!("unavailable: {why}")))?;
        nccl_status().map_err(|why| nccl_error(format!("unavailable: {why}")))?;
        if devices.is_empty() {
            return Err(Error::config("NCCL communicators over no device"));
        }
        let ordinals: Vec<c_int> = devices.iter().map(|d| d.ordinal() as c_int).collect();
        for (i, o) in ordinals.iter().enumerate() {
            if ordinals[..i].contains(o) {
                return Err(Error::config(format!(
                    "NCCL ranks must be distinct GPUs: ordinal {o} is listed twice (the \
                     one-device form of a sharded layer runs without NCCL)"
                )));
            }
        }
        let n = c_int::try_from(devices.len())
            .map_err(|_| Error::config(format!("{} NCCL ranks", devices.len())))?;
        let mut comms: Vec<NcclComm> = vec![std::ptr::null_mut(); devices.len()];
        let f = api.ncclCommInitAll().map_err(nccl_error)?;
        // SAFETY: `comms` holds `n` slots; `ordinals` lists `n` device ordinals.
        let r = unsafe { f(comms.as_mut_ptr(), n, ordinals.as_ptr()) };
        api.check("ncclCommInitAll", r)?;
        Ok(NcclComms {
            api,
            devices: devices.to_vec(),
            comms,
        })
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.devices.len()
    }

    /// Rank `r`'s device.
    pub fn device(&self, rank: usize) -> Option<&CudaDevice> {
        self.devices.get(rank)
    }

    /// The device address of `t`, which must live on rank `rank`'s device.
    fn address(&self, what: &str, t: &Tensor, rank: usize) -> Result<*mut c_void> {
        let on_rank = matches!(t.device(), Device::Cuda(d) if d == &self.devices[rank]);
        match t.storage() {
            Storage::Cuda(s) if on_rank => Ok(s.device_ptr() as *mut c_void),
            _ => Err(Error::config(format!(
                "NCCL: {what} of rank {rank} must live on CUDA device {} (it is on {:?})",
                self.devices[rank].ordinal(),
                t.device().kind()
            ))),
        }
    }

    /// Runs `calls` inside one NCCL group, so that the collectives of every rank issued from
    /// this one thread proceed together.
    fn group(&mut self, calls: impl FnOnce(&Self) -> Result<()>) -> Result<()> {
        let api = self.api;
        let start = api.ncclGroupStart().map_err(nccl_error)?;
        // SAFETY: no arguments.
        api.check("ncclGroupStart", unsafe { start() })?;
        let queued = calls(self);
        let end = api.ncclGroupEnd().map_err(nccl_error)?;
        // SAFETY: no arguments; closes the group opened above, also after a failed call.
        let ended = api.check("ncclGroupEnd", unsafe { end() });
        queued.and(ended)
    }

    /// Each root's tensor copied to every device: `roots[i] = (rank, tensor on that rank's
    /// device)` lands in `gathered[d][i]` on device `d` (one broadcast per root, grouped), so
    /// afterwards every device holds every root's part. `gathered[d][i]` must have the byte
    /// size of `roots[i]`'s tensor. An all-gather where only some ranks have something to
    /// send.
    pub fn broadcast_parts(
        &mut self,
        roots: &[(usize, &Tensor)],
        gathered: &mut [Vec<Tensor>],
    ) -> Result<()> {
        let n = self.world_size();
        let k = roots.len();
        if gathered.len() != n || gathered.iter().any(|g| g.len() != k) {
            return Err(Error::config(format!(
                "NCCL broadcast of {k} parts over {n} ranks needs {n}×{k} receive buffers"
            )));
        }
        let mut sends = Vec::with_capacity(k);
        for &(r, p) in roots {
            if r >= n {
                return Err(Error::config(format!(
                    "NCCL broadcast from rank {r} of {n}"
                )));
            }
            sends.push((r, self.address("part", p, r)?, p.size_in_bytes()));
        }
        let mut recvs = vec![Vec::with_capacity(k); n];
        for (d, row) in gathered.iter().enumerate() {
            for (i, t) in row.iter().enumerate() {
                if t.size_in_bytes() != sends[i].2 {
                    return Err(Error::config(format!(
                        "NCCL broadcast: device {d}'s buffer for part {i} holds {} bytes, the \
                         part {}",
                        t.size_in_bytes(),
                        sends[i].2
                    )));
                }
                recvs[d].push(self.address("receive buffer", t, d)?);
            }
        }
        let f = self.api.ncclBroadcast().map_err(nccl_error)?;
        self.group(|me| {
            for (i, &(root, send, bytes)) in sends.iter().enumerate() {
                for (d, ((dev, &comm), recv)) in
                    me.devices.iter().zip(&me.comms).zip(&recvs).enumerate()
                {
                    let stream = dev.stream().cu_stream() as *mut c_void;
                    // Only the root's send buffer is read; the others name their own receive
                    // buffer, so every pointer a rank passes lives on its device.
                    let from = if d == root { send } else { recv[i] };
                    // SAFETY: `send` (read on the root only) and the receive buffers hold
                    // `bytes` bytes on their ranks' devices (checked above) and outlive the
                    // queued copy: frees are ordered after work on the same stream.
                    let r = unsafe {
                        f(
                            from,
                            recv[i],
                            bytes,
                            NCCL_UINT8,
                            root as c_int,
                            comm,
                            stream,
                        )
                    };
                    me.api.check("ncclBroadcast", r)?;
                }
            }
            Ok(())
        })
    }

    /// Sums `tensors[r]` (rank `r`'s, all of one activation dtype and size) across the ranks,
    /// in place: afterwards every rank holds the sum.
    pub fn all_reduce_sum(&mut self, tensors: &mut [&mut Tensor]) -> Result<()> {
        let n = self.world_size();
        if tensors.len() != n {
            return Err(Error::config(format!(
                "NCCL all-reduce over {n} ranks got {} tensors",
                tensors.len()
            )));
        }
        let dtype = tensors[0].dtype();
        let count = tensors[0].numel();
        let code = match dtype {
            DType::F32 => NCCL_FLOAT32,
            DType::F16 => NCCL_FLOAT16,
            DType::Bf16 => NCCL_BFLOAT16,
            other => {
                return Err(Error::DType {
                    what: "all_reduce_sum tensor",
                    got: other.to_string(),
                    expected: "f32, f16 or bf16".into(),
                })
            }
        };
        let mut bufs = Vec::with_capacity(n);
        for (r, t) in tensors.iter().enumerate() {
            t.expect_dtype("all_reduce_sum tensor", dtype)?;
            if t.numel() != count {
                return Err(Error::config(format!(
                    "NCCL all-reduce: rank {r}'s tensor has {} elements, rank 0's {count}",
                    t.numel()
                )));
            }
            bufs.push(self.address("tensor", t, r)?);
        }
        let f = self.api.ncclAllReduce().map_err(nccl_error)?;
        self.group(|me| {
            for (r, &buf) in bufs.iter().enumerate() {
                let stream = me.devices[r].stream().cu_stream() as *mut c_void;
                // SAFETY: `buf` holds `count` elements of `dtype` on rank r's device; NCCL
                // allows the send and receive buffer to be the same (in place).
                let res = unsafe { f(buf, buf, count, code, NCCL_SUM, me.comms[r], stream) };
                me.api.check("ncclAllReduce", res)?;
            }
            Ok(())
        })
    }
}

impl Drop for NcclComms {
    fn drop(&mut self) {
        let Ok(f) = self.api.ncclCommDestroy() else {
            return;
        };
        for &c in &self.comms {
            if !c.is_null() {
                // SAFETY: each communicator was created by ncclCommInitAll and is destroyed
                // once; work queued on it completes first (NCCL orders the destroy).
                unsafe { f(c) };
            }
        }
    }
}
