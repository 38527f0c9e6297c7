//! Opening a shared library found at run time, and the thin bindings over it: what the HIP
//! runtime (`libamdhip64`, hiprtc) and NCCL are reached through.
//!
//! An opened library is kept alive for the whole process (each is held in a `OnceLock` by
//! its user), so the function pointers taken from it stay valid.
//!
//! [`bindings!`] declares a table of C functions; every symbol is resolved once, when the
//! table is built. A missing symbol is not an error until the function is used: then its
//! accessor returns a sentence naming the library and the symbol (never a panic), so one
//! version's extra entry points (`hipGetDevicePropertiesR0600`) do not stop another version's
//! library from loading.

use std::path::{Path, PathBuf};

/// An opened shared library and the name or path it was opened by.
pub(crate) struct Library {
    lib: libloading::Library,
    /// The candidate that loaded: a bare name (`libamdhip64.so.5`) or a path.
    opened: PathBuf,
}

impl Library {
    /// Opens the first of `candidates` that loads.
    pub(crate) fn open_first(candidates: &[PathBuf]) -> Option<Library> {
        for c in candidates {
            // SAFETY: loading a vendor library (ROCm, NCCL) runs its initialisers, which only
            // set up the library's own state; nothing of ours runs before they return.
            if let Ok(lib) = unsafe { libloading::Library::new(c) } {
                return Some(Library {
                    lib,
                    opened: c.clone(),
                });
            }
        }
        None
    }

    /// The name or path the library was opened by, for messages.
    pub(crate) fn name(&self) -> String {
        self.opened.display().to_string()
    }

    /// The file name of the library's real file, symbolic links resolved
    /// (`libhiprtc.so.6.2.60200` for an opened `libhiprtc.so`), where it can be found: by
    /// resolving the path it was opened by, or, for a bare name, from the process's mappings
    /// (`/proc/self/maps`; Linux only).
    pub(crate) fn real_file_name(&self) -> Option<String> {
        let stem = self.opened.file_name()?.to_str()?.to_string();
        if self.opened.components().count() > 1 {
            let real = std::fs::canonicalize(&self.opened).ok()?;
            return real.file_name()?.to_str().map(str::to_string);
        }
        // The stem up to ".so": `libhiprtc.so.6` is mapped as `libhiprtc.so.6.2.60200`.
        let prefix = match stem.find(".so") {
            Some(at) => &stem[..at + 3],
            None => stem.as_str(),
        };
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        maps.lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .filter_map(|p| Path::new(p).file_name()?.to_str())
            .find(|f| f.starts_with(prefix))
            .map(str::to_string)
    }

    /// The function `name` as a pointer of type `T`, or `None` when the library lacks it.
    ///
    /// # Safety
    /// `T` must be the `unsafe extern "C" fn` type of the symbol's C declaration.
    pub(crate) unsafe fn function<T: Copy>(&self, name: &str) -> Option<T> {
        // SAFETY: the caller names the symbol's type; the pointer is copied out of the
        // `Symbol`, which is sound because the library lives in a static for the whole
        // process (every `Library` is held in a `OnceLock` by its user).
        unsafe { self.lib.get::<T>(name).ok().map(|s| *s) }
    }
}

/// Declares a table of C functions of one library: a struct with one resolved-once pointer
/// per function, `resolve(&'static Library)` to build it, and one accessor per function that
/// returns the pointer or the sentence "`<library>` has no symbol `<name>`".
macro_rules! bindings {
    (
        $(#[$meta:meta])*
        $vis:vis struct $table:ident {
            $( $(#[$fmeta:meta])* fn $f:ident($($arg:ty),* $(,)?) -> $ret:ty; )*
        }
    ) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        $vis struct $table {
            lib: &'static crate::device::library::Library,
            $( $f: Option<unsafe extern "C" fn($($arg),*) -> $ret>, )*
        }

        #[allow(non_snake_case, dead_code)]
        impl $table {
            /// Resolves every function of the table in `lib`, once.
            fn resolve(lib: &'static crate::device::library::Library) -> Self {
                Self {
                    lib,
                    // SAFETY: each type is the function's C declaration (cited at the table).
                    $( $f: unsafe { lib.function(stringify!($f)) }, )*
                }
            }

            /// The library the table was resolved in.
            fn library(&self) -> &'static crate::device::library::Library {
                self.lib
            }

            $(
                $(#[$fmeta])*
                fn $f(&self) -> std::result::Result<unsafe extern "C" fn($($arg),*) -> $ret, String> {
                    self.$f.ok_or_else(|| {
                        format!("{} has no symbol {}", self.lib.name(), stringify!($f))
                    })
                }
            )*
        }
    };
}

pub(crate) use bindings;
