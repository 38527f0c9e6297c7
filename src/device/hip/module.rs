//! Code objects on a [`HipDevice`]: loaded modules cached in memory by the caller's key
//! ([`HipDevice::function`]), and compiled code objects cached on disk
//! ([`compile_cached`]), so a process does not wait for hiprtc again for a kernel an earlier
//! one compiled.
//!
//! Disk cache: the directory rule of the CUDA runtime's cubin cache —
//! `$POLYATTN_CACHE_DIR`, else `$XDG_CACHE_HOME/polyattn`, else `$HOME/.cache/polyattn` —
//! with one `.hsaco` file per (source, full target ID, options, ROCm version), named by an
//! FNV-1a hash of all four (the same hash as the cubin cache's: deterministic across runs
//! and machines, unlike std's `RandomState`). Best effort: an I/O error, or a file that is
//! not a whole code object (a truncated write), only means a recompile.

use std::ffi::{c_int, c_void, CString};
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::device::{HipDevice, Origin};
use super::runtime::{
    runtime, FunctionHandle, ModuleHandle, FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
    FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
};
use super::{base_arch, device_error, hiprtc, RocmVersion, HIP_SUCCESS};
use crate::device::disk_cache::{cache_dir, fnv1a};
use crate::error::Result;

/// A loaded module (`hipModuleLoadData`), unloaded when the last [`HipFunction`] of it and
/// the device's cache have let go of it.
pub(super) struct HipModule {
    raw: ModuleHandle,
    device: c_int,
    /// The key it is cached under, for messages.
    key: String,
    /// The code object, kept for the module's life: the runtime keeps a pointer to the image
    /// it was loaded from (`FatBinaryInfo`, ROCm/clr `rocm-6.2.2` `hip_code_object.cpp`), and
    /// nothing documents that it is not read again.
    _image: Vec<u8>,
}

// SAFETY: the module handle is only passed to the HIP runtime, which locks its module tables
// (`PlatformState::lock_`, ROCm/clr `hip_platform.cpp`); it is never dereferenced here and is
// unloaded once, in `Drop`.
unsafe impl Send for HipModule {}
// SAFETY: as for `Send`: shared use only looks functions up, which the runtime serialises.
unsafe impl Sync for HipModule {}

impl Drop for HipModule {
    fn drop(&mut self) {
        let Ok(rt) = runtime() else { return };
        // SAFETY: the handle came from hipModuleLoadData on `device` and is unloaded once.
        unsafe {
            if (rt.set_device)(self.device) == HIP_SUCCESS {
                let _ = (rt.module_unload)(self.raw);
            }
        }
    }
}

/// An entry point of a loaded module, ready for [`HipDevice::launch`]. Keeps its module
/// loaded.
#[derive(Clone)]
pub struct HipFunction {
    raw: FunctionHandle,
    module: Arc<HipModule>,
    name: String,
    /// The device ordinal it belongs to.
    ordinal: usize,
    max_threads_per_block: Option<u32>,
    static_shared_bytes: Option<u32>,
}

// SAFETY: the handle is only passed to the runtime, which locks a function for the length of
// a launch (`function->dflock_` in `hip_module.cpp`, ROCm/hipamd `rocm-5.2.3` and ROCm/clr
// `rocm-6.2.2`), so launches of one function from several threads are serialised there.
unsafe impl Send for HipFunction {}
// SAFETY: as for `Send`.
unsafe impl Sync for HipFunction {}

impl HipFunction {
    /// The entry point's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key its module is cached under on the device.
    pub fn module_key(&self) -> &str {
        &self.module.key
    }

    /// The ordinal of the device it was loaded on.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The most threads a block of it may have (its launch bounds, 1024 without
    /// `__launch_bounds__`), where the runtime reports it.
    pub fn max_threads_per_block(&self) -> Option<u32> {
        self.max_threads_per_block
    }

    /// Its static shared memory (LDS) in bytes, where the runtime reports it; a launch's
    /// dynamic shared memory comes on top.
    pub fn static_shared_bytes(&self) -> Option<u32> {
        self.static_shared_bytes
    }

    pub(super) fn raw(&self) -> FunctionHandle {
        self.raw
    }
}

impl fmt::Debug for HipFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HipFunction")
            .field("name", &self.name)
            .field("module", &self.module.key)
            .field("ordinal", &self.ordinal)
            .field("max_threads_per_block", &self.max_threads_per_block)
            .field("static_shared_bytes", &self.static_shared_bytes)
            .finish()
    }
}

impl HipDevice {
    /// Entry point `name` of the module cached under `key`, or of the code object `build`
    /// produces (a hiprtc code object, e.g. from [`compile_cached`]), loaded on this device
    /// and cached for the life of the process. `key` must name the code exactly (source,
    /// target, options): a second call with the same key never calls `build`.
    ///
    /// Errors: `build`'s own; bytes that are not a whole code object (an AMDGPU ELF or an
    /// uncompressed offload bundle, checked before the runtime sees them); a code object the
    /// runtime refuses (another target); a module without `name` ("module `key` has no
    /// function `name`").
    pub fn function(
        &self,
        key: &str,
        build: impl FnOnce() -> Result<Vec<u8>>,
        name: &str,
    ) -> Result<HipFunction> {
        let c_name = CString::new(name)
            .map_err(|_| device_error(format!("function name {name:?} contains a NUL byte")))?;
        let module = self.module(key, build)?;
        self.bind()?;
        let mut raw: FunctionHandle = std::ptr::null_mut();
        // SAFETY: live module of this device (current on this thread); NUL-terminated name
        // that outlives the call; out-pointer to a local.
        let code =
            unsafe { (self.rt().module_get_function)(&mut raw, module.raw, c_name.as_ptr()) };
        if code != HIP_SUCCESS || raw.is_null() {
            let why = self
                .check("hipModuleGetFunction", code, Origin::Other)
                .err()
                .map_or_else(|| "a null function".to_string(), |e| e.to_string());
            return Err(device_error(format!(
                "module {key} has no function {name} ({why}); kernels looked up by name must \
                 be extern \"C\""
            )));
        }
        let attribute = |attr: c_int| -> Option<u32> {
            let mut v: c_int = 0;
            // SAFETY: live function; out-pointer to a local.
            let code = unsafe { (self.rt().func_get_attribute)(&mut v, attr, raw) };
            (code == HIP_SUCCESS)
                .then(|| u32::try_from(v).ok())
                .flatten()
        };
        Ok(HipFunction {
            raw,
            name: name.to_string(),
            ordinal: self.ordinal(),
            max_threads_per_block: attribute(FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
                .filter(|&n| n > 0),
            static_shared_bytes: attribute(FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
            module,
        })
    }

    /// The module cached under `key`, or the one `build` produces, loaded and cached. The
    /// cache stays locked while `build` runs, so one key is never compiled twice at once.
    fn module(&self, key: &str, build: impl FnOnce() -> Result<Vec<u8>>) -> Result<Arc<HipModule>> {
        let mut modules = self.inner.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = modules.get(key) {
            return Ok(m.clone());
        }
        self.check_healthy()?;
        let image = build()?;
        // hipModuleLoadData takes no length: only a code object whose headers lie within the
        // bytes is handed to it, so the runtime cannot be led to read past them.
        if !is_whole_code_object(&image) {
            return Err(device_error(format!(
                "module {key}: {} bytes that are not a whole AMDGPU code object (an ELF64 for \
                 amdgcn, or an uncompressed clang offload bundle), starting {:02x?}",
                image.len(),
                &image[..image.len().min(8)]
            )));
        }
        self.bind()?;
        let mut raw: ModuleHandle = std::ptr::null_mut();
        // SAFETY: the image is a whole code object (checked above) in host memory, kept alive
        // with the module (see `HipModule::_image`); out-pointer to a local. The runtime
        // returns an error for a code object of another target.
        let code =
            unsafe { (self.rt().module_load_data)(&mut raw, image.as_ptr().cast::<c_void>()) };
        self.check(
            &format!(
                "hipModuleLoadData of module {key} ({} bytes) for {}",
                image.len(),
                self.arch()
            ),
            code,
            Origin::Other,
        )?;
        if raw.is_null() {
            return Err(device_error(format!(
                "hipModuleLoadData of module {key} returned success and a null module"
            )));
        }
        let module = Arc::new(HipModule {
            raw,
            device: self.inner.dev,
            key: key.to_string(),
            _image: image,
        });
        modules.insert(key.to_string(), module.clone());
        Ok(module)
    }
}

/// What one cached code object is compiled from.
#[derive(Clone, Copy, Debug)]
struct CacheKey<'a> {
    source: &'a str,
    program_name: &'a str,
    arch: &'a str,
    options: &'a [String],
    version: RocmVersion,
}

impl CacheKey<'_> {
    /// The hash of (source, full target ID, options, ROCm version with its patch number).
    fn hash(&self) -> u64 {
        let version = format!(
            "rocm {}.{}.{}",
            self.version.major, self.version.minor, self.version.patch
        );
        let count = self.options.len().to_le_bytes();
        let mut parts: Vec<&[u8]> = vec![
            b"polyattn hip code object v1",
            self.source.as_bytes(),
            self.arch.as_bytes(),
            version.as_bytes(),
            &count,
        ];
        parts.extend(self.options.iter().map(|o| o.as_bytes()));
        fnv1a(&parts)
    }

    /// `paged_attention-gfx90a-0123456789abcdef.hsaco`: the program name (without `.hip`,
    /// reduced to file-name characters) and processor for people, the hash for the rest.
    fn file_name(&self) -> String {
        let stem = self
            .program_name
            .strip_suffix(".hip")
            .unwrap_or(self.program_name);
        let stem: String = stem
            .chars()
            .take(64)
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let arch: String = base_arch(self.arch)
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect();
        format!("{stem}-{arch}-{:016x}.hsaco", self.hash())
    }
}

/// Reads a little-endian integer of `N` bytes at `at`, if the bytes are there.
fn le_at<const N: usize>(bytes: &[u8], at: usize) -> Option<[u8; N]> {
    bytes.get(at..at.checked_add(N)?)?.try_into().ok()
}

/// Whether `bytes` is a whole code object: an AMDGPU ELF64 whose section header table ends
/// inside the file (it is written last, so a truncated file fails), or a clang offload bundle
/// whose every entry lies inside the file.
fn is_whole_code_object(bytes: &[u8]) -> bool {
    const EM_AMDGPU: u16 = 224;
    if bytes.starts_with(b"\x7fELF") {
        // ELFCLASS64, little-endian; e_machine at 0x12, e_shoff at 0x28, e_shentsize at
        // 0x3a, e_shnum at 0x3c (the ELF-64 header).
        let (Some(machine), Some(shoff), Some(shentsize), Some(shnum)) = (
            le_at::<2>(bytes, 0x12),
            le_at::<8>(bytes, 0x28),
            le_at::<2>(bytes, 0x3a),
            le_at::<2>(bytes, 0x3c),
        ) else {
            return false;
        };
        let shnum = u64::from(u16::from_le_bytes(shnum));
        let table = u64::from(u16::from_le_bytes(shentsize)) * shnum;
        return bytes[4] == 2
            && bytes[5] == 1
            && u16::from_le_bytes(machine) == EM_AMDGPU
            && shnum > 0
            && u64::from_le_bytes(shoff)
                .checked_add(table)
                .is_some_and(|end| end <= bytes.len() as u64);
    }
    const BUNDLE: &[u8] = b"__CLANG_OFFLOAD_BUNDLE__";
    if let Some(rest) = bytes.strip_prefix(BUNDLE) {
        // u64 entry count, then per entry u64 offset, u64 size, u64 triple length, triple.
        let Some(count) = le_at::<8>(rest, 0).map(u64::from_le_bytes) else {
            return false;
        };
        if count == 0 || count > 1024 {
            return false;
        }
        let mut at = BUNDLE.len() + 8;
        for _ in 0..count {
            let (Some(offset), Some(size), Some(triple)) = (
                le_at::<8>(bytes, at).map(u64::from_le_bytes),
                le_at::<8>(bytes, at + 8).map(u64::from_le_bytes),
                le_at::<8>(bytes, at + 16).map(u64::from_le_bytes),
            ) else {
                return false;
            };
            if offset
                .checked_add(size)
                .is_none_or(|end| end > bytes.len() as u64)
            {
                return false;
            }
            // `at` stays within the file, so the additions above cannot overflow.
            match usize::try_from(triple)
                .ok()
                .and_then(|t| (at + 24).checked_add(t))
            {
                Some(next) if next <= bytes.len() => at = next,
                _ => return false,
            }
        }
        return true;
    }
    false
}

/// The cached code object for `key` in `dir`, if a whole one is there.
fn load_cached(dir: &Path, key: &CacheKey<'_>) -> Option<Vec<u8>> {
    let bytes = std::fs::read(dir.join(key.file_name())).ok()?;
    is_whole_code_object(&bytes).then_some(bytes)
}

/// Stores `code` for `key` in `dir` (created if needed), through a temporary file renamed
/// into place, so a reader never sees half a file. Best effort: `false` when it failed.
fn store_cached(dir: &Path, key: &CacheKey<'_>, code: &[u8]) -> bool {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    if !is_whole_code_object(code) || std::fs::create_dir_all(dir).is_err() {
        return false;
    }
    let path = dir.join(key.file_name());
    // Unique per process and call: two threads storing the same key do not share a file.
    let tmp = path.with_extension(format!(
        "tmp{}-{}",
        std::process::id(),
        SEQUENCE.fetch_add(1, Ordering::Relaxed)
    ));
    if std::fs::write(&tmp, code).is_err() {
        let _ = std::fs::remove_file(&tmp);
        return false;
    }
    if std::fs::rename(&tmp, &path).is_err() {
        let _ = std::fs::remove_file(&tmp);
        return false;
    }
    true
}

/// Compiles HIP C++ `source` for the target `arch` (a full target ID, [`HipDevice::arch`])
/// with `options`, as [`hiprtc::compile`] does, through the on-disk cache (module docs): a
/// code object an earlier run compiled from the same source, target, options and ROCm
/// version is read back instead. Needs no GPU.
///
/// Errors ([`crate::error::Error::Device`]): no hiprtc here; a target this ROCm does not know
/// (checked before the cache is looked at); a compile error, with hiprtc's log.
pub fn compile_cached(
    source: &str,
    program_name: &str,
    arch: &str,
    options: &[String],
) -> Result<Vec<u8>> {
    compile_cached_in(cache_dir().as_deref(), source, program_name, arch, options)
}

/// [`compile_cached`] with the cache in `dir` (`None`: no disk cache).
fn compile_cached_in(
    dir: Option<&Path>,
    source: &str,
    program_name: &str,
    arch: &str,
    options: &[String],
) -> Result<Vec<u8>> {
    let version = hiprtc::hiprtc_version()
        .map_err(|why| device_error(format!("hiprtc unavailable: {why}")))?;
    if let Some(problem) = hiprtc::arch_problem(version, arch) {
        return Err(device_error(problem));
    }
    let key = CacheKey {
        source,
        program_name,
        arch,
        options,
        version,
    };
    if let Some(code) = dir.and_then(|d| load_cached(d, &key)) {
        return Ok(code);
    }
    let object = hiprtc::compile(source, program_name, arch, options)?;
    if let Some(d) = dir {
        store_cached(d, &key, &object.code);
    }
    Ok(object.code)
}

#[cfg(test)]
mod tests {
    use super::*;

    const V52: RocmVersion = RocmVersion {
        major: 5,
        minor: 2,
        patch: 21153,
    };

    /// A minimal AMDGPU ELF64: a header whose section table (3 entries of 64 bytes) ends
    /// exactly at the end of the file.
    fn fake_elf() -> Vec<u8> {
        let mut b = vec![0u8; 256 + 3 * 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2; // ELFCLASS64
        b[5] = 1; // little-endian
        b[0x12..0x14].copy_from_slice(&224u16.to_le_bytes()); // EM_AMDGPU
        b[0x28..0x30].copy_from_slice(&256u64.to_le_bytes()); // e_shoff
        b[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
        b[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes()); // e_shnum
        b[100] = 0xab;
        b
    }

    fn fake_bundle() -> Vec<u8> {
        let triple = b"hipv4-amdgcn-amd-amdhsa--gfx90a";
        let mut b = b"__CLANG_OFFLOAD_BUNDLE__".to_vec();
        b.extend(1u64.to_le_bytes());
        let offset = (b.len() + 24 + triple.len()) as u64;
        b.extend(offset.to_le_bytes());
        b.extend(16u64.to_le_bytes());
        b.extend((triple.len() as u64).to_le_bytes());
        b.extend(triple);
        b.extend([7u8; 16]);
        b
    }

    fn key<'a>(source: &'a str, arch: &'a str, options: &'a [String]) -> CacheKey<'a> {
        CacheKey {
            source,
            program_name: "paged_attention.hip",
            arch,
            options,
            version: V52,
        }
    }

    #[test]
    fn whole_code_objects_are_recognised() {
        let elf = fake_elf();
        assert!(is_whole_code_object(&elf));
        assert!(!is_whole_code_object(&elf[..elf.len() - 1]), "truncated");
        assert!(!is_whole_code_object(&elf[..40]));
        let mut x86 = elf.clone();
        x86[0x12..0x14].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
        assert!(!is_whole_code_object(&x86));
        let bundle = fake_bundle();
        assert!(is_whole_code_object(&bundle));
        assert!(
            !is_whole_code_object(&bundle[..bundle.len() - 1]),
            "truncated"
        );
        assert!(!is_whole_code_object(b"__CLANG_OFFLOAD_BUNDLE__"));
        assert!(!is_whole_code_object(b""));
        assert!(!is_whole_code_object(b"CCOB compressed"));
        // A triple length that would run past the end (or wrap) is refused, not a panic.
        let mut huge = fake_bundle();
        let at = 24 + 8 + 16;
        huge[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(!is_whole_code_object(&huge));
        let mut many = fake_bundle();
        many[24..32].copy_from_slice(&2u64.to_le_bytes());
        assert!(!is_whole_code_object(&many));
    }

    #[test]
    fn the_hash_is_deterministic_and_covers_every_input() {
        let opts = vec!["-DPA_WAVE=64".to_string()];
        let base = key("k", "gfx90a:sramecc+:xnack-", &opts);
        // The same inputs give the same name in every process (no RandomState).
        assert_eq!(
            base.hash(),
            key("k", "gfx90a:sramecc+:xnack-", &opts).hash()
        );
        // The FNV-1a constants and separator (values from an independent implementation).
        assert_eq!(fnv1a(&[b"a"]), 0x089b_c907_b544_c769);
        assert_eq!(fnv1a(&[b"ab", b"c"]), 0x20ba_9b30_25a8_b421);
        assert_eq!(fnv1a(&[b"a", b"bc"]), 0xa0a3_542c_19b9_00ab);
        let name = base.file_name();
        assert!(name.starts_with("paged_attention-gfx90a-"), "{name}");
        assert!(name.ends_with(".hsaco"), "{name}");
        let other_opts = vec!["-DPA_WAVE=32".to_string()];
        let split_opts = vec!["-DPA_WAVE=".to_string(), "64".to_string()];
        let variants = [
            key("k2", "gfx90a:sramecc+:xnack-", &opts),
            key("k", "gfx90a", &opts),
            key("k", "gfx90a:sramecc-:xnack-", &opts),
            key("k", "gfx90a:sramecc+:xnack-", &other_opts),
            key("k", "gfx90a:sramecc+:xnack-", &split_opts),
            key("k", "gfx90a:sramecc+:xnack-", &[]),
            CacheKey {
                version: RocmVersion { patch: 0, ..V52 },
                ..base
            },
        ];
        for v in &variants {
            assert_ne!(v.hash(), base.hash(), "{v:?}");
        }
        // Odd program names still make one plain file name.
        let odd = CacheKey {
            program_name: "../a b/c.hip",
            ..base
        };
        assert!(!odd.file_name().contains('/'), "{}", odd.file_name());
    }

    #[test]
    fn the_disk_cache_round_trips_a_code_object() {
        let dir = std::env::temp_dir().join(format!(
            "polyattn-hip-cache-test-{}-{:x}",
            std::process::id(),
            fnv1a(&[format!("{:?}", std::time::SystemTime::now()).as_bytes()])
        ));
        let opts = vec!["-DPA_WAVE=64".to_string()];
        let k = key("extern \"C\" __global__ void k() {}", "gfx90a", &opts);
        assert_eq!(load_cached(&dir, &k), None, "empty cache");
        for code in [fake_elf(), fake_bundle()] {
            assert!(store_cached(&dir, &k, &code));
            assert_eq!(load_cached(&dir, &k).as_deref(), Some(code.as_slice()));
        }
        // Another key is another file.
        let k2 = key("extern \"C\" __global__ void k() {}", "gfx1030", &opts);
        assert_eq!(load_cached(&dir, &k2), None);
        // A truncated file (a crash mid-write elsewhere) is a miss, not a broken module.
        let elf = fake_elf();
        std::fs::write(dir.join(k.file_name()), &elf[..elf.len() - 10]).unwrap();
        assert_eq!(load_cached(&dir, &k), None);
        // What is not a code object is not stored.
        assert!(!store_cached(&dir, &k2, b"not a code object"));
        // No temporary file is left behind.
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    const DOUBLE: &str = r#"extern "C" __global__ void k(float* p) { p[threadIdx.x] *= 2.0f; }"#;

    /// Through hiprtc where it loads (ROCm 5.2 here, no GPU needed): a miss compiles and
    /// stores, a hit returns the same bytes without compiling.
    #[test]
    fn compile_cached_compiles_once() {
        if let Err(why) = hiprtc::hiprtc_status() {
            eprintln!("SKIP compile_cached_compiles_once: {why}");
            return;
        }
        let dir = std::env::temp_dir().join(format!(
            "polyattn-hip-compile-test-{}-{:x}",
            std::process::id(),
            fnv1a(&[format!("{:?}", std::time::SystemTime::now()).as_bytes()])
        ));
        let opts: Vec<String> = Vec::new();
        let first = compile_cached_in(Some(&dir), DOUBLE, "double.hip", "gfx90a", &opts).unwrap();
        assert!(is_whole_code_object(&first), "{} bytes", first.len());
        let files: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(files.len(), 1, "{files:?}");
        // A hit: the stored file is what comes back (marked to prove no recompile).
        let version = hiprtc::hiprtc_version().unwrap();
        let k = CacheKey {
            source: DOUBLE,
            program_name: "double.hip",
            arch: "gfx90a",
            options: &opts,
            version,
        };
        let mut marked = fake_elf();
        marked[200] = 0x5a;
        assert!(store_cached(&dir, &k, &marked));
        let second = compile_cached_in(Some(&dir), DOUBLE, "double.hip", "gfx90a", &opts).unwrap();
        assert_eq!(second, marked);
        // An unknown target is refused before the cache or hiprtc sees it.
        let e = compile_cached_in(Some(&dir), DOUBLE, "double.hip", "gfx9999", &opts).unwrap_err();
        assert!(e.to_string().contains("does not know gfx9999"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
