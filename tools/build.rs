//! Records the git commit the tools are built from (`POLYATTN_BUILD_COMMIT`), so that
//! benchmark files name the code that ran. Why at build time: the GPU machine runs binaries
//! built here, beside a copy of the tree whose `.git` need not match them.

use std::path::Path;
use std::process::Command;

fn main() {
    // A checkout's HEAD and branch refs (this package is `tools/` of the repository). Without
    // any (a worktree, whose `.git` is a file, or no git at all) cargo reruns this script
    // whenever a file of the package changes.
    for p in ["../.git/HEAD", "../.git/refs/heads", "../.git/packed-refs"] {
        if Path::new(p).exists() {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!("cargo:rustc-env=POLYATTN_BUILD_COMMIT={commit}");
}
