//! The LSE merge's launch as plain data, for every runtime of the family: the parameter block
//! of `merge_states.cu`, the entry point and the launch shape (`merge_attn_states_vec`, one
//! thread per 8 elements of a row, when the head size is a multiple of 8; else
//! `merge_attn_states`, one CTA per token and head).

use crate::dtype::DType;
use crate::error::{Error, Result};

use super::params::MergeParams;
use super::variants::code;

/// Threads per CTA of `merge_attn_states_vec`.
pub const MERGE_VEC_THREADS: u32 = 256;

/// The device addresses a merge reads and writes.
#[derive(Clone, Copy, Debug)]
pub struct MergeBuffers {
    /// `[T][H][D]` prefix outputs.
    pub prefix_out: u64,
    /// `[H][T]` f32 prefix LSEs.
    pub prefix_lse: u64,
    /// `[T][H][D]` suffix outputs.
    pub suffix_out: u64,
    /// `[H][T]` f32 suffix LSEs.
    pub suffix_lse: u64,
    /// `[T][H][D]` output.
    pub out: u64,
    /// `[H][T]` f32 output LSEs (0: not written).
    pub out_lse: u64,
}

/// The sizes and dtypes of a merge.
#[derive(Clone, Copy, Debug)]
pub struct MergeShape {
    /// Tokens.
    pub num_tokens: usize,
    /// Heads.
    pub num_heads: usize,
    /// Head size.
    pub head_size: usize,
    /// The partial outputs' dtype.
    pub in_dtype: DType,
    /// The output's dtype.
    pub out_dtype: DType,
    /// Tokens before this index merge; the rest copy the suffix (clamped to the tokens).
    pub prefill_tokens: usize,
}

impl MergeShape {
    /// The shape of a merge of `[T, H, D]` partial outputs of `in_dtype` (`prefix_shape`)
    /// into an `out_dtype` output; tokens from `prefill_tokens_with_context` (all when `None`)
    /// copy the suffix.
    pub fn of(
        prefix_shape: &[usize],
        in_dtype: DType,
        out_dtype: DType,
        prefill_tokens_with_context: Option<usize>,
    ) -> Result<MergeShape> {
        let &[t, h, d] = prefix_shape else {
            return Err(Error::shape(
                "prefix_output",
                prefix_shape,
                "[num_tokens, num_heads, head_size]",
            ));
        };
        Ok(MergeShape {
            num_tokens: t,
            num_heads: h,
            head_size: d,
            in_dtype,
            out_dtype,
            prefill_tokens: prefill_tokens_with_context.unwrap_or(t),
        })
    }
}

/// One merge: its entry point, parameter block and launch shape.
#[derive(Clone, Copy, Debug)]
pub struct MergeLaunch {
    /// `merge_attn_states_vec` or `merge_attn_states`.
    pub function: &'static str,
    /// The kernel's parameter block.
    pub params: MergeParams,
    /// CTAs in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per CTA.
    pub threads: u32,
}

fn i32_of(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| Error::config(format!("{what} = {v} exceeds the kernels' i32 range")))
}

fn u32_of(what: &str, v: u64) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::config(format!("{what} = {v} exceeds a launch dimension")))
}

/// The launch of a merge of shape `s` over `b`; `None` when there is nothing to merge (no
/// token or no head).
pub fn merge_launch(b: MergeBuffers, s: &MergeShape) -> Result<Option<MergeLaunch>> {
    let (t, h, d) = (s.num_tokens, s.num_heads, s.head_size);
    if t == 0 || h == 0 {
        return Ok(None);
    }
    let params = MergeParams {
        o_p: b.prefix_out,
        o_s: b.suffix_out,
        lse_p: b.prefix_lse,
        lse_s: b.suffix_lse,
        out: b.out,
        out_lse: b.out_lse,
        in_dtype: code(s.in_dtype)?,
        out_dtype: code(s.out_dtype)?,
        num_tokens: i32_of("num_tokens", t)?,
        num_heads: i32_of("num_heads", h)?,
        head_size: i32_of("head_size", d)?,
        prefill_tokens: i32_of("prefill_tokens_with_context", s.prefill_tokens.min(t))?,
    };
    let launch = if d % 8 == 0 {
        // One thread per 8 elements of a row (merge_states.cu says why).
        let vectors = (t as u64)
            .checked_mul(h as u64)
            .and_then(|x| x.checked_mul((d / 8) as u64))
            .ok_or_else(|| Error::overflow("merge", format!("{t} tokens x {h} heads x {d}")))?;
        let ctas = u32_of("merge CTAs", vectors.div_ceil(u64::from(MERGE_VEC_THREADS)))?;
        MergeLaunch {
            function: "merge_attn_states_vec",
            params,
            grid: (ctas, 1, 1),
            threads: MERGE_VEC_THREADS,
        }
    } else {
        MergeLaunch {
            function: "merge_attn_states",
            params,
            grid: (u32_of("tokens", t as u64)?, u32_of("heads", h as u64)?, 1),
            // The kernel strides over the head's dims.
            threads: (d.div_ceil(32) * 32).clamp(32, 128) as u32,
        }
    };
    Ok(Some(launch))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(t: usize, h: usize, d: usize) -> MergeShape {
        MergeShape {
            num_tokens: t,
            num_heads: h,
            head_size: d,
            in_dtype: DType::F32,
            out_dtype: DType::Bf16,
            prefill_tokens: 1000,
        }
    }

    fn buffers() -> MergeBuffers {
        MergeBuffers {
            prefix_out: 1,
            prefix_lse: 2,
            suffix_out: 3,
            suffix_lse: 4,
            out: 5,
            out_lse: 0,
        }
    }

    #[test]
    fn launch_shapes_and_fields() {
        let l = merge_launch(buffers(), &shape(10, 4, 128))
            .unwrap()
            .unwrap();
        assert_eq!(l.function, "merge_attn_states_vec");
        // 10 * 4 * 16 vectors on 256-thread CTAs.
        assert_eq!(l.grid, (3, 1, 1));
        assert_eq!((l.params.o_p, l.params.o_s, l.params.lse_p), (1, 3, 2));
        assert_eq!((l.params.lse_s, l.params.out, l.params.out_lse), (4, 5, 0));
        assert_eq!(l.params.in_dtype, code(DType::F32).unwrap());
        assert_eq!(l.params.out_dtype, code(DType::Bf16).unwrap());
        // prefill_tokens is clamped to the tokens.
        assert_eq!(l.params.prefill_tokens, 10);
        let l = merge_launch(buffers(), &shape(7, 3, 12)).unwrap().unwrap();
        assert_eq!(l.function, "merge_attn_states");
        assert_eq!((l.grid, l.threads), ((7, 3, 1), 32));
        assert!(merge_launch(buffers(), &shape(0, 3, 64)).unwrap().is_none());
        assert!(merge_launch(buffers(), &shape(3, 0, 64)).unwrap().is_none());
    }

    #[test]
    fn sizes_past_the_kernels_range_are_errors() {
        assert!(merge_launch(buffers(), &shape(1 << 31, 1, 64)).is_err());
        assert!(merge_launch(buffers(), &shape(1 << 20, 1 << 20, 8)).is_err());
    }
}
