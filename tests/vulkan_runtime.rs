//! The native Vulkan runtime (`polyattn::device::vulkan`) under the Khronos validation layer:
//! buffers round-trip through staging, and a WGSL-family module (`merge_attn_states.wgsl`,
//! translated to SPIR-V by naga, bindings reflected from its IR) runs and equals an f64
//! reference on random inputs, with empty sides and NaN in the rows an empty side must not
//! read. Any validation error fails the test.
//!
//! Without a Vulkan loader, device or validation layer the test prints SKIP and why — except
//! under `WGPU_BACKEND=vulkan` (what `.ci/run` sets, installing lavapipe and
//! `vulkan-validationlayers`), which says this machine must have Vulkan: there a missing
//! piece fails the test. A release build without the layer (the GPU machine) runs the tests
//! without validation and says so.

use polyattn::device::vulkan::{BindingKind, ModuleBinding, VulkanDevice, VulkanOptions};
use polyattn::device::wgsl::WgslRuntime;
use polyattn::kernels::wgsl::{MergeShader, ELEMENTWISE_WORKGROUP};
use polyattn::rng::Rng;
use polyattn::DType;

/// Serialises the tests of this file: one of them sets `POLYATTN_DEVICE`, which `open` reads.
static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn open() -> Option<VulkanDevice> {
    open_with(true)
}

/// [`open`] with push descriptors on or off (off: every dispatch allocates and writes a
/// descriptor set, the path of devices without `VK_KHR_push_descriptor`).
fn open_with(push_descriptors: bool) -> Option<VulkanDevice> {
    open_options(VulkanOptions {
        validation: true,
        push_descriptors,
        subgroup_size_control: true,
    })
}

/// The device opened with `options` (validation asked for; see the module docs for when it
/// runs without), or `None` after printing why there is none.
fn open_options(options: VulkanOptions) -> Option<VulkanDevice> {
    let validated = VulkanDevice::open(options);
    // A release build (the GPU machine's, which has no validation layer) runs without it;
    // a debug build (what CI runs, with the layer installed) never does.
    let opened = match validated {
        Err(e) if !cfg!(debug_assertions) && e.to_string().contains("is not installed") => {
            println!("vulkan_runtime: no validation layer in this release run ({e}); without it");
            VulkanDevice::open(VulkanOptions {
                validation: false,
                ..options
            })
        }
        other => other,
    };
    match opened {
        Ok(d) => Some(d),
        Err(e) => {
            let required = std::env::var("WGPU_BACKEND")
                .map(|v| v.eq_ignore_ascii_case("vulkan"))
                .unwrap_or(false);
            assert!(
                !required,
                "WGPU_BACKEND=vulkan says this machine has Vulkan, but: {e}"
            );
            println!("SKIP vulkan_runtime: {e}");
            None
        }
    }
}

fn words(v: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

#[test]
fn buffers_round_trip_and_merge_runs_under_validation() {
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    for push in [true, false] {
        let Some(dev) = open_with(push) else { return };
        println!(
            "Vulkan device: {} (CPU implementation: {}), push descriptors asked: {push}",
            dev.name(),
            dev.is_cpu()
        );
        round_trip_and_merge(dev, push);
    }
}

/// The body of [`buffers_round_trip_and_merge_runs_under_validation`] on one device.
fn round_trip_and_merge(dev: VulkanDevice, push: bool) {
    // Buffers: upload, partial write, download; zeros.
    let mut rng = Rng::new(7);
    let data: Vec<f32> = (0..1000).map(|_| rng.normal()).collect();
    let b = dev.upload(&words(&data)).unwrap();
    let patch = [1.5f32, -2.25];
    dev.write(&b, 8, &words(&patch)).unwrap();
    let back: Vec<f32> = bytemuck::cast_slice(&dev.download(&b).unwrap()).to_vec();
    let mut want = data.clone();
    want[2] = 1.5;
    want[3] = -2.25;
    assert_eq!(back, want);
    let z = dev.zeros(64).unwrap();
    assert!(dev.download(&z).unwrap().iter().all(|&x| x == 0));
    assert!(
        dev.write(&b, 2, &words(&patch)).is_err(),
        "an unaligned write is an error"
    );
    assert!(
        dev.write(&b, 4000, &words(&patch)).is_err(),
        "a write past the end is an error"
    );

    // merge_attn_states: T tokens, H heads, D dims; tokens >= P copy the suffix.
    let (t, h, d, p) = (37usize, 3usize, 64usize, 30usize);
    let po: Vec<f32> = (0..t * h * d).map(|_| rng.normal()).collect();
    let so: Vec<f32> = (0..t * h * d).map(|_| rng.normal()).collect();
    let mut p_lse: Vec<f32> = (0..h * t).map(|_| 3.0 * rng.normal()).collect();
    let mut s_lse: Vec<f32> = (0..h * t).map(|_| 3.0 * rng.normal()).collect();
    let mut po = po;
    let mut so = so;
    // Empty sides (±inf), whose output rows hold NaN: selection must keep them out.
    for (i, &(tok, head)) in [(1, 0), (5, 2), (9, 1)].iter().enumerate() {
        let l = head * t + tok;
        let rows = if i % 2 == 0 { &mut po } else { &mut so };
        rows[(tok * h + head) * d..][..d].fill(f32::NAN);
        if i % 2 == 0 {
            p_lse[l] = f32::NEG_INFINITY;
        } else {
            s_lse[l] = f32::INFINITY;
        }
    }
    let shader = MergeShader { dtype: DType::F32 };
    let pipe = dev.pipeline(&shader.key(), &shader.source()).unwrap();
    assert!(
        push || !pipe.pushes_descriptors(),
        "a device opened without push descriptors pushes them"
    );
    assert_eq!(
        pipe.bindings()[0],
        ModuleBinding {
            binding: 0,
            kind: BindingKind::Uniform,
            count: 1,
        }
    );
    assert_eq!(
        pipe.bindings().last().unwrap().kind,
        BindingKind::Storage { writable: true }
    );
    let params: [u32; 8] = [t as u32, h as u32, d as u32, p as u32, 1, 0, 0, 0];
    let pb = dev.upload(bytemuck::cast_slice(&params)).unwrap();
    let bpo = dev.upload(&words(&po)).unwrap();
    let bpl = dev.upload(&words(&p_lse)).unwrap();
    let bso = dev.upload(&words(&so)).unwrap();
    let bsl = dev.upload(&words(&s_lse)).unwrap();
    let bout = dev.zeros((t * h * d * 4) as u64).unwrap();
    let bol = dev.zeros((h * t * 4) as u64).unwrap();
    let threads = (t * h * d / 4) as u32;
    let groups = threads.div_ceil(ELEMENTWISE_WORKGROUP);
    let binds = [
        (0, &pb),
        (1, &bpo),
        (2, &bpl),
        (3, &bso),
        (4, &bsl),
        (5, &bout),
        (6, &bol),
    ];
    dev.dispatch(&pipe, &binds, (groups, 1, 1)).unwrap();
    let errors = dev.validation_errors();
    assert!(errors.is_empty(), "validation errors: {errors:#?}");
    // A binding left out, and one the module does not have, are errors before any work.
    assert!(dev.dispatch(&pipe, &binds[..6], (groups, 1, 1)).is_err());
    let mut extra = binds.to_vec();
    extra.push((9, &pb));
    assert!(dev.dispatch(&pipe, &extra, (groups, 1, 1)).is_err());

    let out: Vec<f32> = bytemuck::cast_slice(&dev.download(&bout).unwrap()).to_vec();
    let out_lse: Vec<f32> = bytemuck::cast_slice(&dev.download(&bol).unwrap()).to_vec();
    let empty = |x: f32| x.is_infinite();
    for tok in 0..t {
        for head in 0..h {
            let l = head * t + tok;
            let (lp, ls) = (p_lse[l] as f64, s_lse[l] as f64);
            let row = (tok * h + head) * d;
            let (wa, wb, lse) = if tok >= p {
                (0.0, 1.0, ls)
            } else if empty(p_lse[l]) && empty(s_lse[l]) {
                (0.0, 0.0, f64::NEG_INFINITY)
            } else if empty(p_lse[l]) {
                (0.0, 1.0, ls)
            } else if empty(s_lse[l]) {
                (1.0, 0.0, lp)
            } else {
                let m = lp.max(ls);
                let (a, b) = ((lp - m).exp(), (ls - m).exp());
                (a / (a + b), b / (a + b), (a + b).ln() + m)
            };
            for k in 0..d {
                let mut e = 0.0f64;
                if wa > 0.0 {
                    e += wa * po[row + k] as f64;
                }
                if wb > 0.0 {
                    e += wb * so[row + k] as f64;
                }
                let g = out[row + k] as f64;
                assert!(
                    (g - e).abs() <= 1e-5 * (1.0 + e.abs()),
                    "token {tok} head {head} dim {k}: {g} vs {e}"
                );
            }
            let g = out_lse[l] as f64;
            assert!(
                (g == lse) || (g - lse).abs() <= 1e-5 * (1.0 + lse.abs()),
                "lse token {tok} head {head}: {g} vs {lse}"
            );
        }
    }
    let errors = dev.validation_errors();
    assert!(errors.is_empty(), "validation errors: {errors:#?}");
}

/// Two merges recorded once (the second reads the first's output) and submitted again after
/// new inputs are written: each submission equals the same two dispatches run eagerly on the
/// same inputs, bit for bit.
/// With push descriptors and without.
#[test]
fn a_recorded_step_resubmitted_equals_eager_dispatches() {
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    for push in [true, false] {
        let Some(dev) = open_with(push) else { return };
        recorded_equals_eager(dev);
    }
}

/// The body of [`a_recorded_step_resubmitted_equals_eager_dispatches`] on one device.
fn recorded_equals_eager(dev: VulkanDevice) {
    use polyattn::device::vulkan::Step;
    let mut rng = Rng::new(11);
    let (t, h, d) = (19usize, 2usize, 32usize);
    let n = t * h * d;
    let shader = MergeShader { dtype: DType::F32 };
    let pipe = dev.pipeline(&shader.key(), &shader.source()).unwrap();
    let params: [u32; 8] = [t as u32, h as u32, d as u32, t as u32, 1, 0, 0, 0];
    let pb = dev.upload(bytemuck::cast_slice(&params)).unwrap();
    let fresh = |rng: &mut Rng, len: usize, scale: f32| -> Vec<f32> {
        (0..len).map(|_| scale * rng.normal()).collect()
    };
    let (a, al) = (
        dev.zeros((n * 4) as u64).unwrap(),
        dev.zeros((h * t * 4) as u64).unwrap(),
    );
    let (b, bl) = (
        dev.zeros((n * 4) as u64).unwrap(),
        dev.zeros((h * t * 4) as u64).unwrap(),
    );
    let (m1, m1l) = (
        dev.zeros((n * 4) as u64).unwrap(),
        dev.zeros((h * t * 4) as u64).unwrap(),
    );
    let (m2, m2l) = (
        dev.zeros((n * 4) as u64).unwrap(),
        dev.zeros((h * t * 4) as u64).unwrap(),
    );
    let groups = ((n / 4) as u32).div_ceil(ELEMENTWISE_WORKGROUP);
    // merge(a, b) -> m1; merge(m1, b) -> m2.
    let first = vec![
        (0, &pb),
        (1, &a),
        (2, &al),
        (3, &b),
        (4, &bl),
        (5, &m1),
        (6, &m1l),
    ];
    let second = vec![
        (0, &pb),
        (1, &m1),
        (2, &m1l),
        (3, &b),
        (4, &bl),
        (5, &m2),
        (6, &m2l),
    ];
    let recording = dev
        .record(&[
            Step {
                pipeline: &pipe,
                buffers: first.clone(),
                groups: (groups, 1, 1),
            },
            Step {
                pipeline: &pipe,
                buffers: second.clone(),
                groups: (groups, 1, 1),
            },
        ])
        .unwrap();
    let read = |buf| -> Vec<u32> { bytemuck::cast_slice(&dev.download(buf).unwrap()).to_vec() };
    for round in 0..2 {
        for (buf, len, scale) in [
            (&a, n, 1.0),
            (&al, h * t, 3.0),
            (&b, n, 1.0),
            (&bl, h * t, 3.0),
        ] {
            dev.write(buf, 0, &words(&fresh(&mut rng, len, scale)))
                .unwrap();
        }
        dev.submit(&recording).unwrap();
        let replayed = (read(&m2), read(&m2l));
        dev.dispatch(&pipe, &first, (groups, 1, 1)).unwrap();
        dev.dispatch(&pipe, &second, (groups, 1, 1)).unwrap();
        let eager = (read(&m2), read(&m2l));
        assert!(
            replayed == eager,
            "round {round}: the re-submitted step differs from eager"
        );
        assert!(
            replayed.0.iter().any(|&x| x != 0),
            "round {round}: nothing was written"
        );
    }
    // Timed: the same submission, with the device time between its two timestamps.
    let timed = dev.submit_timed(&recording).unwrap();
    println!("recorded step: {timed:?} of device time");
    match timed {
        Some(t) => {
            assert!(dev.has_timestamps());
            assert!(
                t < std::time::Duration::from_secs(60),
                "{t:?} is no plausible time"
            );
        }
        None => assert!(!dev.has_timestamps()),
    }
    drop(recording);
    let errors = dev.validation_errors();
    assert!(errors.is_empty(), "validation errors: {errors:#?}");
}

/// `POLYATTN_DEVICE` picks a device by its index in the ranking or by name; one that matches
/// nothing is an error listing the devices.
#[test]
fn polyattn_device_names_the_device() {
    use polyattn::device::vulkan::DEVICE_ENV;
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let Some(first) = open() else { return };
    let name = first.name().to_string();
    drop(first);
    let with = |v: &str| {
        std::env::set_var(DEVICE_ENV, v);
        let r = VulkanDevice::open(VulkanOptions::default());
        std::env::remove_var(DEVICE_ENV);
        r
    };
    assert_eq!(with("0").unwrap().name(), name);
    let word = name
        .split_whitespace()
        .next()
        .unwrap_or(&name)
        .to_ascii_uppercase();
    assert_eq!(with(&word).unwrap().name(), name);
    let e = with("no-such-device-anywhere").unwrap_err().to_string();
    assert!(e.contains("matches no device") && e.contains(&name), "{e}");
    let e = with("4096").unwrap_err().to_string();
    assert!(e.contains("out of range"), "{e}");
}

/// The driver's compiled pipelines are saved in the kernel cache directory when the device
/// closes and loaded when it opens again (the driver rejects data that is not its own).
#[test]
fn the_pipeline_cache_persists_on_disk() {
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("polyattn-vk-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::env::set_var("POLYATTN_CACHE_DIR", &dir);
    let run = || -> Option<()> {
        let dev = open()?;
        let shader = MergeShader { dtype: DType::F16 };
        let pipe = dev.pipeline(&shader.key(), &shader.source()).unwrap();
        drop(pipe);
        let errors = dev.validation_errors();
        assert!(errors.is_empty(), "validation errors: {errors:#?}");
        Some(())
    };
    let ran = run().is_some();
    let files = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(dir.join("vulkan"))
            .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default()
    };
    if ran {
        let saved = files();
        assert_eq!(saved.len(), 1, "{saved:?}");
        assert!(std::fs::metadata(&saved[0]).unwrap().len() > 0);
        // A second process-life: the saved data is loaded, pipelines build, the file stays.
        run().unwrap();
        assert_eq!(files(), saved);
        // Data that is not a pipeline cache is ignored by the driver, not an error.
        std::fs::write(&saved[0], b"not a pipeline cache").unwrap();
        run().unwrap();
    }
    std::env::remove_var("POLYATTN_CACHE_DIR");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The process's device (what the VULKAN backend runs on) has the validation layer on in a
/// debug build wherever the layer is installed — on CI, where `WGPU_BACKEND=vulkan` says the
/// layer is there, so every shared test body on VULKAN runs under validation (the test harness
/// fails a case on any error the layer reports).
#[test]
fn the_process_device_validates_in_debug_builds() {
    let dev = match VulkanDevice::global() {
        Ok(d) => d,
        Err(e) => {
            let required = std::env::var("WGPU_BACKEND")
                .map(|v| v.eq_ignore_ascii_case("vulkan"))
                .unwrap_or(false);
            assert!(!required, "WGPU_BACKEND=vulkan, but no Vulkan device: {e}");
            println!("SKIP the_process_device_validates_in_debug_builds: {e}");
            return;
        }
    };
    let ci = std::env::var("WGPU_BACKEND").is_ok_and(|v| v.eq_ignore_ascii_case("vulkan"));
    if cfg!(debug_assertions) && ci {
        assert!(
            dev.validation_enabled(),
            "a debug build on a machine with the validation layer must validate: {}",
            dev.description()
        );
    }
    println!("{}", dev.description());
}

/// The benchmark's ceilings and timer on the process's device: the copy and FMA probes run
/// (recorded once, timed by their timestamps) and give positive rates, and the region timer
/// times a region.
#[test]
fn the_benchmark_probes_run() {
    use polyattn::backends::vulkan::probes;
    use polyattn::probe::ProbeConfig;
    let Ok(dev) = VulkanDevice::global() else {
        println!("SKIP the_benchmark_probes_run: no Vulkan device");
        return;
    };
    if !dev.has_timestamps() {
        println!("SKIP the_benchmark_probes_run: the compute queue has no timestamps");
        return;
    }
    let cfg = ProbeConfig {
        trials: 1,
        copy_bytes: 1 << 20,
        fma_seconds: 0.01,
    };
    let peaks = probes::peaks(&dev, DType::F32, &cfg).unwrap();
    assert!(
        peaks.mem_gbps > 0.0 && peaks.compute_tflops > 0.0,
        "{peaks:?}"
    );
    let mut timer = probes::timer(&dev);
    timer.start().unwrap();
    let secs = timer.stop().unwrap();
    assert!(secs > 0.0 && secs < 10.0, "{secs}");
    assert!(dev.take_validation_errors().is_empty());
}

/// Every invocation of a module writes the size of its subgroup. With subgroup-size control
/// (where the device has it: Vulkan 1.3's `subgroupSizeControl`, lavapipe and NVIDIA's
/// driver included), every pipeline runs at the one size the device reports as required, and
/// the kernels see the range collapsed to it; without it, sizes lie in the device's range.
#[test]
fn pipelines_run_at_the_required_subgroup_size() {
    let _env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    const SOURCE: &str = "
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(128)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(subgroup_size) n: u32) {
    out[g.x] = n;
}
";
    for control in [true, false] {
        let Some(dev) = open_options(VulkanOptions {
            validation: true,
            push_descriptors: true,
            subgroup_size_control: control,
        }) else {
            return;
        };
        let (min, max) = WgslRuntime::info(&dev).subgroup_sizes;
        if !WgslRuntime::info(&dev).subgroups {
            println!(
                "SKIP subgroup sizes: {} has no subgroup operations",
                dev.name()
            );
            return;
        }
        let required = dev.required_subgroup_size();
        match (control, required) {
            (true, Some(n)) => {
                assert_eq!((min, max), (n, n), "the kernels see the required size only");
                assert!(
                    dev.description().contains("(required"),
                    "{}",
                    dev.description()
                );
            }
            (true, None) => println!(
                "subgroup sizes: {} cannot require a size (range {min}..{max})",
                dev.name()
            ),
            (false, r) => assert_eq!(r, None, "a size required with control off"),
        }
        let pipe = dev.pipeline("subgroup size probe", SOURCE).unwrap();
        let out = dev.zeros(4 * 4 * 128).unwrap();
        dev.dispatch(&pipe, &[(0, &out)], (4, 1, 1)).unwrap();
        let sizes: Vec<u32> = bytemuck::cast_slice(&dev.download(&out).unwrap()).to_vec();
        for &n in &sizes {
            match required {
                Some(r) => assert_eq!(n, r, "a subgroup of {n} lanes, {r} required"),
                None => assert!((min..=max).contains(&n), "{n} lanes outside {min}..{max}"),
            }
        }
        // A workgroup of the device's largest size: on a device of one subgroup size it runs
        // at that size (required or not); where sizes vary, the device's largest workgroup is
        // already capped to what the required size allows.
        let most = WgslRuntime::info(&dev).max_invocations.min(1024);
        let wide = SOURCE.replace("workgroup_size(128)", &format!("workgroup_size({most})"));
        let pipe = dev.pipeline("subgroup size probe, widest", &wide).unwrap();
        let out = dev.zeros(4 * u64::from(most)).unwrap();
        dev.dispatch(&pipe, &[(0, &out)], (1, 1, 1)).unwrap();
        let wide_sizes: Vec<u32> = bytemuck::cast_slice(&dev.download(&out).unwrap()).to_vec();
        assert!(
            wide_sizes.iter().all(|n| (min..=max).contains(n)),
            "{most} invocations: sizes {wide_sizes:?} outside {min}..{max}"
        );
        let errors = dev.validation_errors();
        assert!(errors.is_empty(), "validation errors: {errors:#?}");
        println!(
            "subgroup sizes on {} with control {control}: {:?} (required {required:?})",
            dev.name(),
            sizes.iter().collect::<std::collections::BTreeSet<_>>()
        );
    }
}
