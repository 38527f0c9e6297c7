//! The layer configuration flags shared by `info` and `check`.

use clap::Args;
use polyattn::{AttentionType, CacheDType, DType, SelectorConfig};

/// A layer configuration, as the selector sees it.
#[derive(Args, Debug, Clone)]
pub struct ConfigArgs {
    /// Head size (default 128; with `--mla`, 576: DeepSeek-V3's kv_lora_rank 512 + rope 64).
    #[arg(long)]
    pub head_size: Option<usize>,
    /// Activation dtype: f32, f16, bf16.
    #[arg(long, default_value = "bf16")]
    pub dtype: DType,
    /// KV-cache dtype: auto, float16, bfloat16, fp8 (= fp8_e4m3), fp8_e5m2.
    #[arg(long, default_value = "auto")]
    pub kv_dtype: CacheDType,
    /// Kernel block size (tokens per KV block); unset lets the backend choose.
    #[arg(long)]
    pub block_size: Option<u32>,
    /// Attention type: decoder, encoder, encoder_only, encoder_decoder.
    #[arg(long, default_value = "decoder", value_parser = parse_attn_type)]
    pub attn_type: AttentionType,
    /// The layer has attention sinks.
    #[arg(long)]
    pub sinks: bool,
    /// The layer uses ALiBi.
    #[arg(long)]
    pub alibi: bool,
    /// The layer uses a sliding window.
    #[arg(long)]
    pub sliding_window: bool,
    /// The layer uses a logit soft cap.
    #[arg(long)]
    pub soft_cap: bool,
    /// MLA layer.
    #[arg(long)]
    pub mla: bool,
}

fn parse_attn_type(s: &str) -> Result<AttentionType, String> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "decoder" => AttentionType::Decoder,
        "encoder" => AttentionType::Encoder,
        "encoder_only" | "encoder-only" => AttentionType::EncoderOnly,
        "encoder_decoder" | "encoder-decoder" => AttentionType::EncoderDecoder,
        other => {
            return Err(format!(
                "unknown attention type '{other}'; valid: decoder, encoder, encoder_only, encoder_decoder"
            ))
        }
    })
}

impl ConfigArgs {
    /// The selector configuration these flags describe.
    pub fn selector_config(&self) -> SelectorConfig {
        let head_size = self.head_size.unwrap_or(if self.mla { 576 } else { 128 });
        let mut c = SelectorConfig::new(head_size, self.dtype, self.kv_dtype);
        c.block_size = self.block_size;
        c.attn_type = self.attn_type;
        c.has_sink = self.sinks;
        c.use_alibi = self.alibi;
        c.use_sliding_window = self.sliding_window;
        c.use_soft_cap = self.soft_cap;
        c.use_mla = self.mla;
        c
    }
}
