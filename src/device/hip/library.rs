//! Finding ROCm's shared libraries: by bare name first (so `LD_LIBRARY_PATH`, the binary's
//! RUNPATH, `ld.so.cache` and the system folders apply, as for any `dlopen`), then under
//! `$ROCM_PATH/lib` and `/opt/rocm/lib`, where AMD's installers put it without telling the
//! loader. Opening and binding them is [`crate::device::library`]'s.

use std::path::PathBuf;
use std::sync::OnceLock;

pub(crate) use crate::device::library::{bindings, Library};

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

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
