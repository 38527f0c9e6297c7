//! Cooperative matrices as the coop prefill form (`shaders/paged_attention_coop.wgsl`) uses
//! them, from the smallest piece up, so that a driver that gets the form wrong shows where:
//! - `cooperative_matrix_products_are_exact`: one 16 × 16 × 16 product (row-major A, B row-
//!   and column-major) from workgroup arrays at the kernel's strides and offsets;
//! - `offset_loads_read_where_asked`: which array elements a load at an offset reads;
//! - `kernel_shaped_products_are_exact`: both of the kernel's products with its layout;
//! - `coop_attention_sources`: the attention kernel itself on small batches (tokens that see
//!   one key must return that key's value), naming where each wrong output came from.
//!
//! Small integers make the products exact in f16 / f32. The GPU tests run where the wgpu
//! device has cooperative matrices (`WgpuDevice::has_coop`) and print that they skipped
//! elsewhere; the probe shaders are validated by naga everywhere. (What these probes find:
//! e.g. a 4-byte workgroup variable laid out ahead of the f16 arrays shifted every matrix
//! load on one driver; see `coop_spirv`'s alignment test.)

#[macro_use]
mod common;

use polyattn::device::wgpu::{bind_group, dispatch, pipeline, whole, ParamBlock};
use polyattn::device::{CpuStorage, WgpuDevice};
use polyattn::kernels::wgsl::Bindings;
use polyattn::DType;

/// The wgpu device with cooperative matrices, or `None` after printing why `test` skipped.
fn coop_device(test: &str) -> Option<WgpuDevice> {
    match WgpuDevice::open() {
        Ok(d) if d.has_coop() => Some(d),
        Ok(d) => {
            report!(
                "[{test}] skipped: {} has no cooperative matrices (16x16x16 f16 / f32)",
                d.description()
            );
            None
        }
        Err(e) => {
            report!("[{test}] skipped: no wgpu device ({e})");
            None
        }
    }
}

/// Runs a one-workgroup probe shader (`src` at binding 1, `dst` at binding 2, filled with
/// `fill` first) and returns `dst`.
fn run_probe(
    dev: &WgpuDevice,
    key: &str,
    source: impl FnOnce() -> String,
    src: &[f32],
    out_len: usize,
    fill: f32,
) -> Vec<f32> {
    let input = dev
        .upload(&CpuStorage::F32(src.to_vec()), DType::F32)
        .unwrap();
    let out = dev
        .upload(&CpuStorage::F32(vec![fill; out_len]), DType::F32)
        .unwrap();
    let params = ParamBlock::new(dev, 1);
    let pipe = pipeline(dev, key, source, Bindings::Probe, true).unwrap();
    let group = bind_group(
        dev,
        &pipe,
        vec![
            (0, params.binding(0)),
            (1, whole(input.buffer())),
            (2, whole(out.buffer())),
        ],
    );
    let mut enc = dev.device().create_command_encoder(&Default::default());
    dispatch(&mut enc, &pipe, &group, (1, 1, 1));
    dev.submit(enc.finish());
    match dev.download(&out, DType::F32).unwrap() {
        CpuStorage::F32(v) => v,
        _ => unreachable!("an f32 download"),
    }
}

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
    let Some(dev) = coop_device("coop ops") else {
        return;
    };
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
        let key = format!("coop probe pad{pad} stride{st} offset{off}");
        let got = run_probe(&dev, &key, || shader(pad, st, off), &src, 512, 0.0);
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

/// The attention kernel's two products with its exact layout (64 rows, 64 keys, head size
/// 128, 4 subgroups of 16 rows, row strides 136 / 68 / 72, Q held in 8 A-matrices, S tiles
/// stored at their offsets, O in 8 C-matrices accumulated over 4 key tiles and stored through
/// a per-subgroup 16 × 16 staging tile): S = Q·Kᵀ and O = P·V on small integers.
const KERNEL_SHAPED: &str = r#"enable f16;
enable wgpu_cooperative_matrix;
const WG: u32 = 128u;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;
var<workgroup> kv_s: array<f16, 8704>;
var<workgroup> s_s: array<f32, 4352>;
var<workgroup> p_s: array<f16, 4608>;
@compute @workgroup_size(128)
fn main(@builtin(local_invocation_index) t: u32, @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let row0 = sg * 16u;
    // Q (src[0..8192], 64 x 128) into kv_s rows; zero tile in s_s.
    for (var i = t; i < 8192u; i = i + 128u) {
        kv_s[(i / 128u) * 136u + i % 128u] = f16(src[i]);
    }
    for (var i = t; i < 256u; i = i + 128u) {
        s_s[i] = 0.0;
    }
    workgroupBarrier();
    let zero_c = coopLoadT<coop_mat16x16<f32, C>>(&s_s[0], 16u);
    var qa: array<coop_mat16x16<f16, A>, 8>;
    for (var n = 0u; n < 8u; n = n + 1u) {
        qa[n] = coopLoadT<coop_mat16x16<f16, A>>(&kv_s[row0 * 136u + n * 16u], 136u);
    }
    workgroupBarrier();
    // K (src[8192..16384]) over Q.
    for (var i = t; i < 8192u; i = i + 128u) {
        kv_s[(i / 128u) * 136u + i % 128u] = f16(src[8192u + i]);
    }
    workgroupBarrier();
    for (var k = 0u; k < 4u; k = k + 1u) {
        var sacc = zero_c;
        for (var n = 0u; n < 8u; n = n + 1u) {
            let kt = coopLoad<coop_mat16x16<f16, B>>(&kv_s[k * 16u * 136u + n * 16u], 136u);
            sacc = coopMultiplyAdd(qa[n], kt, sacc);
        }
        coopStoreT(sacc, &s_s[row0 * 68u + k * 16u], 68u);
    }
    workgroupBarrier();
    for (var i = t; i < 4096u; i = i + 128u) {
        dst[i] = s_s[(i / 64u) * 68u + i % 64u];
    }
    // P (src[16384..20480], 64 x 64) and V (src[20480..28672]).
    for (var i = t; i < 4096u; i = i + 128u) {
        p_s[(i / 64u) * 72u + i % 64u] = f16(src[16384u + i]);
    }
    for (var i = t; i < 8192u; i = i + 128u) {
        kv_s[(i / 128u) * 136u + i % 128u] = f16(src[20480u + i]);
    }
    workgroupBarrier();
    var pa: array<coop_mat16x16<f16, A>, 4>;
    for (var k = 0u; k < 4u; k = k + 1u) {
        pa[k] = coopLoadT<coop_mat16x16<f16, A>>(&p_s[row0 * 72u + k * 16u], 72u);
    }
    var o: array<coop_mat16x16<f32, C>, 8>;
    for (var n = 0u; n < 8u; n = n + 1u) {
        o[n] = zero_c;
        for (var k = 0u; k < 4u; k = k + 1u) {
            let vt = coopLoadT<coop_mat16x16<f16, B>>(&kv_s[k * 16u * 136u + n * 16u], 136u);
            o[n] = coopMultiplyAdd(pa[k], vt, o[n]);
        }
    }
    for (var n = 0u; n < 8u; n = n + 1u) {
        workgroupBarrier();
        coopStoreT(o[n], &s_s[sg * 256u], 16u);
        workgroupBarrier();
        for (var e = 0u; e < 8u; e = e + 1u) {
            let idx = lane * 8u + e;
            let r = row0 + idx / 16u;
            dst[4096u + r * 128u + n * 16u + idx % 16u] = s_s[sg * 256u + idx];
        }
    }
}
"#;

/// Small integers for the kernel-shaped probe: Q, K, V in -2..=2, P in 0..=2.
fn kernel_shaped_inputs() -> Vec<f32> {
    let mut v = vec![0.0f32; 28672];
    for (i, x) in v.iter_mut().enumerate() {
        *x = if (16384..20480).contains(&i) {
            ((i * 7 + 3) % 3) as f32
        } else {
            ((i * 13 + i / 128 * 5) % 5) as f32 - 2.0
        };
    }
    v
}

#[test]
fn kernel_shaped_probe_validates() {
    use naga::valid::{Capabilities, ValidationFlags, Validator};
    let module = naga::front::wgsl::parse_str(KERNEL_SHAPED)
        .unwrap_or_else(|e| panic!("{}", e.emit_to_string(KERNEL_SHAPED)));
    let caps =
        Capabilities::SUBGROUP | Capabilities::SHADER_FLOAT16 | Capabilities::COOPERATIVE_MATRIX;
    Validator::new(ValidationFlags::all(), caps)
        .validate(&module)
        .unwrap_or_else(|e| panic!("{}", e.emit_to_string(KERNEL_SHAPED)));
}

#[test]
fn kernel_shaped_products_are_exact() {
    let Some(dev) = coop_device("coop kernel-shaped") else {
        return;
    };
    let src = kernel_shaped_inputs();
    let got = run_probe(
        &dev,
        "coop probe kernel-shaped",
        || KERNEL_SHAPED.to_string(),
        &src,
        4096 + 8192,
        f32::NAN,
    );
    let (q, k, p, v) = (
        &src[..8192],
        &src[8192..16384],
        &src[16384..20480],
        &src[20480..],
    );
    let mut report_lines = Vec::new();
    for (name, rows, cols, base, want) in [
        ("S = Q·Kᵀ", 64usize, 64usize, 0usize, {
            let mut s = vec![0.0f32; 4096];
            for i in 0..64 {
                for j in 0..64 {
                    s[i * 64 + j] = (0..128).map(|d| q[i * 128 + d] * k[j * 128 + d]).sum();
                }
            }
            s
        }),
        ("O = P·V", 64, 128, 4096, {
            let mut o = vec![0.0f32; 8192];
            for i in 0..64 {
                for d in 0..128 {
                    o[i * 128 + d] = (0..64).map(|j| p[i * 64 + j] * v[j * 128 + d]).sum();
                }
            }
            o
        }),
    ] {
        let bad: Vec<(usize, usize)> = (0..rows * cols)
            .filter(|&e| got[base + e] != want[e])
            .map(|e| (e / cols, e % cols))
            .collect();
        if let Some(&(r, c)) = bad.first() {
            // Which 16-row tiles (subgroups) and 16-column tiles are wrong.
            let mut tiles: Vec<(usize, usize)> =
                bad.iter().map(|&(r, c)| (r / 16, c / 16)).collect();
            tiles.dedup();
            tiles.sort();
            tiles.dedup();
            report_lines.push(format!(
                "{name}: {} of {} wrong, first [{r}][{c}] = {} want {}; wrong (row tile, col tile): {tiles:?}",
                bad.len(),
                rows * cols,
                got[base + r * cols + c],
                want[r * cols + c]
            ));
        }
    }
    report!("[coop kernel-shaped] ran on {}", dev.description());
    assert!(report_lines.is_empty(), "{}", report_lines.join("\n"));
}

/// Where an A-matrix load at element offset `off` with row stride `st` actually reads: the
/// workgroup array holds its own element index (mod 2048, exact in f16), B is the identity,
/// so C = A and C[r][c] names the element the load took for row r, column c.
fn offset_map_shader(off: u32, st: u32) -> String {
    let len = (off + 16 * st).max(2048);
    format!(
        "enable f16;\nenable wgpu_cooperative_matrix;\nconst WG: u32 = 32u;\n\
         @group(0) @binding(1) var<storage, read> src: array<f32>;\n\
         @group(0) @binding(2) var<storage, read_write> dst: array<f32>;\n\
         var<workgroup> ah: array<f16, {len}>;\n\
         var<workgroup> id: array<f16, 256>;\n\
         var<workgroup> cs: array<f32, 256>;\n\
         @compute @workgroup_size(32)\n\
         fn main(@builtin(local_invocation_index) t: u32) {{\n\
         \x20   for (var i = t; i < {len}u; i = i + 32u) {{\n\
         \x20       ah[i] = f16(f32(i % 2048u) + src[0]);\n\
         \x20   }}\n\
         \x20   for (var i = t; i < 256u; i = i + 32u) {{\n\
         \x20       id[i] = select(f16(0.0), f16(1.0), i / 16u == i % 16u);\n\
         \x20       cs[i] = 0.0;\n\
         \x20   }}\n\
         \x20   workgroupBarrier();\n\
         \x20   let z = coopLoadT<coop_mat16x16<f32, C>>(&cs[0], 16u);\n\
         \x20   let a = coopLoadT<coop_mat16x16<f16, A>>(&ah[{off}u], {st}u);\n\
         \x20   let b = coopLoadT<coop_mat16x16<f16, B>>(&id[0], 16u);\n\
         \x20   let c = coopMultiplyAdd(a, b, z);\n\
         \x20   workgroupBarrier();\n\
         \x20   coopStoreT(c, &cs[0], 16u);\n\
         \x20   workgroupBarrier();\n\
         \x20   for (var i = t; i < 256u; i = i + 32u) {{\n\
         \x20       dst[i] = cs[i];\n\
         \x20   }}\n\
         }}\n"
    )
}

/// Prints, for the kernel's offsets and strides, which elements an A-matrix load at an
/// offset reads (diagnostic for the coop form; fails when any load reads elsewhere than
/// `off + r·st + c`).
#[test]
fn offset_loads_read_where_asked() {
    let Some(dev) = coop_device("coop offsets") else {
        return;
    };
    let mut failures = Vec::new();
    for (off, st) in [
        (0u32, 16u32),
        (0, 136),
        (16, 136),
        (32, 136),
        (136, 136),
        (272, 136),
        (48, 72),
    ] {
        let key = format!("coop offset map {off} {st}");
        let got = run_probe(
            &dev,
            &key,
            || offset_map_shader(off, st),
            &[0.0; 4],
            256,
            f32::NAN,
        );
        let want = |r: u32, c: u32| ((off + r * st + c) % 2048) as f32;
        report!(
            "[coop offsets] offset {off} stride {st}: [0][0] read element {}, [0][1] {}, [1][0] {} \
             (asked {}, {}, {})",
            got[0],
            got[1],
            got[16],
            want(0, 0),
            want(0, 1),
            want(1, 0)
        );
        let bad = (0..256u32)
            .filter(|&e| got[e as usize] != want(e / 16, e % 16))
            .count();
        if bad > 0 {
            failures.push(format!(
                "offset {off} stride {st}: {bad} of 256 elements from elsewhere"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The probe shaders validate with naga on any machine (so a GPU run cannot fail on them).
#[test]
fn probe_shaders_validate() {
    use naga::valid::{Capabilities, ValidationFlags, Validator};
    let mut sources = vec![offset_map_shader(16, 136), offset_map_shader(48, 72)];
    sources.extend([(4, 24, 0), (1, 136, 16), (3, 72, 48)].map(|(p, s, o)| shader(p, s, o)));
    for src in sources {
        let module = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("{}", e.emit_to_string(&src)));
        let caps = Capabilities::SHADER_FLOAT16 | Capabilities::COOPERATIVE_MATRIX;
        Validator::new(ValidationFlags::all(), caps)
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}", e.emit_to_string(&src)));
    }
}

/// One prefill request of `q_len` tokens (`hkv` KV heads × `g` query heads each, head size
/// 128, f16, seed 7) through the wgpu backend with `split` subgroups per coop row tile:
/// the batch (with its host copies), the output and the LSE, both as f32.
fn coop_forward(
    dev: &WgpuDevice,
    q_len: usize,
    hkv: usize,
    g: usize,
    split: u32,
) -> (polyattn::testing::RandomBatch, Vec<f32>, Vec<f32>) {
    use polyattn::backends::wgpu::{
        WgpuAttentionImpl, WgpuBackend, WgpuMetadataBuilder, WgpuTuning,
    };
    use polyattn::testing::{BatchSpec, CaseConfig, RandomBatch};
    use polyattn::{
        AttentionImpl, AttentionMetadataBuilder, AttentionParams, CommonAttentionMetadata, Device,
        Tensor,
    };
    let params = AttentionParams::new(hkv * g, 128, hkv);
    let case = CaseConfig::new(params.clone(), DType::F16, 16);
    let spec = BatchSpec::new(&[(q_len, q_len)]);
    let mut batch = RandomBatch::generate(&WgpuBackend::new(), &case, &spec, 7).unwrap();
    let device = Device::Wgpu(dev.clone());
    let builder = WgpuMetadataBuilder::new(dev.clone(), *batch.kv_cache.spec());
    let tuning = WgpuTuning {
        prefill_coop_split: Some(split),
        ..WgpuTuning::for_device(dev.wgsl_info())
    };
    let imp = WgpuAttentionImpl::with_tuning(dev.clone(), params, tuning).unwrap();
    let common = CommonAttentionMetadata::new(&device, batch.desc.clone()).unwrap();
    let metadata = builder.build(0, &common, false).unwrap();
    let mut out = batch.empty_output().unwrap();
    let mut lse = Tensor::zeros(&device, &[hkv * g, q_len], DType::F32).unwrap();
    imp.forward_with_lse(
        &batch.layer,
        &batch.query,
        Some(&batch.key),
        Some(&batch.value),
        &mut batch.kv_cache,
        metadata.as_ref(),
        &mut out,
        Some(&mut lse),
    )
    .unwrap();
    device.synchronize().unwrap();
    let (out, lse) = (out.to_f32_vec().unwrap(), lse.to_f32_vec().unwrap());
    (batch, out, lse)
}

/// Diagnosis of the coop attention kernel (prints, fails when wrong): one prefill request
/// of 16 tokens, one head, head size 128, f16. Token 0 sees one key, so its output must be
/// V[0] exactly (up to f16 rounding) and its LSE the scaled q0·k0. For every wrong output
/// column the test names where the value came from (a Q, K or V element of equal value:
/// random inputs make that nearly unique).
#[test]
fn coop_attention_sources() {
    use polyattn::reference;
    let Some(dev) = coop_device("coop sources") else {
        return;
    };
    let mut failures = Vec::new();
    // Every subgroup split of the 64 x 64 form (one subgroup per row tile sees one row tile's
    // data only; two or four share a tile's rows).
    let shapes = [
        (16usize, 1usize, 1usize),
        (32, 1, 1),
        (64, 1, 1),
        (4, 1, 4),
        (8, 1, 4),
        (16, 1, 2),
        (16, 2, 1),
        (16, 1, 4),
        (64, 2, 4),
    ];
    for (split, (q_len, hkv, g)) in [4u32, 2, 1]
        .into_iter()
        .flat_map(|q| shapes.into_iter().map(move |s| (q, s)))
    {
        let (batch, got, got_lse) = coop_forward(&dev, q_len, hkv, g, split);
        let want = reference::attention(&batch).unwrap();
        let h = hkv * g;
        let (qh, kh, vh) = (
            &batch.host_query,
            &batch.host_keys[0],
            &batch.host_values[0],
        );
        let find = |x: f32| -> String {
            for (name, a, w) in [
                ("V", vh, hkv * 128),
                ("K", kh, hkv * 128),
                ("Q", qh, h * 128),
            ] {
                if let Some(i) = a.iter().position(|&y| y == x && x != 0.0) {
                    return format!("{name}[{}][{}][{}]", i / w, (i % w) / 128, i % 128);
                }
            }
            "?".into()
        };
        let mut lines = Vec::new();
        for head in 0..h.min(2) {
            for tok in [0usize, 1, q_len - 1] {
                let base = (tok * h + head) * 128;
                let wrong: Vec<usize> = (0..128)
                    .filter(|&c| {
                        let w = want.out[base + c] as f32;
                        (got[base + c] - w).abs() > 2e-2 + 2e-2 * w.abs()
                    })
                    .collect();
                let l = got_lse[head * q_len + tok];
                let wl = want.lse[head * q_len + tok] as f32;
                let mut s = format!(
                    "tok {tok} head {head}: lse {l:.4} want {wl:.4}; {} wrong cols",
                    wrong.len()
                );
                if tok == 0 {
                    for &c in wrong.iter().take(12) {
                        s += &format!(" | c{c}={} ({})", got[base + c], find(got[base + c]));
                    }
                } else if let Some(&c) = wrong.first() {
                    s += &format!(" first c{c}={} want {}", got[base + c], want.out[base + c]);
                }
                if !wrong.is_empty() || (l - wl).abs() > 2e-2 {
                    lines.push(s);
                }
            }
        }
        report!(
            "[coop sources] split {split}, q_len {q_len}, {hkv} kv heads x {g}: {}",
            if lines.is_empty() {
                "right".to_string()
            } else {
                lines.join("\n    ")
            }
        );
        if !lines.is_empty() {
            failures.push(format!("split {split} q_len {q_len} g {g}"));
        }
    }
    assert!(failures.is_empty(), "wrong: {failures:?}");
}
