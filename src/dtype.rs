//! Element types: activation dtypes, storage dtypes and the KV-cache dtype strings of vLLM.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The element type of a [`crate::Tensor`].
///
/// The three float types are activation dtypes; the fp8 types only appear in KV caches; the
/// integer types carry metadata (block tables, slot mappings) to devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    Bf16,
    /// OCP fp8 E4M3 "fn" variant (max 448, no infinities), stored as a byte.
    Fp8E4m3,
    /// OCP fp8 E5M2 (max 57344, with infinities), stored as a byte.
    Fp8E5m2,
    /// 32-bit signed integer (query_start_loc, seq_lens, block tables).
    I32,
    /// 64-bit signed integer (slot mappings).
    I64,
}

impl DType {
    /// Bytes per element.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::Bf16 => 2,
            DType::Fp8E4m3 | DType::Fp8E5m2 => 1,
            DType::I64 => 8,
        }
    }

    /// True for the activation dtypes (f32, f16, bf16).
    pub const fn is_activation(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::Bf16)
    }

    /// True for the two fp8 formats.
    pub const fn is_fp8(self) -> bool {
        matches!(self, DType::Fp8E4m3 | DType::Fp8E5m2)
    }

    /// The lower-case name used on the command line and in reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::Fp8E4m3 => "fp8_e4m3",
            DType::Fp8E5m2 => "fp8_e5m2",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "float" => DType::F32,
            "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::Bf16,
            other => {
                return Err(Error::DType {
                    what: "activation dtype",
                    got: other.to_string(),
                    expected: "one of f32, f16, bf16".into(),
                })
            }
        })
    }
}

/// The KV-cache dtype of a layer, as vLLM's `CacheDType` strings that polyattn implements.
///
/// `Auto` stores the cache in the activation dtype. The fp8 formats store `x / scale`
/// saturated to the format's finite range and load `q * scale` (vLLM §6.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum CacheDType {
    /// Same as the activation dtype.
    Auto,
    /// binary16 cache.
    F16,
    /// bfloat16 cache.
    Bf16,
    /// fp8 E4M3 (vLLM `fp8` and `fp8_e4m3`).
    Fp8E4m3,
    /// fp8 E5M2.
    Fp8E5m2,
}

impl CacheDType {
    /// Every cache dtype, in vLLM's order.
    pub const ALL: [CacheDType; 5] = [
        CacheDType::Auto,
        CacheDType::F16,
        CacheDType::Bf16,
        CacheDType::Fp8E4m3,
        CacheDType::Fp8E5m2,
    ];

    /// The storage dtype of the cache for activations of `act`.
    pub const fn storage_dtype(self, act: DType) -> DType {
        match self {
            CacheDType::Auto => act,
            CacheDType::F16 => DType::F16,
            CacheDType::Bf16 => DType::Bf16,
            CacheDType::Fp8E4m3 => DType::Fp8E4m3,
            CacheDType::Fp8E5m2 => DType::Fp8E5m2,
        }
    }

    /// True for the quantised (scaled) formats.
    pub const fn is_fp8(self) -> bool {
        matches!(self, CacheDType::Fp8E4m3 | CacheDType::Fp8E5m2)
    }

    /// vLLM's string for it.
    pub const fn as_str(self) -> &'static str {
        match self {
            CacheDType::Auto => "auto",
            CacheDType::F16 => "float16",
            CacheDType::Bf16 => "bfloat16",
            CacheDType::Fp8E4m3 => "fp8_e4m3",
            CacheDType::Fp8E5m2 => "fp8_e5m2",
        }
    }
}

impl fmt::Display for CacheDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CacheDType {
    type Err = Error;
    /// Accepts vLLM's strings (`auto`, `float16`, `bfloat16`, `fp8`, `fp8_e4m3`, `fp8_e5m2`)
    /// and the short forms `f16`, `bf16`.
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "auto" => CacheDType::Auto,
            "float16" | "f16" | "half" => CacheDType::F16,
            "bfloat16" | "bf16" => CacheDType::Bf16,
            "fp8" | "fp8_e4m3" | "e4m3" => CacheDType::Fp8E4m3,
            "fp8_e5m2" | "e5m2" => CacheDType::Fp8E5m2,
            other => {
                return Err(Error::DType {
                    what: "kv_cache_dtype",
                    got: other.to_string(),
                    expected: "one of auto, float16, bfloat16, fp8, fp8_e4m3, fp8_e5m2".into(),
                })
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vllm_strings() {
        assert_eq!("fp8".parse::<CacheDType>().unwrap(), CacheDType::Fp8E4m3);
        assert_eq!("AUTO".parse::<CacheDType>().unwrap(), CacheDType::Auto);
        assert_eq!("bfloat16".parse::<DType>().unwrap(), DType::Bf16);
        let err = "int4".parse::<CacheDType>().unwrap_err().to_string();
        assert!(err.contains("fp8_e5m2"), "{err}");
    }

    #[test]
    fn storage_follows_activation_for_auto() {
        assert_eq!(CacheDType::Auto.storage_dtype(DType::Bf16), DType::Bf16);
        assert_eq!(
            CacheDType::Fp8E5m2.storage_dtype(DType::F32),
            DType::Fp8E5m2
        );
    }
}
