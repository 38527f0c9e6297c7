//! The one rule the GPU runtimes that enumerate devices (wgpu's adapters, Vulkan's physical
//! devices) share for `POLYATTN_DEVICE`: an index into the runtime's ranked list, or a
//! case-insensitive substring of a device name; anything else is an error that lists the
//! devices, never a panic.

/// The variable naming the device a runtime opens: an index into its ranked list, or a
/// case-insensitive substring of a device name.
pub const DEVICE_ENV: &str = "POLYATTN_DEVICE";

/// The index `wanted` (the value of variable `var`) picks in `names` (ranked, best first),
/// or a message saying why it picks none.
pub(crate) fn pick(names: &[String], wanted: &str, var: &str) -> Result<usize, String> {
    let wanted = wanted.trim();
    match wanted.parse::<usize>() {
        Ok(i) if i < names.len() => Ok(i),
        Ok(i) => Err(format!(
            "{var}={i} is out of range; devices: {}",
            list(names)
        )),
        Err(_) => pick_name(names, wanted, var),
    }
}

/// The first of `names` that contains `wanted` (case-insensitive), or why none does.
pub(crate) fn pick_name(names: &[String], wanted: &str, var: &str) -> Result<usize, String> {
    let w = wanted.trim().to_ascii_lowercase();
    names
        .iter()
        .position(|n| n.to_ascii_lowercase().contains(&w))
        .ok_or_else(|| {
            format!(
                "{var}={} matches no device; devices: {}",
                wanted.trim(),
                list(names)
            )
        })
}

fn list(names: &[String]) -> String {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{i}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_or_name() {
        let names = vec!["NVIDIA H200".to_string(), "llvmpipe (LLVM 15)".to_string()];
        assert_eq!(pick(&names, "1", "V"), Ok(1));
        assert_eq!(pick(&names, " h200 ", "V"), Ok(0));
        assert_eq!(pick(&names, "LLVMpipe", "V"), Ok(1));
        let e = pick(&names, "2", "V").unwrap_err();
        assert!(
            e.contains("out of range") && e.contains("1: llvmpipe"),
            "{e}"
        );
        let e = pick(&names, "radeon", "V").unwrap_err();
        assert!(
            e.contains("matches no device") && e.contains("0: NVIDIA H200"),
            "{e}"
        );
        // By name only: a digit is a substring like any other.
        assert_eq!(pick_name(&names, "15", "V"), Ok(1));
    }
}
