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

/// The kernels that read or write a KV cache or an MLA latent cache, in their chunked forms
/// (a cache stored in three buffers, bound as one binding array: `CacheChunks`): both the
/// `switch` form and the indexed one validate with the binding-array capability and
/// translate to SPIR-V; the indexed one needs non-uniform indexing and decorates its accesses
/// `NonUniform` (what a driver must see to index descriptors per lane); neither validates
/// without binding arrays.
#[test]
fn chunked_cache_shaders_translate_to_spirv() {
    use polyattn::kernels::wgsl::{
        coop_shader_typed, AttentionShader, CacheChunks, DecodeShader, MlaDecodeShader, MlaShader,
        ReshapeShader, Tiled2, TILED2_DEFAULT_BLOCK,
    };
    use polyattn::DType;
    let mut modules: Vec<(String, String, Capabilities, bool)> = Vec::new();
    let sg = Capabilities::SUBGROUP;
    for any_index in [false, true] {
        let chunks = CacheChunks {
            count: 3,
            any_index,
        };
        for (act, cache) in [
            (DType::F32, DType::F32),
            (DType::Bf16, DType::Bf16),
            (DType::F16, DType::Fp8E4m3),
        ] {
            let r = ReshapeShader {
                act_dtype: act,
                cache_dtype: cache,
            };
            modules.push((
                r.key_for(chunks),
                r.source_for(chunks),
                Capabilities::empty(),
                any_index,
            ));
            let d = DecodeShader::choose(128, 4, act, cache, (32, 32), 48 << 10, 4, 128)
                .expect("a decode shader");
            modules.push((d.key_for(chunks), d.source_for(chunks), sg, any_index));
            let tiled = AttentionShader {
                head_size: 128,
                block_m: 16,
                block_n: 32,
                q_dtype: act,
                kv_dtype: cache,
                paged: true,
                subgroups: true,
                unrolled: true,
                tiled2: None,
            };
            modules.push((
                tiled.key_for(chunks),
                tiled.source_for(chunks),
                sg,
                any_index,
            ));
            let t2 = AttentionShader {
                block_m: 64,
                tiled2: Some(Tiled2 {
                    workgroup: 128,
                    max_key_lanes: 32,
                    half: act == DType::F16 && cache == DType::F16,
                    block: TILED2_DEFAULT_BLOCK,
                    coop: false,
                }),
                ..tiled
            };
            modules.push((t2.key_for(chunks), t2.source_for(chunks), sg, any_index));
        }
        for (act, cache) in [(DType::F32, DType::F32), (DType::Bf16, DType::Fp8E4m3)] {
            let decode = MlaDecodeShader {
                latent_dim: 576,
                kv_lora_rank: 512,
                keys: 8,
                q_dtype: act,
                cache_dtype: cache,
                split: true,
            };
            for m in [
                MlaShader::CacheWrite {
                    act_dtype: act,
                    cache_dtype: cache,
                },
                MlaShader::Gather {
                    act_dtype: act,
                    cache_dtype: cache,
                },
                MlaShader::Decode(decode),
            ] {
                modules.push((
                    m.key_for(chunks),
                    m.source_for(chunks),
                    Capabilities::empty(),
                    any_index,
                ));
            }
        }
        let coop = coop_shader_typed(128, 64, 64, 1, true, DType::F16);
        modules.push((
            coop.key_for(chunks),
            coop.source_for(chunks),
            sg | Capabilities::SHADER_FLOAT16 | Capabilities::COOPERATIVE_MATRIX,
            any_index,
        ));
    }
    let mut failures = Vec::new();
    for (key, source, caps, any_index) in &modules {
        let module = match naga::front::wgsl::parse_str(source) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{key}: {}", e.emit_to_string(source)));
                continue;
            }
        };
        if Validator::new(ValidationFlags::all(), *caps)
            .validate(&module)
            .is_ok()
        {
            failures.push(format!("{key}: validated without binding arrays"));
        }
        let mut with = *caps | Capabilities::STORAGE_BUFFER_BINDING_ARRAY;
        if *any_index {
            with |= Capabilities::STORAGE_BUFFER_BINDING_ARRAY_NON_UNIFORM_INDEXING;
        }
        let info = match Validator::new(ValidationFlags::all(), with).validate(&module) {
            Ok(i) => i,
            Err(e) => {
                failures.push(format!("{key}: validation: {}", e.emit_to_string(source)));
                continue;
            }
        };
        let opts = spv::Options {
            lang_version: (1, 3),
            ..Default::default()
        };
        let words = match spv::write_vec(&module, &info, &opts, None) {
            Ok(w) => w,
            Err(e) => {
                failures.push(format!("{key}: spir-v: {e}"));
                continue;
            }
        };
        // OpDecorate (3 words, opcode 71) of any id with NonUniform (5300).
        let non_uniform = words
            .windows(3)
            .any(|w| w[0] == (3 << 16 | 71) && w[2] == 5300);
        if *any_index && !non_uniform {
            failures.push(format!("{key}: no NonUniform decoration"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} failed:\n{}",
        failures.len(),
        modules.len(),
        failures.join("\n")
    );
}
