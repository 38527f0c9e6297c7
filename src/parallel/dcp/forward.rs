//! The one-device forward (every rank's cache on one device) and the combine of the ranks'
//! partial results.

use std::f32::consts::LN_2;

use super::DcpMetadata;
use crate::attention::{AttentionImpl, AttentionLayer};
use crate::capability::AttentionType;
use crate::device::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;

/// The vLLM check that an impl can take part in DCP, and the layer features a shard cannot
/// honour.
pub fn check_impl(imp: &dyn AttentionImpl) -> Result<()> {
    if !imp.can_return_lse_for_decode() {
        return Err(Error::config(
            "Decode Context Parallelism (DCP) requires attention implementations to return the \
             softmax LSE during decode, but this impl does not. Try a different backend by \
             setting POLYATTN_BACKEND or disable DCP.",
        ));
    }
    if !imp.supports_dcp() {
        return Err(Error::config(
            "Decode Context Parallelism (DCP): this impl does not declare supports_dcp (it \
             cannot attend over one rank's shard). Try a different backend by setting \
             POLYATTN_BACKEND or disable DCP.",
        ));
    }
    let p = imp.params();
    let refuse = |what: &str| {
        Err(Error::config(format!(
            "decode context parallelism: {what}, so the layer cannot be sharded"
        )))
    };
    if p.attn_type != AttentionType::Decoder {
        return refuse("only decoder self-attention has a sharded KV cache");
    }
    if p.sliding_window.is_some() {
        return refuse("a sliding window needs each key's absolute position");
    }
    if p.alibi_slopes.is_some() {
        return refuse("ALiBi needs each key's absolute position");
    }
    if p.sinks.is_some() {
        return refuse("attention sinks would be counted once per rank");
    }
    Ok(())
}

/// Attention of a decode batch whose KV cache is sharded over `caches` (one per rank of the
/// metadata's layout, all on the query's device): each rank writes the new tokens it owns and
/// attends over its shard, and the partial results are combined into `output` and, when
/// given, `output_lse` (`[num_heads, num_reqs]`, natural log whatever the impl's base).
///
/// `query` / `output` are `[num_reqs, num_heads, head_size]`, `key` / `value`
/// `[num_reqs, num_kv_heads, head_size]` (absent when the layer reads another layer's cache).
/// With more than one rank holding keys it allocates each rank's partial output and LSE and
/// the merge's accumulators per call (the one-device form checks the math; an engine keeps
/// them in its own workspace and calls [`combine`]).
#[allow(clippy::too_many_arguments)]
pub fn forward_decode(
    imp: &dyn AttentionImpl,
    layer: &AttentionLayer,
    query: &Tensor,
    key: Option<&Tensor>,
    value: Option<&Tensor>,
    caches: &mut [KvCache],
    metadata: &DcpMetadata,
    output: &mut Tensor,
    mut output_lse: Option<&mut Tensor>,
) -> Result<()> {
    check_impl(imp)?;
    let n = metadata.layout().world_size();
    if caches.len() != n {
        return Err(Error::config(format!(
            "DCP forward: {} caches for {n} ranks",
            caches.len()
        )));
    }
    let t = metadata.num_reqs;
    let p = imp.params();
    if query.shape().first() != Some(&t) {
        return Err(Error::shape(
            "query",
            query.shape(),
            format!("[{t} requests, {}, {}]", p.num_heads, p.head_size),
        ));
    }
    if let Some(l) = output_lse.as_deref() {
        l.expect_shape("output_lse", &[p.num_heads, t])?;
        l.expect_dtype("output_lse", DType::F32)?;
    }
    if t == 0 {
        return Ok(());
    }
    let active = &metadata.ranks;
    if active.len() == 1 {
        // Rank 0 alone holds keys: its result is the answer.
        imp.forward_with_lse(
            layer,
            query,
            key,
            value,
            &mut caches[0],
            active[0].1.as_ref(),
            output,
            output_lse.as_deref_mut(),
        )?;
        if let Some(l) = output_lse {
            to_natural_log(imp, l)?;
        }
        return Ok(());
    }
    let device = query.device().clone();
    let mut partials = Vec::with_capacity(active.len());
    for (r, (holding, md)) in active.iter().enumerate() {
        let mut out = Tensor::zeros(&device, query.shape(), query.dtype())?;
        let mut lse = Tensor::zeros(&device, &[p.num_heads, t], DType::F32)?;
        imp.forward_with_lse(
            layer,
            query,
            key,
            value,
            &mut caches[r],
            md.as_ref(),
            &mut out,
            Some(&mut lse),
        )?;
        to_natural_log(imp, &mut lse)?;
        partials.push(Partial {
            output: out,
            lse,
            holding: *holding,
        });
    }
    combine(&partials, output, output_lse)
}

/// One rank's partial result: `output [T, H, D]` and `lse [H, T]` (natural log), of which the
/// first `holding` tokens attended over keys of that rank.
#[derive(Debug)]
pub struct Partial {
    /// `[T, num_heads, head_size]`.
    pub output: Tensor,
    /// `[num_heads, T]` f32, natural log.
    pub lse: Tensor,
    /// Leading tokens with keys on the rank (the rest are never read).
    pub holding: usize,
}

/// Combines the partial results of ranks 0, 1, … (rank 0 first, holding every token; later
/// ranks holding a non-increasing number of leading tokens) into `output` and `output_lse`:
/// the multi-rank combine after the partials have been gathered.
pub fn combine(
    partials: &[Partial],
    output: &mut Tensor,
    output_lse: Option<&mut Tensor>,
) -> Result<()> {
    let Some(first) = partials.first() else {
        return Err(Error::config("DCP combine: no partial results"));
    };
    let &[t, h, _] = first.output.shape() else {
        return Err(Error::shape(
            "DCP partial output",
            first.output.shape(),
            "[num_tokens, num_heads, head_size]",
        ));
    };
    for p in partials {
        p.output
            .expect_shape("DCP partial output", first.output.shape())?;
        p.output
            .expect_dtype("DCP partial output", first.output.dtype())?;
        p.lse.expect_shape("DCP partial LSE", &[h, t])?;
        p.lse.expect_dtype("DCP partial LSE", DType::F32)?;
    }
    if first.holding != t {
        return Err(Error::config(format!(
            "DCP combine: rank 0 holds {} of {t} tokens; it holds every request's first block",
            first.holding
        )));
    }
    for w in partials.windows(2) {
        if w[1].holding > w[0].holding {
            return Err(Error::config(
                "DCP combine: later ranks hold no more leading tokens than earlier ones",
            ));
        }
    }
    if partials.len() == 1 {
        output.copy_from(&first.output)?;
        if let Some(l) = output_lse {
            l.copy_from(&first.lse)?;
        }
        return Ok(());
    }
    let device = first.output.device().clone();
    let shape = first.output.shape().to_vec();
    let dtype = first.output.dtype();
    // Two accumulators in turn; the last merge writes the caller's tensors.
    let mut acc: Option<(Tensor, Tensor)> = None;
    let mut spare: Option<(Tensor, Tensor)> = None;
    let last = partials.len() - 1;
    let mut output_lse = output_lse;
    for (i, part) in partials.iter().enumerate().skip(1) {
        let (acc_out, acc_lse) = match &acc {
            Some((o, l)) => (o, l),
            None => (&first.output, &first.lse),
        };
        if i == last {
            return crate::ops::merge_attn_states(
                output,
                &part.output,
                &part.lse,
                acc_out,
                acc_lse,
                output_lse.take(),
                Some(part.holding),
            );
        }
        let (mut o, mut l) = match spare.take() {
            Some(pair) => pair,
            None => (
                Tensor::zeros(&device, &shape, dtype)?,
                Tensor::zeros(&device, &[h, t], DType::F32)?,
            ),
        };
        crate::ops::merge_attn_states(
            &mut o,
            &part.output,
            &part.lse,
            acc_out,
            acc_lse,
            Some(&mut l),
            Some(part.holding),
        )?;
        spare = acc.replace((o, l));
    }
    unreachable!("the loop returns at the last partial")
}

/// Rescales an impl's LSE to natural log when the impl reports base 2 (`log2 Σ exp`):
/// `ln x = log2 x · ln 2`. A small host round trip (one value per head and token), taken only
/// for impls that declare base 2; the built-in impls are base e.
pub(super) fn to_natural_log(imp: &dyn AttentionImpl, lse: &mut Tensor) -> Result<()> {
    if imp.lse_base_on_e() {
        return Ok(());
    }
    let v: Vec<f32> = lse.to_f32_vec()?.into_iter().map(|x| x * LN_2).collect();
    // Written into the caller's buffer (its address stays what the caller holds).
    lse.copy_from(&Tensor::from_f32(
        lse.device(),
        &v,
        lse.shape(),
        DType::F32,
    )?)
}
