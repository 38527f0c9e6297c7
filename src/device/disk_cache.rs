//! What the runtimes' on-disk kernel caches share (the CUDA cubins, the HIP code objects):
//! the directory and the key hash, so that both follow one rule.

use std::path::PathBuf;

/// FNV-1a over `parts`, each followed by a separator byte so that ("ab", "c") and ("a", "bc")
/// differ. Deterministic across runs and builds (a cache key must be), unlike `RandomState`.
pub(crate) fn fnv1a(parts: &[&[u8]]) -> u64 {
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

/// The kernel cache directory: `$POLYATTN_CACHE_DIR`, else `$XDG_CACHE_HOME/polyattn`, else
/// `$HOME/.cache/polyattn`; `None` when none is set (the caches are then skipped).
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("POLYATTN_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("polyattn"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("polyattn"))
}
