//! The embedded tiny model (glassllm 0.1.0's `en` weights, MIT): its character BPE tokenizer
//! and the conversion of its `.npz` weights into [`HostWeights`].
//!
//! Tokenizer (glassllm's `tokenizer.py`): ids 0..4 are `<pad> <unk> <bos> <eos>`, then the
//! alphabet, then one token per merge in rank order. Text becomes chunks with spaces written
//! as `▁`: a newline alone, a run of `▁` followed by non-`▁`, non-newline characters, or a
//! run of `▁` alone; within a chunk the lowest-ranked adjacent pair is merged until none
//! applies. glassllm NFC-normalises first; this reader does not (input is expected to be
//! NFC already, which is what keyboards and most text produce).
//!
//! Weights: `W_Q/W_K/W_V/W_O`, `W1/W3/W2` are stored `[in, out]` (`x @ W`); they are
//! transposed to polyattn's `[out, in]`. RoPE rotates adjacent pairs; embeddings are tied.

use std::collections::HashMap;

use crate::model::{HostLayer, HostWeights, LlamaConfig};
use crate::npz::Npz;
use polyattn::compute::RopeStyle;

/// glassllm's tokenizer.
#[derive(Clone, Debug)]
pub struct GlassTokenizer {
    vocab: Vec<String>,
    ranks: HashMap<(String, String), usize>,
    ids: HashMap<String, u32>,
}

const SPACE: char = '▁';
const SPECIALS: [&str; 4] = ["<pad>", "<unk>", "<bos>", "<eos>"];
const UNK: u32 = 1;
/// Id of `<eos>`.
pub const EOS: u32 = 3;

impl GlassTokenizer {
    /// Reads `{"alphabet": [...], "merges": [[a, b], ...]}`.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("tokenizer JSON: {e}"))?;
        let strs = |x: &serde_json::Value| -> Option<Vec<String>> {
            x.as_array()?
                .iter()
                .map(|s| s.as_str().map(String::from))
                .collect()
        };
        let alphabet = strs(&v["alphabet"]).ok_or("tokenizer JSON: no string array 'alphabet'")?;
        let merges: Vec<(String, String)> = v["merges"]
            .as_array()
            .ok_or("tokenizer JSON: no array 'merges'")?
            .iter()
            .map(|m| match strs(m).as_deref() {
                Some([a, b]) => Ok((a.clone(), b.clone())),
                _ => Err("tokenizer JSON: a merge is not a pair of strings".to_string()),
            })
            .collect::<Result<_, _>>()?;
        let mut vocab: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
        vocab.extend(alphabet);
        vocab.extend(merges.iter().map(|(a, b)| format!("{a}{b}")));
        let ids = vocab
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let ranks = merges
            .into_iter()
            .enumerate()
            .map(|(r, p)| (p, r))
            .collect();
        Ok(GlassTokenizer { vocab, ranks, ids })
    }

    /// Tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    fn chunks(text: &str) -> Vec<Vec<char>> {
        let chars: Vec<char> = text
            .chars()
            .map(|c| if c == ' ' { SPACE } else { c })
            .collect();
        let mut out = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            let start = i;
            if chars[i] == '\n' {
                i += 1;
            } else {
                while i < chars.len() && chars[i] == SPACE {
                    i += 1;
                }
                while i < chars.len() && chars[i] != SPACE && chars[i] != '\n' {
                    i += 1;
                }
            }
            out.push(chars[start..i].to_vec());
        }
        out
    }

    /// Token ids of `text` (characters outside the alphabet become `<unk>`).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        for chunk in Self::chunks(text) {
            let mut symbols: Vec<String> = chunk.iter().map(|c| c.to_string()).collect();
            loop {
                let best = symbols
                    .windows(2)
                    .enumerate()
                    .filter_map(|(i, w)| {
                        self.ranks
                            .get(&(w[0].clone(), w[1].clone()))
                            .map(|&r| (r, i))
                    })
                    .min();
                let Some((rank, _)) = best else { break };
                // Merge every occurrence of the best pair, left to right (glassllm's rule).
                let mut merged = Vec::with_capacity(symbols.len());
                let mut i = 0;
                while i < symbols.len() {
                    if i + 1 < symbols.len()
                        && self
                            .ranks
                            .get(&(symbols[i].clone(), symbols[i + 1].clone()))
                            == Some(&rank)
                    {
                        merged.push(format!("{}{}", symbols[i], symbols[i + 1]));
                        i += 2;
                    } else {
                        merged.push(symbols[i].clone());
                        i += 1;
                    }
                }
                symbols = merged;
            }
            out.extend(symbols.iter().map(|s| *self.ids.get(s).unwrap_or(&UNK)));
        }
        out
    }

    /// The text of `ids` (specials dropped, `<unk>` as `⁇`, `▁` as a space).
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut s = String::new();
        for &id in ids {
            match self.vocab.get(id as usize).map(String::as_str) {
                Some("<unk>") | None => s.push('⁇'),
                Some(t) if SPECIALS.contains(&t) => {}
                Some(t) => s.push_str(t),
            }
        }
        s.replace(SPACE, " ")
    }
}

/// Reads glassllm's `.npz` into host weights and the model's configuration.
pub fn load_weights(npz: &Npz) -> Result<(LlamaConfig, HostWeights), String> {
    let cfg: serde_json::Value =
        serde_json::from_str(npz.string("__config__").map_err(|e| e.to_string())?)
            .map_err(|e| format!("__config__: {e}"))?;
    let get = |k: &str| -> Result<usize, String> {
        cfg[k]
            .as_u64()
            .map(|v| v as usize)
            .ok_or(format!("__config__ has no integer '{k}'"))
    };
    let getf = |k: &str| -> Result<f32, String> {
        cfg[k]
            .as_f64()
            .map(|v| v as f32)
            .ok_or(format!("__config__ has no number '{k}'"))
    };
    let (vocab, hidden, layers) = (get("vocab_size")?, get("d_model")?, get("n_layers")?);
    let (heads, kv_heads, max_len) = (get("n_heads")?, get("n_kv_heads")?, get("max_len")?);
    if heads == 0 || hidden % heads != 0 || kv_heads == 0 || heads % kv_heads != 0 {
        return Err(format!(
            "__config__: {heads} heads / {kv_heads} KV heads do not divide hidden size {hidden}"
        ));
    }
    let head_size = hidden / heads;
    let intermediate = 8 * hidden / 3;
    let config = LlamaConfig {
        vocab_size: vocab,
        hidden,
        intermediate,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_size,
        max_model_len: max_len,
        rope_base: getf("rope_base")?,
        rope_style: RopeStyle::Interleaved,
        rms_eps: getf("eps")?,
    };
    let f = |name: &str, shape: &[usize]| -> Result<Vec<f32>, String> {
        npz.f32(name, shape)
            .map(|d| d.to_vec())
            .map_err(|e| e.to_string())
    };
    // [in, out] -> [out, in]
    let t = |name: &str, rows: usize, cols: usize| -> Result<Vec<f32>, String> {
        let w = npz.f32(name, &[rows, cols]).map_err(|e| e.to_string())?;
        let mut out = vec![0.0f32; rows * cols];
        for r in 0..rows {
            for c in 0..cols {
                out[c * rows + r] = w[r * cols + c];
            }
        }
        Ok(out)
    };
    let kv = kv_heads * head_size;
    let mut host_layers = Vec::with_capacity(layers);
    for l in 0..layers {
        let p = format!("blocks.{l}.");
        host_layers.push(HostLayer {
            attn_norm: f(&format!("{p}norm1.gamma"), &[hidden])?,
            wq: t(&format!("{p}attn.W_Q"), hidden, hidden)?,
            wk: t(&format!("{p}attn.W_K"), hidden, kv)?,
            wv: t(&format!("{p}attn.W_V"), hidden, kv)?,
            wo: t(&format!("{p}attn.W_O"), hidden, hidden)?,
            ffn_norm: f(&format!("{p}norm2.gamma"), &[hidden])?,
            w_gate: t(&format!("{p}ffn.W1"), hidden, intermediate)?,
            w_up: t(&format!("{p}ffn.W3"), hidden, intermediate)?,
            w_down: t(&format!("{p}ffn.W2"), intermediate, hidden)?,
        });
    }
    let weights = HostWeights {
        embedding: f("E", &[vocab, hidden])?,
        layers: host_layers,
        final_norm: f("norm_f.gamma", &[hidden])?,
        lm_head: None,
    };
    Ok((config, weights))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_matches_glassllm() {
        let tok = GlassTokenizer::from_json(crate::EMBEDDED_TOKENIZER).unwrap();
        assert_eq!(tok.vocab_size(), 1024);
        let reference: serde_json::Value =
            serde_json::from_str(include_str!("testdata/glass_reference.json")).unwrap();
        for case in reference["cases"].as_array().unwrap() {
            let prompt = case["prompt"].as_str().unwrap();
            let want: Vec<u32> = case["prompt_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(tok.encode(prompt), want, "{prompt:?}");
            assert_eq!(tok.decode(&want), prompt);
        }
        // Spaces runs, newlines, unknown characters.
        let ids = tok.encode("a  b\n\n  ç€");
        assert_eq!(tok.decode(&ids), "a  b\n\n  ⁇⁇");
        assert!(tok.encode("").is_empty());
    }
}
