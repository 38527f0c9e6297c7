//! [`HipStorage`]: device memory of one [`HipDevice`] (`hipMalloc`, freed on drop), and the
//! device's copies: zero fills and device-to-device copies queued on its stream, uploads and
//! downloads that have finished when they return.
//!
//! What the runtime guarantees, and what this relies on:
//! - A copy between device memory and host memory the runtime does not know (a `Vec`, not
//!   `hipHostMalloc`ed or registered) completes before `hipMemcpy*Async` returns: the runtime
//!   queues it on the stream and waits for it (`ihipMemcpy` in ROCm/hipamd `rocm-5.2.3` and
//!   ROCm/clr `rocm-6.2.2`, `hip_memory.cpp`; the ROCm/hip#2291 maintainers say the same),
//!   so it also waits for the work queued before it. Uploads, writes and downloads
//!   synchronise the stream afterwards as well, so they are complete for registered memory
//!   too, for the price of one more call (the copy was the last work on the stream).
//! - `hipFree` first waits for the device's streams (`ihipFree`, same files), so a buffer is
//!   never freed under a kernel still queued on it; dropping one therefore costs a
//!   synchronisation of the device.

use std::ffi::c_void;
use std::fmt;

use super::device::{HipDevice, Origin};
use super::device_error;
use crate::error::{Error, Result};

/// Bytes of memory on a [`HipDevice`], freed (on the owning device) when dropped.
///
/// A buffer of 0 bytes allocates nothing: its [`HipStorage::device_ptr`] is 0 (null), every
/// copy of it is a no-op, and a kernel may be given it as long as it reads no element.
pub struct HipStorage {
    /// The device address; 0 for a buffer of 0 bytes.
    ptr: u64,
    bytes: usize,
    /// The owning device: frees go to it, and keeping it keeps its stream alive.
    device: HipDevice,
}

impl HipStorage {
    /// Size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.bytes
    }

    /// The raw device address, for kernel arguments (0 for an empty buffer). Valid while
    /// `self` lives; work that uses it must be queued on the device's stream.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The device that owns the memory.
    pub fn device(&self) -> &HipDevice {
        &self.device
    }

    /// A new buffer of the same size holding a copy of this one (queued on the device's
    /// stream, ordered after the work that writes `self`).
    pub fn try_clone(&self) -> Result<Self> {
        let mut copy = self.device.alloc(self.bytes)?;
        self.device.copy(self, &mut copy)?;
        Ok(copy)
    }

    fn as_mut_ptr(&self) -> *mut c_void {
        self.ptr as usize as *mut c_void
    }
}

impl Drop for HipStorage {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let device = &self.device;
        if !device.bind_for_release() {
            return;
        }
        // SAFETY: `ptr` was returned by hipMalloc on this device and is freed once, here;
        // hipFree waits for the device's queued work first (module docs).
        let code = unsafe { (device.rt().free)(self.as_mut_ptr()) };
        // A sticky code is recorded as the device's fault; nothing else can be done in drop.
        let _ = device.check("hipFree", code, Origin::Other);
    }
}

impl fmt::Debug for HipStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HipStorage")
            .field("device", &self.device.ordinal())
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl HipDevice {
    /// `Ok` when `s` is memory of this device.
    fn owns(&self, s: &HipStorage, role: &str) -> Result<()> {
        if s.device == *self {
            Ok(())
        } else {
            Err(device_error(format!(
                "the {role} buffer is memory of AMD GPU {}, used on AMD GPU {}",
                s.device.ordinal(),
                self.ordinal()
            )))
        }
    }

    /// `bytes` bytes of uninitialised memory (nothing allocated for 0).
    pub(super) fn alloc(&self, bytes: usize) -> Result<HipStorage> {
        self.bind()?;
        let mut storage = HipStorage {
            ptr: 0,
            bytes,
            device: self.clone(),
        };
        if bytes == 0 {
            return Ok(storage);
        }
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the device is current on this thread.
        let code = unsafe { (self.rt().malloc)(&mut p, bytes) };
        self.check(&format!("hipMalloc of {bytes} bytes"), code, Origin::Other)?;
        if p.is_null() {
            return Err(device_error(format!(
                "hipMalloc of {bytes} bytes on AMD GPU {} returned success and a null pointer",
                self.ordinal()
            )));
        }
        storage.ptr = p as usize as u64;
        Ok(storage)
    }

    /// A buffer of `bytes` zero bytes (the fill is queued on the device's stream, so work
    /// queued after it sees zeros). Nothing is allocated for 0 bytes.
    pub fn zeros_bytes(&self, bytes: usize) -> Result<HipStorage> {
        let mut s = self.alloc(bytes)?;
        self.fill_zeros(&mut s)?;
        Ok(s)
    }

    /// A new buffer holding `data` (the copy has finished when this returns).
    pub fn upload_bytes(&self, data: &[u8]) -> Result<HipStorage> {
        let mut s = self.alloc(data.len())?;
        self.write_bytes(&mut s, 0, data)?;
        Ok(s)
    }

    /// A new buffer holding plain-old-data values (kernel metadata, parameter arrays).
    pub fn upload_pod<T: bytemuck::Pod>(&self, data: &[T]) -> Result<HipStorage> {
        self.upload_bytes(bytemuck::cast_slice(data))
    }

    /// Copies `data` into `dst` starting at element `offset_elems` (in elements of `T`),
    /// ordered after the work already queued on the stream; finished when this returns.
    /// Errors when the elements do not fit in `dst`.
    pub fn write_pod<T: bytemuck::Pod>(
        &self,
        dst: &mut HipStorage,
        offset_elems: usize,
        data: &[T],
    ) -> Result<()> {
        let elem = std::mem::size_of::<T>();
        let offset = offset_elems.checked_mul(elem).ok_or_else(|| {
            Error::overflow(
                "HIP write offset",
                format!("{offset_elems} elements of {elem} bytes"),
            )
        })?;
        self.write_bytes(dst, offset, bytemuck::cast_slice(data))
    }

    /// Copies `bytes` into `dst` at byte `offset` (bounds checked); finished on return.
    fn write_bytes(&self, dst: &mut HipStorage, offset: usize, bytes: &[u8]) -> Result<()> {
        self.owns(dst, "destination")?;
        if offset
            .checked_add(bytes.len())
            .is_none_or(|end| end > dst.bytes)
        {
            return Err(device_error(format!(
                "writing {} bytes at byte offset {offset} into a buffer of {} bytes",
                bytes.len(),
                dst.bytes
            )));
        }
        if bytes.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // In bounds (checked above), so the sum is at most the allocation's last address + 1.
        let at = (dst.ptr as usize + offset) as *mut c_void;
        // SAFETY: `at .. at + len` lies inside a live allocation of this device (checked); the
        // source is host memory the runtime only reads (the header's `void*` is not written);
        // the copy is waited for below, before `bytes` can be released.
        let code = unsafe {
            (self.rt().memcpy_htod_async)(
                at,
                bytes.as_ptr() as *mut c_void,
                bytes.len(),
                self.stream(),
            )
        };
        self.check(
            &format!("hipMemcpyHtoDAsync of {} bytes", bytes.len()),
            code,
            Origin::Other,
        )?;
        self.synchronize()
    }

    /// The bytes of `s` (ordered after the work queued before it; waits for it).
    pub fn download_bytes(&self, s: &HipStorage) -> Result<Vec<u8>> {
        self.owns(s, "source")?;
        self.bind()?;
        let mut host = vec![0u8; s.bytes];
        if s.bytes == 0 {
            return Ok(host);
        }
        // SAFETY: `s` is a live allocation of `s.bytes` bytes of this device and `host` has
        // as many; the stream is synchronised before `host` is read or released.
        let code = unsafe {
            (self.rt().memcpy_dtoh_async)(
                host.as_mut_ptr().cast::<c_void>(),
                s.as_mut_ptr(),
                s.bytes,
                self.stream(),
            )
        };
        self.check(
            &format!("hipMemcpyDtoHAsync of {} bytes", s.bytes),
            code,
            Origin::Other,
        )?;
        self.synchronize()?;
        Ok(host)
    }

    /// The contents of `s` as values of `T` (its length must be a multiple of `T`'s size).
    pub fn download_pod<T: bytemuck::Pod>(&self, s: &HipStorage) -> Result<Vec<T>> {
        let bytes = self.download_bytes(s)?;
        let size = std::mem::size_of::<T>();
        if size == 0 || bytes.len() % size != 0 {
            return Err(device_error(format!(
                "a buffer of {} bytes is not a whole number of {size}-byte values",
                bytes.len()
            )));
        }
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Queues a device-to-device copy of all of `src` into the start of `dst` on the
    /// device's stream. Errors when `dst` is smaller than `src`.
    pub fn copy(&self, src: &HipStorage, dst: &mut HipStorage) -> Result<()> {
        self.owns(src, "source")?;
        self.owns(dst, "destination")?;
        if dst.bytes < src.bytes {
            return Err(device_error(format!(
                "copy of {} bytes into a buffer of {} bytes",
                src.bytes, dst.bytes
            )));
        }
        if src.bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both are live allocations of this device, `dst` at least `src.bytes` long
        // (checked); distinct buffers (one is borrowed mutably), so they do not overlap; the
        // copy is ordered on the stream with every other use of them.
        let code = unsafe {
            (self.rt().memcpy_dtod_async)(
                dst.as_mut_ptr(),
                src.as_mut_ptr(),
                src.bytes,
                self.stream(),
            )
        };
        self.check(
            &format!("hipMemcpyDtoDAsync of {} bytes", src.bytes),
            code,
            Origin::Other,
        )
    }

    /// Queues a zero fill of all of `s` on the device's stream.
    pub fn fill_zeros(&self, s: &mut HipStorage) -> Result<()> {
        self.owns(s, "filled")?;
        if s.bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: a live allocation of `s.bytes` bytes of this device; ordered on the stream.
        let code = unsafe { (self.rt().memset_async)(s.as_mut_ptr(), 0, s.bytes, self.stream()) };
        self.check(
            &format!("hipMemsetAsync of {} bytes", s.bytes),
            code,
            Origin::Other,
        )
    }
}
