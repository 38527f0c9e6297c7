//! Cooperative matrices as the coop prefill form uses them, one product at a time: 16 × 16
//! f16 A / B tiles loaded from workgroup memory (row-major A, B row-major and column-major),
//! multiplied into an f32 C tile, stored row-major, compared exactly with the host (small
//! integers: every product and sum is exact in f16 / f32). Runs where the wgpu device has
//! cooperative matrices (`WgpuDevice::has_coop`); prints that it skipped elsewhere.

#[macro_use]
mod common;

use polyattn::backends::wgpu::kernels::{
    bind_group, dispatch, pipeline, whole, Bindings, ParamBlock,
};
use polyattn::device::{CpuStorage, WgpuDevice};
use polyattn::DType;

/// `PAD` u32 of workgroup memory declared first (an odd count probes the alignment the
/// driver gives the f16 tiles after it); A and M at row stride `st` from element `off` of
/// their arrays (as the attention kernel's tiles sit inside larger arrays), C at 20.
fn shader(pad: u32, st: u32, off: u32) -> String {
    let len = off + 16 * st;
    format!(
        "enable f16;\nenable wgpu_cooperative_matrix;\nconst WG: u32 = 32u;\n\
         @group(0) @binding(1) var<storage, read> src: array<f32>;\n\
         @group(0) @binding(2) var<storage, read_write> dst: array<f32>;\n\
         var<workgroup> pad: array<u32, {pad}>;\n\
         var<workgroup> ah: array<f16, {len}>;\n\
         var<workgroup> mh: array<f16, {len}>;\n\
         var<workgroup> cs: array<f32, 320>;\n\
         @compute @workgroup_size(32)\n\
         fn main(@builtin(local_invocation_index) t: u32) {{\n\
         \x20   pad[t % {pad}u] = t;\n\
         \x20   for (var i = t; i < 256u; i = i + 32u) {{\n\
         \x20       ah[{off}u + (i / 16u) * {st}u + i % 16u] = f16(src[i]);\n\
         \x20       mh[{off}u + (i / 16u) * {st}u + i % 16u] = f16(src[256u + i]);\n\
         \x20   }}\n\
         \x20   for (var i = t; i < 320u; i = i + 32u) {{\n\
         \x20       cs[i] = 0.0;\n\
         \x20   }}\n\
         \x20   workgroupBarrier();\n\
         \x20   let z = coopLoadT<coop_mat16x16<f32, C>>(&cs[0], 20u);\n\
         \x20   let a = coopLoadT<coop_mat16x16<f16, A>>(&ah[{off}u], {st}u);\n\
         \x20   let b_row = coopLoadT<coop_mat16x16<f16, B>>(&mh[{off}u], {st}u);\n\
         \x20   let b_col = coopLoad<coop_mat16x16<f16, B>>(&mh[{off}u], {st}u);\n\
         \x20   let c1 = coopMultiplyAdd(a, b_row, z);\n\
         \x20   let c2 = coopMultiplyAdd(a, b_col, z);\n\
         \x20   workgroupBarrier();\n\
         \x20   coopStoreT(c1, &cs[0], 20u);\n\
         \x20   workgroupBarrier();\n\
         \x20   for (var i = t; i < 256u; i = i + 32u) {{\n\
         \x20       dst[i] = cs[(i / 16u) * 20u + i % 16u];\n\
         \x20   }}\n\
         \x20   workgroupBarrier();\n\
         \x20   coopStoreT(c2, &cs[0], 20u);\n\
         \x20   workgroupBarrier();\n\
         \x20   for (var i = t; i < 256u; i = i + 32u) {{\n\
         \x20       dst[256u + i] = cs[(i / 16u) * 20u + i % 16u] + f32(pad[0] & 0u);\n\
         \x20   }}\n\
         }}\n"
    )
}

#[test]
fn cooperative_matrix_products_are_exact() {
    let dev = match WgpuDevice::open() {
        Ok(d) => d,
        Err(e) => {
            report!("[coop ops] skipped: no wgpu device ({e})");
            return;
        }
    };
    if !dev.has_coop() {
        report!(
            "[coop ops] skipped: {} has no cooperative matrices (16x16x16 f16 / f32)",
            dev.description()
        );
        return;
    }
    let a = |i: usize, k: usize| ((i + 2 * k) % 5) as f32 - 2.0;
    let m = |k: usize, j: usize| ((3 * k + j) % 7) as f32 - 3.0;
    let mut src = vec![0.0f32; 512];
    for i in 0..16 {
        for j in 0..16 {
            src[i * 16 + j] = a(i, j);
            src[256 + i * 16 + j] = m(i, j);
        }
    }
    let mut failures = Vec::new();
    // (pad, stride, offset): the attention kernel's strides and tile offsets among them.
    for (pad, st, off) in [
        (4u32, 24u32, 0u32),
        (1, 24, 0),
        (3, 24, 0),
        (4, 136, 16),
        (4, 136, 2176),
        (4, 72, 48),
    ] {
        let input = dev
            .upload(&CpuStorage::F32(src.clone()), DType::F32)
            .unwrap();
        let out = dev
            .upload(&CpuStorage::F32(vec![0.0; 512]), DType::F32)
            .unwrap();
        let params = ParamBlock::new(&dev, 1);
        let key = format!("coop probe pad{pad} stride{st} offset{off}");
        let pipe = pipeline(&dev, &key, || shader(pad, st, off), Bindings::Probe, true).unwrap();
        let group = bind_group(
            &dev,
            &pipe,
            vec![
                (0, params.binding(0)),
                (1, whole(input.buffer())),
                (2, whole(out.buffer())),
            ],
        );
        let mut enc = dev.device().create_command_encoder(&Default::default());
        dispatch(&mut enc, &pipe, &group, (1, 1, 1));
        dev.queue().submit([enc.finish()]);
        let got = match dev.download(&out, DType::F32).unwrap() {
            CpuStorage::F32(v) => v,
            _ => unreachable!(),
        };
        let mut bad = 0;
        let mut first = String::new();
        for i in 0..16 {
            for j in 0..16 {
                // c1 = A·M (M loaded row-major), c2 = A·Mᵀ (M loaded column-major).
                let c1: f32 = (0..16).map(|k| a(i, k) * m(k, j)).sum();
                let c2: f32 = (0..16).map(|k| a(i, k) * m(j, k)).sum();
                for (which, want, got) in [(1, c1, got[i * 16 + j]), (2, c2, got[256 + i * 16 + j])]
                {
                    if want != got {
                        bad += 1;
                        if first.is_empty() {
                            first = format!("c{which}[{i}][{j}] = {got}, want {want}");
                        }
                    }
                }
            }
        }
        if bad > 0 {
            failures.push(format!("{key}: {bad} of 512 wrong, first {first}"));
        }
    }
    report!("[coop ops] ran on {}", dev.description());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
