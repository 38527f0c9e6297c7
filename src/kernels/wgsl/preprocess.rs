//! The WGSL preprocessor: the typed buffer accessors of the generated headers (how f32, f16,
//! bf16 and fp8 elements are packed in storage words and unpacked), the header constants,
//! the dtype names of pipeline keys, and the source transforms — [`unroll`] (loops marked
//! `// @unroll` expanded so their arrays stay in registers) and `coop_scalarise` (the coop
//! form's matrix arrays as named variables).

use crate::dtype::DType;

/// WGSL storage type, element count per array entry.
pub(super) fn storage_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "vec4<f32>",
        DType::F16 | DType::Bf16 => "vec2<u32>",
        DType::Fp8E4m3 | DType::Fp8E5m2 => "u32",
        DType::I32 | DType::I64 => "u32",
    }
}

fn load_body(name: &str, dtype: DType) -> String {
    let buf = format!("{name}_buf[e >> 2u]");
    match dtype {
        DType::F32 => format!("    return {buf};\n"),
        DType::F16 => format!(
            "    let w = {buf};\n    return vec4<f32>(f16_bits_to_f32(w.x), f16_bits_to_f32(w.x >> 16u), \
             f16_bits_to_f32(w.y), f16_bits_to_f32(w.y >> 16u));\n"
        ),
        DType::Bf16 => format!(
            "    let w = {buf};\n    return vec4<f32>(bitcast<f32>(w.x << 16u), \
             bitcast<f32>(w.x & 0xffff0000u), bitcast<f32>(w.y << 16u), \
             bitcast<f32>(w.y & 0xffff0000u));\n"
        ),
        DType::Fp8E4m3 | DType::Fp8E5m2 => {
            format!("    let w = {buf};\n    return {};\n", fp8x4(dtype, "w"))
        }
        DType::I32 | DType::I64 => "    return vec4<f32>(0.0);\n".into(),
    }
}

/// Body of a function of `w` (the storage type of four elements) returning them as
/// `vec4<f32>`: `load_body`'s unpacking, for words already loaded.
pub(super) fn cvt_body(dtype: DType) -> String {
    format!("    return {};\n", cvt_expr(dtype))
}

/// The expression of [`cvt_body`]: the four elements of the words `w` as `vec4<f32>`.
fn cvt_expr(dtype: DType) -> String {
    match dtype {
        DType::F32 => "w".into(),
        DType::F16 => "vec4<f32>(f16_bits_to_f32(w.x), f16_bits_to_f32(w.x >> 16u), \
                       f16_bits_to_f32(w.y), f16_bits_to_f32(w.y >> 16u))"
            .into(),
        DType::Bf16 => "vec4<f32>(bitcast<f32>(w.x << 16u), \
                        bitcast<f32>(w.x & 0xffff0000u), bitcast<f32>(w.y << 16u), \
                        bitcast<f32>(w.y & 0xffff0000u))"
            .into(),
        DType::Fp8E4m3 | DType::Fp8E5m2 => fp8x4(dtype, "w"),
        DType::I32 | DType::I64 => "vec4<f32>(0.0)".into(),
    }
}

/// Body of the tiled2h form's `kv_cvt4`: the four elements of `w` as `vec4<f16>`. An f16
/// cache is bound as `array<vec4<f16>>` ([`kv_buffer`]), so its words need no unpacking;
/// other dtypes are unpacked to f32 and rounded to f16 (the host never selects the form for
/// them, see `WgpuAttentionImpl::tile_shader`, but the module stays valid).
pub(super) fn cvt_body_f16(dtype: DType) -> String {
    match dtype {
        DType::F16 => "    return w;\n".into(),
        _ => format!("    return vec4<f16>({});\n", cvt_expr(dtype)),
    }
}

/// The WGSL type of four elements of a `dtype` K / V source as the attention kernel reads
/// them: [`storage_type`], except for f16 in the tiled2h form (`half`), which binds f16
/// data as `array<vec4<f16>>` (8 bytes, one thread's whole words, as every other access).
pub(super) fn kv_storage_type(dtype: DType, half: bool) -> &'static str {
    if half && dtype == DType::F16 {
        "vec4<f16>"
    } else {
        storage_type(dtype)
    }
}

/// Declaration and `<name>_load4` of a read-only K / V binding: [`buffer`], or for f16 in
/// the tiled2h form (`half`) an `array<vec4<f16>>` whose loads convert in hardware (naga
/// cannot bitcast a u32 to `vec2<f16>`, so the packed-u32 binding would need a round trip
/// through f32 per element).
pub(super) fn kv_buffer(name: &str, binding: u32, dtype: DType, half: bool) -> String {
    if kv_storage_type(dtype, half) == storage_type(dtype) {
        return buffer(name, binding, dtype, Access::Read);
    }
    format!(
        "@group(0) @binding({binding}) var<storage, read> {name}_buf: array<vec4<f16>>;\n\
         fn {name}_load4(e: u32) -> vec4<f32> {{\n    return vec4<f32>({name}_buf[e >> 2u]);\n}}\n"
    )
}

fn store_body(name: &str, dtype: DType) -> String {
    let buf = format!("{name}_buf[e >> 2u]");
    match dtype {
        DType::F32 => format!("    {buf} = v;\n"),
        DType::F16 => format!(
            "    {buf} = vec2<u32>(f32_to_f16_bits(v.x) | (f32_to_f16_bits(v.y) << 16u), \
             f32_to_f16_bits(v.z) | (f32_to_f16_bits(v.w) << 16u));\n"
        ),
        DType::Bf16 => format!(
            "    {buf} = vec2<u32>(f32_to_bf16_bits(v.x) | (f32_to_bf16_bits(v.y) << 16u), \
             f32_to_bf16_bits(v.z) | (f32_to_bf16_bits(v.w) << 16u));\n"
        ),
        DType::Fp8E4m3 | DType::Fp8E5m2 => {
            let f = if dtype == DType::Fp8E4m3 {
                "f32_to_e4m3"
            } else {
                "f32_to_e5m2"
            };
            format!(
                "    {buf} = {f}(v.x, scale) | ({f}(v.y, scale) << 8u) | ({f}(v.z, scale) << 16u) \
                 | ({f}(v.w, scale) << 24u);\n"
            )
        }
        DType::I32 | DType::I64 => String::new(),
    }
}

/// How a generated buffer accessor is used.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// `<name>_load4(e)`.
    Read,
    /// `<name>_store4(e, v)`.
    Write,
}

/// Declaration and accessor of one typed buffer.
pub(super) fn buffer(name: &str, binding: u32, dtype: DType, access: Access) -> String {
    let mode = if access == Access::Read {
        "read"
    } else {
        "read_write"
    };
    let mut s = format!(
        "@group(0) @binding({binding}) var<storage, {mode}> {name}_buf: array<{}>;\n",
        storage_type(dtype)
    );
    match access {
        Access::Read => {
            s += &format!("fn {name}_load4(e: u32) -> vec4<f32> {{\n");
            s += &load_body(name, dtype);
        }
        Access::Write => {
            s += &format!("fn {name}_store4(e: u32, v: vec4<f32>) {{\n");
            s += "    let scale = 1.0;\n";
            s += &store_body(name, dtype);
        }
    }
    s += "}\n";
    s
}

/// How a kernel binds its KV cache: one buffer, or the chunks of a cache stored in several
/// (the Vulkan runtime's tensors larger than one binding; the generated accessors are
/// described at `cache_binding` in `kernels/wgsl/preprocess.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheChunks {
    /// Buffers: 1, or the chunks.
    pub count: u32,
    /// The device indexes a binding array by any value; otherwise a `switch` of constant
    /// indices picks the chunk.
    pub any_index: bool,
}

impl CacheChunks {
    /// One buffer.
    pub const ONE: CacheChunks = CacheChunks {
        count: 1,
        any_index: false,
    };

    /// `key` of a module that binds its cache this way.
    pub(super) fn key(self, key: String) -> String {
        match (self.count, self.any_index) {
            (0 | 1, _) => key,
            (n, true) => format!("{key} chunks{n}"),
            (n, false) => format!("{key} chunks{n} switch"),
        }
    }

    /// The directive a module needs before its first declaration (empty for one buffer).
    pub(super) fn enable(self) -> &'static str {
        if self.count > 1 {
            "enable wgpu_binding_array;\n"
        } else {
            ""
        }
    }
}

/// A KV cache's binding and how kernels address it. With one buffer the cache is
/// `<name>_buf: array<raw>` and an element's address `KB` is its u32 index. With chunks it is
/// a binding array `<name>_chunks` of `chunks.count` buffers (a cache stored in chunks of
/// `params.blocks_per_window` whole blocks) and `KB` is `vec2<u32>` (chunk, element index in
/// the chunk), so no index ever exceeds one binding; the chunk is an index into the array
/// where the device takes any index, else a `switch` whose cases index it by constants.
/// Either way `kv_addr(blk, off)` is element `off` of block `blk` (`params.block_stride`
/// elements per block), `kb_add(a, d)` moves `d` elements within the block, and
/// `<name>_word(a)` reads the `raw` word holding element `a` (`per` elements a word, a power
/// of two) — or, with `store`, `<name>_store4(a, v, scale)` writes the four elements at `a`
/// (a multiple of 4) in that dtype. The one-buffer form is plain u32 index arithmetic, so a
/// cache that fits one binding pays nothing for chunks.
pub(super) fn cache_binding(
    name: &str,
    binding: u32,
    raw: &str,
    per: u32,
    chunks: CacheChunks,
    store: Option<DType>,
) -> String {
    let mode = if store.is_some() {
        "read_write"
    } else {
        "read"
    };
    let n = chunks.count;
    let mut s = if n > 1 {
        format!(
            "struct CacheChunk {{\n    w: array<{raw}>,\n}}\n\
             @group(0) @binding({binding}) var<storage, {mode}> {name}_chunks: \
             binding_array<CacheChunk, {n}>;\n\
             alias KB = vec2<u32>;\n\
             fn kv_addr(blk: u32, off: u32) -> KB {{\n\
             \x20   return vec2<u32>(blk / params.blocks_per_window,\n\
             \x20       (blk % params.blocks_per_window) * params.block_stride + off);\n}}\n\
             fn kb_add(a: KB, d: u32) -> KB {{\n    return vec2<u32>(a.x, a.y + d);\n}}\n"
        )
    } else {
        format!(
            "@group(0) @binding({binding}) var<storage, {mode}> {name}_buf: array<{raw}>;\n\
             alias KB = u32;\n\
             fn kv_addr(blk: u32, off: u32) -> KB {{\n\
             \x20   return blk * params.block_stride + off;\n}}\n\
             fn kb_add(a: KB, d: u32) -> KB {{\n    return a + d;\n}}\n"
        )
    };
    // The word at `a` as an expression of `a` (one buffer, or an index into the array), or
    // `None` for the switch form.
    let direct = match (n > 1, chunks.any_index) {
        (false, _) => Some(format!("{name}_buf[a / {per}u]")),
        (true, true) => Some(format!("{name}_chunks[a.x].w[a.y / {per}u]")),
        (true, false) => None,
    };
    // The switch form: one case per chunk, each indexing the array by a constant.
    let cases = |body: &dyn Fn(u32) -> String| -> String {
        let mut c = "    switch a.x {\n".to_string();
        for k in 0..n {
            let label = if k + 1 == n {
                "default".to_string()
            } else {
                format!("case {k}u")
            };
            c += &format!("        {label}: {{\n            {}\n        }}\n", body(k));
        }
        c + "    }\n"
    };
    match (store, &direct) {
        (None, Some(word)) => {
            s += &format!("fn {name}_word(a: KB) -> {raw} {{\n    return {word};\n}}\n");
        }
        (None, None) => {
            s += &format!("fn {name}_word(a: KB) -> {raw} {{\n    let i = a.y / {per}u;\n");
            s += &cases(&|k| format!("return {name}_chunks[{k}].w[i];"));
            s += "}\n";
        }
        (Some(dtype), _) => {
            let body = store_body(name, dtype);
            let lvalue = format!("{name}_buf[e >> 2u]");
            s += &format!("fn {name}_store4(a: KB, v: vec4<f32>, scale: f32) {{\n");
            match &direct {
                Some(word) => s += &body.replace(&lvalue, word),
                None => {
                    s += &body.replace(&format!("{lvalue} = "), "let w = ");
                    s += &format!("    let i = a.y / {per}u;\n");
                    s += &cases(&|k| format!("{name}_chunks[{k}].w[i] = w;"));
                }
            }
            s += "}\n";
        }
    }
    s
}

/// [`cache_binding`] of a cache of `dtype` read as `<name>_load4(a)`: the four elements at
/// `a` (a multiple of 4) as f32.
pub(super) fn cache_reader(name: &str, binding: u32, dtype: DType, chunks: CacheChunks) -> String {
    let mut s = cache_binding(name, binding, storage_type(dtype), 4, chunks, None);
    s += &format!("fn {name}_load4(a: KB) -> vec4<f32> {{\n    let w = {name}_word(a);\n");
    s += &cvt_body(dtype);
    s += "}\n";
    s
}

/// Expands the loops of a shader template marked `// @unroll`: the marked line must be
/// followed by `for (var X = 0u; X < N; X = X + 1u) {`, N a product (`*`) of integer
/// literals and names in `consts`, its body ending at the matching `}` line. The body is
/// repeated N times, each copy in its own `{ }` block with the identifier X replaced by
/// the literal `Ku`, so every array index that depends only on unrolled loop variables
/// is a constant expression: drivers keep such arrays in registers, where a loop the
/// driver does not unroll would leave them in (slow, per-thread) local memory. Marked
/// loops may nest; their bodies must not `break` or `continue`.
pub fn unroll(src: &str, consts: &[(&str, u32)]) -> String {
    let lines: Vec<&str> = src.lines().collect();
    let mut out = String::with_capacity(src.len() * 2);
    for l in expand_unrolled(&lines, consts) {
        out += &l;
        out.push('\n');
    }
    out
}

fn expand_unrolled(lines: &[&str], consts: &[(&str, u32)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "// @unroll" {
            out.push(lines[i].to_string());
            i += 1;
            continue;
        }
        let head = lines
            .get(i + 1)
            .unwrap_or_else(|| panic!("@unroll at line {i} has no loop"));
        let (var, count) = parse_unrolled_for(head, consts).unwrap_or_else(|| {
            panic!("@unroll needs `for (var X = 0u; X < N; X = X + 1u) {{`: {head}")
        });
        let mut depth = 0i32;
        let mut end = None;
        for (j, l) in lines.iter().enumerate().skip(i + 1) {
            depth += l.matches('{').count() as i32 - l.matches('}').count() as i32;
            if depth == 0 {
                end = Some(j);
                break;
            }
        }
        let end = end.unwrap_or_else(|| panic!("unbalanced loop after @unroll: {head}"));
        let body = expand_unrolled(&lines[i + 2..end], consts);
        let indent: String = head.chars().take_while(|c| c.is_whitespace()).collect();
        for k in 0..count {
            out.push(format!("{indent}{{"));
            let lit = format!("{k}u");
            for l in &body {
                out.push(replace_ident(l, &var, &lit));
            }
            out.push(format!("{indent}}}"));
        }
        i = end + 1;
    }
    out
}

fn parse_unrolled_for(line: &str, consts: &[(&str, u32)]) -> Option<(String, u32)> {
    let rest = line.trim().strip_prefix("for (var ")?;
    let (var, rest) = rest.split_once(" = 0u; ")?;
    let (cond_var, rest) = rest.split_once(" < ")?;
    let (bound, step) = rest.split_once("; ")?;
    if cond_var != var || step != format!("{var} = {var} + 1u) {{") {
        return None;
    }
    let mut n = 1u32;
    for f in bound.split('*').map(str::trim) {
        let v = match f.trim_end_matches('u').parse::<u32>() {
            Ok(v) => v,
            Err(_) => consts.iter().find(|(name, _)| *name == f)?.1,
        };
        n = n.checked_mul(v)?;
    }
    Some((var.to_string(), n))
}

/// `line` with every identifier token equal to `var` replaced by `with`.
fn replace_ident(line: &str, var: &str, with: &str) -> String {
    let mut out = String::with_capacity(line.len() + 8);
    let mut tok = String::new();
    let flush = |tok: &mut String, out: &mut String| {
        if tok == var {
            out.push_str(with);
        } else {
            out.push_str(tok);
        }
        tok.clear();
    };
    for ch in line.chars() {
        if ch.is_ascii_alphanumeric() || ch == '_' {
            tok.push(ch);
        } else {
            flush(&mut tok, &mut out);
            out.push(ch);
        }
    }
    flush(&mut tok, &mut out);
    out
}

/// WGSL for the four fp8 values (`dtype` E4M3 or E5M2) packed in the u32 `word`, lowest byte
/// first, as a `vec4<f32>` (not yet multiplied by the scale; `e4m3x4_to_f32` /
/// `e5m2x4_to_f32` of common.wgsl, exact and branch-free).
fn fp8x4(dtype: DType, word: &str) -> String {
    let f = if dtype == DType::Fp8E4m3 {
        "e4m3x4_to_f32"
    } else {
        "e5m2x4_to_f32"
    };
    format!("{f}({word})")
}

pub(super) fn consts(pairs: &[(&str, u32)]) -> String {
    pairs
        .iter()
        .map(|(n, v)| format!("const {n}: u32 = {v}u;\n"))
        .collect()
}

pub(super) fn short(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::Bf16 => "bf16",
        DType::Fp8E4m3 => "e4m3",
        DType::Fp8E5m2 => "e5m2",
        DType::I32 => "i32",
        DType::I64 => "i64",
    }
}

/// Body of `unpack4(w, i)` for a granule of `dtype`.
pub(super) fn unpack_body(dtype: DType) -> String {
    match dtype {
        DType::F32 => "    return bitcast<vec4<f32>>(w);\n".into(),
        DType::Bf16 => "    let a = w[2u * i];\n    let b = w[2u * i + 1u];\n    \
                        return vec4<f32>(bitcast<f32>(a << 16u), bitcast<f32>(a & 0xffff0000u), \
                        bitcast<f32>(b << 16u), bitcast<f32>(b & 0xffff0000u));\n"
            .into(),
        DType::F16 => "    let a = w[2u * i];\n    let b = w[2u * i + 1u];\n    \
                       return vec4<f32>(f16_bits_to_f32(a), f16_bits_to_f32(a >> 16u), \
                       f16_bits_to_f32(b), f16_bits_to_f32(b >> 16u));\n"
            .into(),
        DType::Fp8E4m3 | DType::Fp8E5m2 => {
            format!("    let x = w[i];\n    return {};\n", fp8x4(dtype, "x"))
        }
        DType::I32 | DType::I64 => "    return vec4<f32>(0.0);\n".into(),
    }
}

/// Replaces the coop form's arrays of cooperative matrices (`var NAME: array<T, N>;`,
/// indexed only by the literals the unroller leaves: `NAME[Ku]`) by N named variables
/// `NAME_K`, so no matrix goes through an array in function memory. (First suspected of
/// the coop form's wrong results on the H200; the cause was the workgroup layout, see
/// `coop_spirv`, and `tests/wgpu_coop.rs`'s kernel-shaped probe is exact with arrays. The
/// named form is what was measured and verified there.) A length that is neither a
/// header constant nor a literal leaves the array as it is.
pub(super) fn coop_scalarise(src: &str, consts: &[(&str, u32)]) -> String {
    let mut out = String::with_capacity(src.len());
    let mut arrays: Vec<(String, u32)> = Vec::new();
    for line in src.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("var ") {
            if let Some((name, ty)) = rest.split_once(": array<coop_mat") {
                let ty = format!("coop_mat{ty}");
                if let Some((elem, n)) = ty.trim_end_matches(">;").rsplit_once(", ") {
                    let len = consts
                        .iter()
                        .find(|(c, _)| *c == n)
                        .map(|&(_, v)| v)
                        .or_else(|| n.trim_end_matches('u').parse().ok());
                    let Some(n) = len else {
                        out += line;
                        out.push('\n');
                        continue;
                    };
                    for k in 0..n {
                        out += &format!("    var {name}_{k}: {elem};\n");
                    }
                    arrays.push((name.to_string(), n));
                    continue;
                }
            }
        }
        let mut l = line.to_string();
        for (name, n) in &arrays {
            for k in 0..*n {
                l = l.replace(&format!("{name}[{k}u]"), &format!("{name}_{k}"));
            }
        }
        out += &l;
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unroll_repeats_marked_loops() {
        let src = "a\n    // @unroll\n    for (var u = 0u; u < N * 2u; u = u + 1u) {\n        \
                   // @unroll\n        for (var r = 0u; r < M; r = r + 1u) {\n            \
                   x[u * M + r] = u32(u) + ku;\n        }\n    }\nb";
        let out = unroll(src, &[("N", 2), ("M", 2)]);
        assert_eq!(out.matches("x[").count(), 8);
        assert!(out.contains("x[3u * M + 1u] = u32(3u) + ku;"), "{out}");
        assert!(out.starts_with("a\n") && out.ends_with("b\n"));
        assert!(!out.contains("for ("));
    }
}
