//! Every WGSL specialisation the wgpu backend generates (a representative set per kernel,
//! dtype pairing, head size, tile shape and subgroup choice: `wgsl::catalog`) parses,
//! validates with the capabilities it needs, and translates to SPIR-V, MSL and HLSL, so the
//! Vulkan, Metal and DX12 paths at least compile in CI (no Metal or DXC compiler exists on
//! Linux; naga's IR validation plus successful translation is the check we can make).

use naga::back::{hlsl, msl, spv};
use naga::valid::{Capabilities, ValidationFlags, Validator};
use polyattn::kernels::wgsl;

fn translate(source: &str, subgroups: bool) -> Result<(), String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    let mut caps = Capabilities::empty();
    if subgroups {
        caps |= Capabilities::SUBGROUP;
    }
    // The tiled2h attention form (and only it) computes in f16.
    if source.lines().any(|l| l == "enable f16;") {
        caps |= Capabilities::SHADER_FLOAT16;
    }
    let info = Validator::new(ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| format!("validation: {}", e.emit_to_string(source)))?;

    let spv_opts = spv::Options {
        lang_version: (1, 3),
        ..Default::default()
    };
    let words =
        spv::write_vec(&module, &info, &spv_opts, None).map_err(|e| format!("spir-v: {e}"))?;
    if words.first() != Some(&0x0723_0203) {
        return Err("spir-v: bad magic".into());
    }

    let msl_opts = msl::Options {
        lang_version: (2, 4),
        ..Default::default()
    };
    let pipeline = msl::PipelineOptions {
        entry_point: Some((naga::ShaderStage::Compute, "main".to_string())),
        ..Default::default()
    };
    let (msl_src, _) =
        msl::write_string(&module, &info, &msl_opts, &pipeline).map_err(|e| format!("msl: {e}"))?;
    if !msl_src.contains("kernel void") {
        return Err("msl: no kernel entry point".into());
    }

    let hlsl_opts = hlsl::Options {
        shader_model: hlsl::ShaderModel::V6_2,
        ..Default::default()
    };
    let mut hlsl_src = String::new();
    hlsl::Writer::new(&mut hlsl_src, &hlsl_opts, &hlsl::PipelineOptions::default())
        .write(&module, &info, None)
        .map_err(|e| format!("hlsl: {e}"))?;
    if !hlsl_src.contains("[numthreads(") {
        return Err("hlsl: no compute entry point".into());
    }
    Ok(())
}

#[test]
fn every_specialisation_translates() {
    let catalog = wgsl::catalog();
    // Unoptimised naga takes ~0.1 s per shader: spread the work over the cores.
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let chunk = catalog.len().div_ceil(threads);
    let failures: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = catalog
            .chunks(chunk.max(1))
            .map(|part| {
                scope.spawn(move || {
                    part.iter()
                        .filter_map(|(key, source, sg)| {
                            translate(source, *sg).err().map(|e| format!("{key}: {e}"))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("translation thread"))
            .collect()
    });
    println!(
        "{} WGSL specialisations -> SPIR-V, MSL, HLSL",
        catalog.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} failed:\n{}",
        failures.len(),
        catalog.len(),
        failures.join("\n")
    );
}

#[test]
fn f16_shaders_are_in_the_catalog_and_need_the_capability() {
    let catalog = wgsl::catalog();
    let half: Vec<_> = catalog
        .iter()
        .filter(|(key, _, _)| key.contains(" tiled2h "))
        .collect();
    assert!(half.len() >= 8, "{} tiled2h variants", half.len());
    for (key, source, _) in &catalog {
        assert_eq!(
            source.lines().any(|l| l == "enable f16;"),
            key.contains(" tiled2h "),
            "{key}: `enable f16;` belongs to the tiled2h form only"
        );
    }
    let (key, source, _) = half[0];
    let module = naga::front::wgsl::parse_str(source).expect("parses");
    let err = Validator::new(ValidationFlags::all(), Capabilities::SUBGROUP).validate(&module);
    assert!(err.is_err(), "{key} validated without SHADER_FLOAT16");
}

#[test]
fn subgroup_shaders_need_the_capability() {
    let (key, source, _) = wgsl::catalog()
        .into_iter()
        .find(|(_, _, sg)| *sg)
        .expect("a subgroup variant");
    let module = naga::front::wgsl::parse_str(&source).expect("parses");
    let err = Validator::new(ValidationFlags::all(), Capabilities::empty()).validate(&module);
    assert!(err.is_err(), "{key} validated without SUBGROUP");
}

/// The cooperative-matrix prefill form validates with `COOPERATIVE_MATRIX` and translates to
/// SPIR-V (the only backend naga offers 16 × 16 cooperative matrices in), and is rejected
/// without the capability.
#[test]
fn coop_shaders_translate_to_spirv() {
    let catalog = wgsl::coop_catalog();
    assert!(!catalog.is_empty());
    for (key, source) in &catalog {
        assert!(source.contains("enable wgpu_cooperative_matrix;"), "{key}");
        let module = naga::front::wgsl::parse_str(source)
            .unwrap_or_else(|e| panic!("{key}: {}", e.emit_to_string(source)));
        let caps = Capabilities::SUBGROUP
            | Capabilities::SHADER_FLOAT16
            | Capabilities::COOPERATIVE_MATRIX;
        let info = Validator::new(ValidationFlags::all(), caps)
            .validate(&module)
            .unwrap_or_else(|e| panic!("{key}: {}", e.emit_to_string(source)));
        let opts = spv::Options {
            lang_version: (1, 3),
            ..Default::default()
        };
        let words = spv::write_vec(&module, &info, &opts, None)
            .unwrap_or_else(|e| panic!("{key}: spir-v: {e}"));
        assert_eq!(words.first(), Some(&0x0723_0203), "{key}");
        let without = Capabilities::SUBGROUP | Capabilities::SHADER_FLOAT16;
        assert!(
            Validator::new(ValidationFlags::all(), without)
                .validate(&module)
                .is_err(),
            "{key} validated without COOPERATIVE_MATRIX"
        );
    }
}
