//! Finding and opening ROCm's shared libraries, and the thin bindings over them.
//!
//! A library is looked for by bare name first (so `LD_LIBRARY_PATH`, the binary's RUNPATH,
//! `ld.so.cache` and the system folders apply, as for any `dlopen`), then under
//! `$ROCM_PATH/lib` and `/opt/rocm/lib`, where AMD's installers put it without telling the
//! loader. An opened library is kept alive for the whole process (a `OnceLock`), so the
//! function pointers taken from it stay valid.
//!
//! [`bindings!`] declares a table of C functions; every symbol is resolved once, when the
//! table is built. A missing symbol is not an error until the function is used: then its
//! accessor returns a sentence naming the library and the symbol (never a panic), so one
//! ROCm version's extra entry points (`hipGetDevicePropertiesR0600`) do not stop another's
//! library from loading.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// An opened shared library and the name or path it was opened by.
pub(crate) struct Library {
    lib: libloading::Library,
    /// The candidate that loaded: a bare name (`libamdhip64.so.5`) or a path.
    opened: PathBuf,
}

impl Library {
    /// Opens the first of `candidates` that loads.
    fn open_first(candidates: &[PathBuf]) -> Option<Library> {
        for c in candidates {
            // SAFETY: loading a ROCm library runs its initialisers, which only set up the
            // runtime's own state; nothing of ours runs before they return.
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
        // process (every `Library` here is one of the `OnceLock`s below).
        unsafe { self.lib.get::<T>(name).ok().map(|s| *s) }
    }
}

/// The folders looked in after the loader's own search: `$ROCM_PATH/lib`, `/opt/rocm/lib`.
fn rocm_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(root) = std::env::var_os("ROCM_PATH").filter(|r| !r.is_empty()) {
        dirs.push(PathBuf::from(root).join("lib"));
    }
    let opt = PathBuf::from("/opt/rocm/lib");
    if !dirs.contains(&opt) {
        dirs.push(opt);
    }
    dirs
}

/// The places to look for each of `names`: each bare name (the loader's search), then each
/// name under `$ROCM_PATH/lib` and under `/opt/rocm/lib`.
pub(crate) fn candidates(names: &[&str]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = names.iter().map(PathBuf::from).collect();
    for d in &rocm_dirs() {
        out.extend(names.iter().map(|n| d.join(n)));
    }
    out
}

/// What [`candidates`] tries, in words: "libamdhip64.so, .so.7, .so.6, .so.5 on the loader
/// path and in /opt/rocm/lib".
pub(crate) fn searched(names: &[&str]) -> String {
    // "libamdhip64.so.7" shortened to ".so.7" after a first "libamdhip64.so".
    let first = names.first().copied().unwrap_or("");
    let stem = first.strip_suffix(".so").unwrap_or(first);
    let names: Vec<&str> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            if i == 0 {
                n
            } else {
                n.strip_prefix(stem).unwrap_or(n)
            }
        })
        .collect();
    let dirs: Vec<String> = rocm_dirs()
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    format!(
        "{} on the loader path and in {}",
        names.join(", "),
        dirs.join(" and ")
    )
}

/// The names `libamdhip64` is looked for by.
const AMDHIP64: &[&str] = &[
    "libamdhip64.so",
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
];

/// The names ROCm ≥ 6's separate hiprtc is looked for by.
pub(crate) const HIPRTC: &[&str] = &["libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6"];

/// The HIP runtime, `libamdhip64`, opened once. `Err` is the sentence to report.
pub(crate) fn amdhip64() -> std::result::Result<&'static Library, String> {
    static LIB: OnceLock<std::result::Result<Library, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        Library::open_first(&candidates(AMDHIP64)).ok_or_else(|| {
            format!(
                "libamdhip64 not found (no ROCm on this machine, or it is not on the loader \
                 path; tried {})",
                searched(AMDHIP64)
            )
        })
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// ROCm ≥ 6's separate `libhiprtc`, opened once. `Err` says what was tried (ROCm 5 has no
/// such library: its hiprtc is inside `libamdhip64`).
pub(crate) fn hiprtc() -> std::result::Result<&'static Library, String> {
    static LIB: OnceLock<std::result::Result<Library, String>> = OnceLock::new();
    LIB.get_or_init(|| Library::open_first(&candidates(HIPRTC)).ok_or_else(|| searched(HIPRTC)))
        .as_ref()
        .map_err(Clone::clone)
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
            lib: &'static crate::device::hip::library::Library,
            $( $f: Option<unsafe extern "C" fn($($arg),*) -> $ret>, )*
        }

        #[allow(non_snake_case, dead_code)]
        impl $table {
            /// Resolves every function of the table in `lib`, once.
            fn resolve(lib: &'static crate::device::hip::library::Library) -> Self {
                Self {
                    lib,
                    // SAFETY: each type is the function's C declaration (cited at the table).
                    $( $f: unsafe { lib.function(stringify!($f)) }, )*
                }
            }

            /// The library the table was resolved in.
            fn library(&self) -> &'static crate::device::hip::library::Library {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_names_come_before_the_rocm_folders() {
        let c = candidates(&["liba.so", "liba.so.6"]);
        assert_eq!(c[0], PathBuf::from("liba.so"));
        assert_eq!(c[1], PathBuf::from("liba.so.6"));
        assert!(c.contains(&PathBuf::from("/opt/rocm/lib/liba.so.6")));
        assert_eq!(
            c.iter()
                .filter(|p| p.as_path() == Path::new("/opt/rocm/lib/liba.so"))
                .count(),
            1
        );
        let s = searched(&["liba.so", "liba.so.7", "liba.so.6"]);
        assert!(
            s.starts_with("liba.so, .so.7, .so.6 on the loader path and in "),
            "{s}"
        );
        assert!(s.ends_with("/opt/rocm/lib"), "{s}");
    }
}
