//! SPIR-V for the WGSL family's cooperative-matrix shaders: the wgpu runtime compiles them
//! here ([`compile`]) and hands them to the driver as passthrough modules; the native Vulkan
//! runtime translates them itself and applies the same patch
//! ([`non_private_workgroup_accesses`]).
//!
//! Why not through wgpu's WGSL path: naga switches a module that uses cooperative matrices
//! to the Vulkan memory model (`MemoryModel Vulkan`, which `SPV_KHR_cooperative_matrix`
//! needs on the drivers wgpu targets) but emits its loads and stores without the
//! `NonPrivatePointer` memory operand. Under that model such accesses are *private*: a
//! workgroup barrier does not order them between invocations, so the shared-memory traffic
//! between a kernel's phases is unsynchronised. On the H200 (driver 580) the coop prefill
//! kernel then read stale scores and probabilities (outputs of ~1e4 where ~0.1 was due).
//! [`non_private_workgroup_accesses`] marks every load and store through a workgroup
//! pointer (cooperative-matrix loads / stores included) `NonPrivatePointer`, which makes
//! them obey the barriers' acquire / release semantics as in the GLSL memory model.
//!
//! The module is otherwise naga's own translation, with the capabilities the shader needs
//! and every index clamped into its array (`BoundsCheckPolicy::Restrict`: no access can
//! leave its buffer or workgroup array, as wgpu's own translation guarantees).

use naga::back::spv;
use naga::valid::{Capabilities, ValidationFlags, Validator};

/// SPIR-V opcodes the patch reads or rewrites.
const OP_TYPE_POINTER: u32 = 32;
const OP_VARIABLE: u32 = 59;
const OP_LOAD: u32 = 61;
const OP_STORE: u32 = 62;
const OP_ACCESS_CHAIN: u32 = 65;
const OP_IN_BOUNDS_ACCESS_CHAIN: u32 = 66;
const OP_COOP_LOAD: u32 = 4457;
const OP_COOP_STORE: u32 = 4458;
/// `StorageClass Workgroup`.
const WORKGROUP: u32 = 4;
/// `MemoryAccess NonPrivatePointer`.
const NON_PRIVATE_POINTER: u32 = 0x20;

/// Translates a WGSL module that says `enable wgpu_cooperative_matrix;` to SPIR-V whose
/// workgroup accesses obey barriers (see the module docs). Errors carry naga's message.
pub fn compile(source: &str) -> Result<Vec<u32>, String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    let caps =
        Capabilities::SUBGROUP | Capabilities::SHADER_FLOAT16 | Capabilities::COOPERATIVE_MATRIX;
    let info = Validator::new(ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| e.emit_to_string(source))?;
    let options = crate::device::spirv::spirv_options();
    let mut words =
        spv::write_vec(&module, &info, &options, None).map_err(|e| format!("SPIR-V: {e}"))?;
    non_private_workgroup_accesses(&mut words)?;
    Ok(words)
}

/// Adds `NonPrivatePointer` to every `OpLoad`, `OpStore`, `OpCooperativeMatrixLoadKHR` and
/// `OpCooperativeMatrixStoreKHR` whose pointer is in the Workgroup storage class (a
/// workgroup variable, or an access chain into one). Errors on a malformed module.
pub fn non_private_workgroup_accesses(words: &mut Vec<u32>) -> Result<(), String> {
    let mut pointer_types = std::collections::HashSet::new();
    let mut pointers = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(words.len() + words.len() / 16);
    out.extend_from_slice(header(words)?);
    for ins in instructions(words) {
        let (op, ins) = ins?;
        let count = ins.len();
        let mut ins = ins.to_vec();
        match op {
            OP_TYPE_POINTER if count >= 4 && ins[2] == WORKGROUP => {
                pointer_types.insert(ins[1]);
            }
            OP_VARIABLE | OP_ACCESS_CHAIN | OP_IN_BOUNDS_ACCESS_CHAIN
                if count >= 3 && pointer_types.contains(&ins[1]) =>
            {
                pointers.insert(ins[2]);
            }
            // OpLoad: type, result, pointer [, memory operands].
            OP_LOAD if count >= 4 && pointers.contains(&ins[3]) => mark(&mut ins, 4),
            // OpStore: pointer, object [, memory operands].
            OP_STORE if count >= 3 && pointers.contains(&ins[1]) => mark(&mut ins, 3),
            // Cooperative load: type, result, pointer, layout, stride [, memory operand].
            OP_COOP_LOAD if count >= 6 && pointers.contains(&ins[3]) => mark(&mut ins, 6),
            // Cooperative store: pointer, object, layout, stride [, memory operand].
            OP_COOP_STORE if count >= 5 && pointers.contains(&ins[1]) => mark(&mut ins, 5),
            _ => {}
        }
        out.extend_from_slice(&ins);
    }
    *words = out;
    Ok(())
}

/// A module's five header words; an error when `words` is not SPIR-V.
fn header(words: &[u32]) -> Result<&[u32], String> {
    if words.len() < 5 || words[0] != 0x0723_0203 {
        return Err("not a SPIR-V module".into());
    }
    Ok(&words[..5])
}

/// The instructions after the header as (opcode, words), or an error for a malformed one
/// (the walk stops there).
fn instructions(words: &[u32]) -> impl Iterator<Item = Result<(u32, &[u32]), String>> {
    let mut i = 5;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || i >= words.len() {
            return None;
        }
        let count = (words[i] >> 16) as usize;
        if count == 0 || i + count > words.len() {
            failed = true;
            return Some(Err(format!("malformed instruction at word {i}")));
        }
        let ins = &words[i..i + count];
        i += count;
        Some(Ok((ins[0] & 0xffff, ins)))
    })
}

/// `OpTypeFloat`, `OpCapability`, `OpExtension` and the opcodes [`retype_f16_as_bf16`] refuses
/// on the retyped values: arithmetic and the GLSL extended instructions.
const OP_EXT_INST: u32 = 12;
const OP_TYPE_FLOAT: u32 = 22;
const OP_CAPABILITY: u32 = 17;
const OP_EXTENSION: u32 = 10;
/// `OpFNegate`, `OpFAdd`, `OpFSub`, `OpFMul`, `OpFDiv`, `OpFRem`, `OpFMod`,
/// `OpVectorTimesScalar`, `OpDot`.
const FLOAT_ARITHMETIC: [u32; 9] = [127, 129, 131, 133, 136, 140, 141, 142, 148];
/// `Capability BFloat16TypeKHR`, `BFloat16CooperativeMatrixKHR` (SPV_KHR_bfloat16).
const CAP_BF16_TYPE: u32 = 5116;
const CAP_BF16_COOP: u32 = 5118;
/// `FPEncoding BFloat16KHR`.
const ENCODING_BF16: u32 = 0;

/// Retypes every 16-bit float of a module as bfloat16 (`OpTypeFloat 16` gains the
/// `BFloat16KHR` encoding) and declares `SPV_KHR_bfloat16` with its type and
/// cooperative-matrix capabilities: the bf16 coop form, written in WGSL over f16 types
/// (WGSL has no bfloat16) whose values are bf16 bits throughout.
///
/// Sound only for a module that does no arithmetic in that type (bf16 allows loads, stores,
/// conversions and cooperative-matrix operations): an arithmetic instruction or an extended
/// instruction whose result type is the retyped float or a vector of it is an error, as is
/// a module without a 16-bit float. Constants keep their bits, which mean another value in
/// bf16: the form has none but zero (the test scans for them).
pub fn retype_f16_as_bf16(words: &mut Vec<u32>) -> Result<(), String> {
    header(words)?;
    // Pass 1: the 16-bit float type and the vectors of it.
    let mut halves = std::collections::HashSet::new();
    for ins in instructions(words) {
        let (op, ins) = ins?;
        let count = ins.len();
        if op == OP_TYPE_FLOAT && count == 3 && ins[2] == 16 {
            halves.insert(ins[1]);
        }
        // OpTypeVector: result, component type, count.
        if op == 23 && count == 4 && halves.contains(&ins[2]) {
            halves.insert(ins[1]);
        }
        if (op == OP_EXT_INST || FLOAT_ARITHMETIC.contains(&op))
            && count >= 3
            && halves.contains(&ins[1])
        {
            return Err(format!(
                "opcode {op} computes in the 16-bit float type, which bfloat16 does not allow"
            ));
        }
    }
    if halves.is_empty() {
        return Err("the module has no 16-bit float type to retype".into());
    }
    // Pass 2: the rewrite, with the capabilities after the first one and the extension
    // first among the extensions (both sections precede every type).
    let mut out = Vec::with_capacity(words.len() + 16);
    out.extend_from_slice(&words[..5]);
    let (mut caps_added, mut ext_added) = (false, false);
    for ins in instructions(words) {
        let (op, ins) = ins?;
        if op != OP_CAPABILITY && caps_added && !ext_added {
            out.extend(extension_words("SPV_KHR_bfloat16"));
            ext_added = true;
        }
        match op {
            OP_CAPABILITY if !caps_added => {
                out.extend_from_slice(ins);
                out.extend_from_slice(&[(2 << 16) | OP_CAPABILITY, CAP_BF16_TYPE]);
                out.extend_from_slice(&[(2 << 16) | OP_CAPABILITY, CAP_BF16_COOP]);
                caps_added = true;
            }
            OP_TYPE_FLOAT if ins.len() == 3 && ins[2] == 16 => {
                out.extend_from_slice(&[(4 << 16) | OP_TYPE_FLOAT, ins[1], 16, ENCODING_BF16]);
            }
            _ => out.extend_from_slice(ins),
        }
    }
    if !ext_added {
        return Err("the module declares no capability".into());
    }
    *words = out;
    Ok(())
}

/// `OpExtension "name"` (the literal string nul-terminated and padded to whole words).
fn extension_words(name: &str) -> Vec<u32> {
    let mut bytes = name.as_bytes().to_vec();
    bytes.push(0);
    while !bytes.len().is_multiple_of(4) {
        bytes.push(0);
    }
    let lit: Vec<u32> = bytes
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let mut out = vec![((lit.len() as u32 + 1) << 16) | OP_EXTENSION];
    out.extend(lit);
    out
}

/// Sets `NonPrivatePointer` in the memory-operand mask at word `at` of `ins`, appending the
/// mask when the instruction has none.
fn mark(ins: &mut Vec<u32>, at: usize) {
    if ins.len() > at {
        ins[at] |= NON_PRIVATE_POINTER;
    } else {
        ins.push(NON_PRIVATE_POINTER);
        let count = ins.len() as u32;
        ins[0] = (count << 16) | (ins[0] & 0xffff);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The coop shaders compile, and every workgroup load / store comes out marked.
    #[test]
    fn coop_shaders_get_non_private_workgroup_accesses() {
        for (key, source) in crate::kernels::wgsl::coop_catalog() {
            let words = compile(&source).unwrap_or_else(|e| panic!("{key}: {e}"));
            let mut wg_types = std::collections::HashSet::new();
            let mut wg_ptrs = std::collections::HashSet::new();
            let (mut marked, mut unmarked) = (0, 0);
            for ins in instructions(&words) {
                let (op, w) = ins.unwrap_or_else(|e| panic!("{key}: {e}"));
                match op {
                    OP_TYPE_POINTER if w[2] == WORKGROUP => {
                        wg_types.insert(w[1]);
                    }
                    OP_VARIABLE | OP_ACCESS_CHAIN | OP_IN_BOUNDS_ACCESS_CHAIN
                        if wg_types.contains(&w[1]) =>
                    {
                        wg_ptrs.insert(w[2]);
                    }
                    OP_LOAD | OP_COOP_LOAD if wg_ptrs.contains(&w[3]) => {
                        let at = if op == OP_LOAD { 4 } else { 6 };
                        if w.get(at).is_some_and(|m| m & NON_PRIVATE_POINTER != 0) {
                            marked += 1;
                        } else {
                            unmarked += 1;
                        }
                    }
                    OP_STORE | OP_COOP_STORE if wg_ptrs.contains(&w[1]) => {
                        let at = if op == OP_STORE { 3 } else { 5 };
                        if w.get(at).is_some_and(|m| m & NON_PRIVATE_POINTER != 0) {
                            marked += 1;
                        } else {
                            unmarked += 1;
                        }
                    }
                    _ => {}
                }
            }
            assert!(marked > 10, "{key}: only {marked} workgroup accesses");
            assert_eq!(
                unmarked, 0,
                "{key}: {unmarked} workgroup accesses left private"
            );
        }
    }

    /// Every workgroup variable of every coop shader is a multiple of 16 bytes. Why: the
    /// driver lays workgroup variables out back to back in an order of its choosing, and
    /// cooperative loads / stores need 16-byte aligned rows. On the H200 (driver 580) one
    /// 4-byte atomic placed ahead of the f16 arrays made every matrix load read 4 bytes early
    /// and the whole kernel wrong, while the same loads in a probe without it were exact.
    #[test]
    fn coop_workgroup_variables_keep_16_byte_alignment() {
        for (key, source) in crate::kernels::wgsl::coop_catalog() {
            let module =
                naga::front::wgsl::parse_str(&source).unwrap_or_else(|e| panic!("{key}: {e}"));
            let mut layouter = naga::proc::Layouter::default();
            layouter.update(module.to_ctx()).unwrap();
            let mut seen = 0;
            for (_, var) in module.global_variables.iter() {
                if var.space == naga::AddressSpace::WorkGroup {
                    let size = layouter[var.ty].size;
                    let name = var.name.as_deref().unwrap_or("?");
                    assert_eq!(
                        size % 16,
                        0,
                        "{key}: workgroup variable {name} is {size} bytes"
                    );
                    seen += 1;
                }
            }
            assert!(seen >= 5, "{key}: {seen} workgroup variables");
        }
    }

    /// The bf16 coop modules retype cleanly: they compute nothing in the 16-bit type, hold
    /// no 16-bit constant but zero, and come out with the bf16 type, capabilities and
    /// extension; an f16 module that computes in f16 is refused.
    #[test]
    fn bf16_coop_modules_retype_their_halves() {
        let mut n = 0;
        for (key, source) in crate::kernels::wgsl::coop_catalog() {
            if !source.contains(crate::kernels::wgsl::BF16_TILES_MARKER) {
                continue;
            }
            let mut words = compile(&source).unwrap_or_else(|e| panic!("{key}: {e}"));
            // Constants of the 16-bit type (OpConstant: type, result, value) are all zero.
            let mut halves = std::collections::HashSet::new();
            for ins in instructions(&words) {
                let (op, w) = ins.unwrap_or_else(|e| panic!("{key}: {e}"));
                if op == OP_TYPE_FLOAT && w[2] == 16 {
                    halves.insert(w[1]);
                }
                if op == 43 && halves.contains(&w[1]) {
                    assert_eq!(w[3] & 0xffff, 0, "{key}: a nonzero 16-bit constant");
                }
            }
            retype_f16_as_bf16(&mut words).unwrap_or_else(|e| panic!("{key}: {e}"));
            let (mut bf16_types, mut caps, mut ext) = (0, 0, false);
            for ins in instructions(&words) {
                let (op, w) = ins.unwrap_or_else(|e| panic!("{key}: {e}"));
                match op {
                    OP_TYPE_FLOAT if w[2] == 16 => {
                        assert_eq!(w.get(3), Some(&ENCODING_BF16), "{key}");
                        bf16_types += 1;
                    }
                    OP_CAPABILITY if w[1] == CAP_BF16_TYPE || w[1] == CAP_BF16_COOP => caps += 1,
                    OP_EXTENSION => {
                        ext |= w[1..]
                            .iter()
                            .flat_map(|x| x.to_le_bytes())
                            .collect::<Vec<_>>()
                            .starts_with(b"SPV_KHR_bfloat16\0")
                    }
                    _ => {}
                }
            }
            assert_eq!((bf16_types, caps, ext), (1, 2, true), "{key}");
            n += 1;
        }
        assert!(n >= 4, "{n} bf16 coop modules in the catalogue");
        // An f16 module with f16 arithmetic (the tiled2h form's packed FMAs) is refused.
        let tiled2h = crate::kernels::wgsl::catalog()
            .into_iter()
            .find(|(k, _, _)| k.contains("tiled2h"))
            .expect("a tiled2h module in the catalogue");
        let module = naga::front::wgsl::parse_str(&tiled2h.1).expect("parses");
        let caps = Capabilities::SUBGROUP | Capabilities::SHADER_FLOAT16;
        let info = Validator::new(ValidationFlags::all(), caps)
            .validate(&module)
            .expect("validates");
        let mut words =
            spv::write_vec(&module, &info, &crate::device::spirv::spirv_options(), None).unwrap();
        assert!(retype_f16_as_bf16(&mut words).is_err(), "{}", tiled2h.0);
    }

    #[test]
    fn a_truncated_module_is_an_error() {
        let mut words = vec![0x0723_0203, 0x0001_0300, 0, 10, 0, (5 << 16) | OP_LOAD, 1];
        assert!(non_private_workgroup_accesses(&mut words).is_err());
        assert!(non_private_workgroup_accesses(&mut vec![1, 2, 3]).is_err());
    }
}
