//! The two entry points: [`forward`] and [`update_kv_cache`] (module docs: `forward`).

use crate::attention::{AttentionImpl, AttentionLayer, AttentionParams};
use crate::capability::AttentionType;
use crate::device::Tensor;
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::metadata::{AttentionMetadata, BatchMetadata};
use crate::plan::Pass;

use super::{AttendJob, ForwardIo, ForwardKernels, Keys, PassSpec, Target};

/// Every backend whose kernels implement [`ForwardKernels`] is an [`AttentionImpl`] through
/// the driver: its entry points are [`forward`] and [`update_kv_cache`], so no backend writes
/// them again. The driver returns the LSE on every path, decodes included.
impl<K: ForwardKernels + Send + Sync> AttentionImpl for K {
    fn params(&self) -> &AttentionParams {
        ForwardKernels::params(self)
    }

    fn can_return_lse_for_decode(&self) -> bool {
        true
    }

    /// Every driver impl can attend over one rank's shard: a shard is an ordinary paged
    /// cache, and the decode LSE is returned (`crate::parallel::dcp`).
    fn supports_dcp(&self) -> bool {
        true
    }

    fn do_kv_cache_update(
        &self,
        layer: &AttentionLayer,
        key: &Tensor,
        value: &Tensor,
        kv_cache: &mut KvCache,
        metadata: &dyn AttentionMetadata,
    ) -> Result<()> {
        update_kv_cache(self, layer, key, value, kv_cache, metadata)
    }

    fn forward_with_lse(
        &self,
        layer: &AttentionLayer,
        query: &Tensor,
        key: Option<&Tensor>,
        value: Option<&Tensor>,
        kv_cache: &mut KvCache,
        metadata: &dyn AttentionMetadata,
        output: &mut Tensor,
        output_lse: Option<&mut Tensor>,
    ) -> Result<()> {
        forward(
            self, layer, query, key, value, kv_cache, metadata, output, output_lse,
        )
    }
}

/// `AttentionImpl::forward_with_lse` for a backend's kernels `k` (the module docs give the
/// rules): checks, the cache write, the passes and their kernels, one submission.
#[allow(clippy::too_many_arguments)]
pub fn forward<K: ForwardKernels>(
    k: &K,
    layer: &AttentionLayer,
    query: &Tensor,
    key: Option<&Tensor>,
    value: Option<&Tensor>,
    kv_cache: &mut KvCache,
    metadata: &dyn AttentionMetadata,
    output: &mut Tensor,
    output_lse: Option<&mut Tensor>,
) -> Result<()> {
    let p = k.params();
    let md = k.metadata(metadata)?;
    let common = md.common();
    let n = common.num_actual_tokens();
    let dtype = p.check_query_output(query, output, output_lse.as_deref(), n)?;
    let encoder = p.attn_type.is_encoder();
    if p.attn_type == AttentionType::EncoderDecoder {
        return Err(Error::config(format!(
            "the {} backend does not implement encoder_decoder attention",
            K::BACKEND
        )));
    }
    let cascade = md.cascade();
    if cascade.is_some() && (p.alibi_slopes.is_some() || p.sliding_window.is_some() || encoder) {
        return Err(Error::config(
            "cascade attention (common_prefix_len > 0) cannot be combined with ALiBi, a sliding \
             window or encoder attention; build the metadata with common_prefix_len = 0",
        ));
    }

    // Every check before anything is recorded: a refused call leaves the cache as it was.
    let mut new_keys = None;
    let keys = if encoder {
        let (Some(key), Some(value)) = (key, value) else {
            return Err(Error::config(
                "encoder attention needs key and value tensors",
            ));
        };
        p.check_kv_input("key", key, n, dtype)?;
        p.check_kv_input("value", value, n, dtype)?;
        Some(Keys::Dense { key, value })
    } else {
        if key.is_some() != value.is_some() {
            return Err(Error::config("key and value must be given together"));
        }
        // The cache is checked once, against the query's dtype; then the new keys against it.
        p.check_kv_cache(kv_cache, dtype, common)?;
        k.check_cache(kv_cache, md)?;
        if let (Some(key), Some(value)) = (key, value) {
            p.check_kv_update(key, value, common.slot_mapping_cpu().len(), kv_cache)?;
            new_keys = Some((key, value));
        }
        None
    };
    let mut rec = k.begin(md)?;
    if let Some((key, value)) = new_keys {
        k.write_cache(&mut rec, md, layer, key, value, kv_cache)?;
    }
    let keys = keys.unwrap_or(Keys::Cache(kv_cache));
    let mut io = ForwardIo {
        layer,
        query,
        keys,
        output,
        output_lse,
        dtype,
        num_tokens: n,
    };
    if n == 0 {
        return k.finish(rec, Some(&mut io));
    }

    let causal = common.causal() && !encoder;
    let sinks = p.sinks.is_some();
    match cascade.filter(|_| k.runs_cascade()) {
        None => {
            let spec = PassSpec {
                pass: Pass::Full,
                causal,
                sinks,
                target: Target::Output,
            };
            run_pass(k, &mut rec, md, &mut io, spec)?;
        }
        Some(c) => {
            let prefix = PassSpec {
                pass: Pass::Prefix(c.prefix_len),
                causal: false,
                sinks,
                target: Target::Prefix,
            };
            run_pass(k, &mut rec, md, &mut io, prefix)?;
            let suffix = PassSpec {
                pass: Pass::Suffix(c.prefix_len),
                causal,
                sinks: false,
                target: Target::Suffix,
            };
            run_pass(k, &mut rec, md, &mut io, suffix)?;
            k.merge(&mut rec, md, &mut io)?;
        }
    }
    k.finish(rec, Some(&mut io))
}

/// `AttentionImpl::do_kv_cache_update` for a backend's kernels `k`: the checks of a cache
/// write, then the write, submitted.
pub fn update_kv_cache<K: ForwardKernels>(
    k: &K,
    layer: &AttentionLayer,
    key: &Tensor,
    value: &Tensor,
    kv_cache: &mut KvCache,
    metadata: &dyn AttentionMetadata,
) -> Result<()> {
    let md = k.metadata(metadata)?;
    check_update(k, md, key, value, kv_cache)?;
    let mut rec = k.begin(md)?;
    k.write_cache(&mut rec, md, layer, key, value, kv_cache)?;
    k.finish(rec, None)
}

/// The checks of a cache write: key and value `[slots, num_kv_heads, head_size]` of the
/// cache's activation dtype, a cache that fits the layer, the backend's cache rules.
fn check_update<K: ForwardKernels>(
    k: &K,
    md: &K::Metadata,
    key: &Tensor,
    value: &Tensor,
    cache: &KvCache,
) -> Result<()> {
    let p = k.params();
    let rows = md.common().slot_mapping_cpu().len();
    let dtype = p.check_kv_update(key, value, rows, cache)?;
    p.check_kv_cache(cache, dtype, md.common())?;
    k.check_cache(cache, md)
}

/// Runs `spec` with each of the backend's kernels on the requests of its band.
fn run_pass<K: ForwardKernels>(
    k: &K,
    rec: &mut K::Recording,
    md: &K::Metadata,
    io: &mut ForwardIo<'_>,
    spec: PassSpec,
) -> Result<()> {
    let bands = k.bands(md, io, &spec)?;
    for (i, band) in bands.iter().enumerate() {
        let max_q = bands.get(i + 1).map_or(usize::MAX, |b| b.min_q);
        if band.min_q >= max_q {
            continue;
        }
        let job = AttendJob {
            spec,
            kernel: band.kernel,
            min_q: band.min_q,
            max_q,
        };
        k.attend(rec, md, io, &job)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The driver's rules on a backend whose kernels only log what they are asked to do.

    use std::cell::RefCell;

    use super::*;
    use crate::attention::AttentionParams;
    use crate::capability::KvLayout;
    use crate::device::Device;
    use crate::dtype::{CacheDType, DType};
    use crate::forward::Band;
    use crate::kv_cache::KvCacheSpec;
    use crate::metadata::{BatchDescription, CascadePlan, CommonAttentionMetadata};

    #[derive(Debug)]
    struct LogMetadata {
        common: CommonAttentionMetadata,
        cascade: Option<CascadePlan>,
    }

    impl AttentionMetadata for LogMetadata {
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    impl BatchMetadata for LogMetadata {
        fn common(&self) -> &CommonAttentionMetadata {
            &self.common
        }
        fn cascade(&self) -> Option<CascadePlan> {
            self.cascade
        }
    }

    /// Kernels by query length: `Decode` below 2, `Short` below 16, `Long` from 16.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Kernel {
        Decode,
        Short,
        Long,
    }

    struct LogKernels {
        params: AttentionParams,
        cascade: bool,
        log: RefCell<Vec<String>>,
    }

    impl ForwardKernels for LogKernels {
        type Metadata = LogMetadata;
        type Kernel = Kernel;
        type Recording = Vec<String>;
        const BACKEND: &'static str = "test";

        fn params(&self) -> &AttentionParams {
            &self.params
        }
        fn metadata<'m>(&self, md: &'m dyn AttentionMetadata) -> Result<&'m LogMetadata> {
            md.downcast::<LogMetadata>("LogKernels")
        }
        fn check_cache(&self, _: &KvCache, _: &LogMetadata) -> Result<()> {
            Ok(())
        }
        fn runs_cascade(&self) -> bool {
            self.cascade
        }
        fn bands(
            &self,
            _: &LogMetadata,
            io: &ForwardIo<'_>,
            spec: &PassSpec,
        ) -> Result<Vec<Band<Kernel>>> {
            if io.keys.is_dense() || spec.pass != Pass::Full {
                return Ok(vec![Band {
                    min_q: 0,
                    kernel: Kernel::Short,
                }]);
            }
            Ok(vec![
                Band {
                    min_q: 0,
                    kernel: Kernel::Decode,
                },
                Band {
                    min_q: 2,
                    kernel: Kernel::Short,
                },
                Band {
                    min_q: 16,
                    kernel: Kernel::Long,
                },
            ])
        }
        fn begin(&self, _: &LogMetadata) -> Result<Vec<String>> {
            Ok(vec!["begin".into()])
        }
        fn write_cache(
            &self,
            rec: &mut Vec<String>,
            _: &LogMetadata,
            _: &AttentionLayer,
            _: &Tensor,
            _: &Tensor,
            _: &mut KvCache,
        ) -> Result<()> {
            rec.push("write".into());
            Ok(())
        }
        fn attend(
            &self,
            rec: &mut Vec<String>,
            _: &LogMetadata,
            io: &mut ForwardIo<'_>,
            job: &AttendJob<Kernel>,
        ) -> Result<()> {
            rec.push(format!(
                "{:?} {:?} causal={} sinks={} {:?} q[{}, {}) dense={}",
                job.kernel,
                job.spec.pass,
                job.spec.causal,
                job.spec.sinks,
                job.spec.target,
                job.min_q,
                if job.max_q == usize::MAX {
                    "max".to_string()
                } else {
                    job.max_q.to_string()
                },
                io.keys.is_dense()
            ));
            Ok(())
        }
        fn merge(
            &self,
            rec: &mut Vec<String>,
            _: &LogMetadata,
            _: &mut ForwardIo<'_>,
        ) -> Result<()> {
            rec.push("merge".into());
            Ok(())
        }
        fn finish(&self, rec: Vec<String>, io: Option<&mut ForwardIo<'_>>) -> Result<()> {
            let mut rec = rec;
            rec.push(format!("finish io={}", io.is_some()));
            *self.log.borrow_mut() = rec;
            Ok(())
        }
    }

    const BS: usize = 16;

    /// Two requests: a decode over 40 keys and a 20-token prefill over 52.
    fn batch(common_prefix_len: usize) -> (LogMetadata, usize) {
        let desc = BatchDescription {
            query_start_loc: vec![0, 1, 21],
            seq_lens: vec![40, 52],
            block_table: vec![1, 2, 3, 0, 1, 2, 4, 5],
            max_blocks_per_req: 4,
            // The decode's key 39 (block 3), the prefill's keys 32..52 (blocks 4, 5).
            slot_mapping: std::iter::once(3 * 16 + 7)
                .chain((32..52).map(|p| [1, 2, 4, 5][p / 16] * 16 + (p % 16) as i64))
                .collect(),
            causal: true,
            block_size: BS,
            is_prefilling: None,
        };
        let common = CommonAttentionMetadata::new(&Device::cpu(), desc).unwrap();
        let cascade = CascadePlan::for_batch(&common, common_prefix_len).unwrap();
        (LogMetadata { common, cascade }, 21)
    }

    fn kernels(params: AttentionParams, cascade: bool) -> LogKernels {
        LogKernels {
            params,
            cascade,
            log: RefCell::new(Vec::new()),
        }
    }

    fn cache(num_kv_heads: usize, head_size: usize) -> KvCache {
        let spec = KvCacheSpec {
            block_size: BS,
            num_kv_heads,
            head_size,
            dtype: DType::F32,
            cache_dtype: CacheDType::Auto,
        };
        KvCache::with_layout(&Device::cpu(), spec, 8, KvLayout::Nhd).unwrap()
    }

    fn params() -> AttentionParams {
        AttentionParams::new(4, 32, 2)
    }

    /// Runs the driver with no new keys; the log, or the error's text.
    fn run(k: &LogKernels, md: &LogMetadata, n: usize, kv: Option<(&Tensor, &Tensor)>) -> String {
        let p = k.params();
        let mut cache = cache(p.num_kv_heads, p.head_size);
        let q = Tensor::zeros(&Device::cpu(), &[n, 4, 32], DType::F32).unwrap();
        let mut out = Tensor::zeros(&Device::cpu(), &[n, 4, 32], DType::F32).unwrap();
        let layer = AttentionLayer::new("test");
        let r = forward(
            k,
            &layer,
            &q,
            kv.map(|x| x.0),
            kv.map(|x| x.1),
            &mut cache,
            md,
            &mut out,
            None,
        );
        match r {
            Ok(()) => k.log.borrow().join("\n"),
            Err(e) => format!("error: {e}"),
        }
    }

    #[test]
    fn a_full_pass_hands_each_kernel_its_band_of_query_lengths() {
        let (md, n) = batch(0);
        let k = kernels(params(), true);
        assert_eq!(
            run(&k, &md, n, None),
            "begin\n\
             Decode Full causal=true sinks=false Output q[0, 2) dense=false\n\
             Short Full causal=true sinks=false Output q[2, 16) dense=false\n\
             Long Full causal=true sinks=false Output q[16, max) dense=false\n\
             finish io=true"
        );
    }

    #[test]
    fn cascade_runs_prefix_suffix_and_merge_or_one_full_pass() {
        let (md, n) = batch(32);
        let mut p = params();
        p.sinks = Some(vec![0.5; 4]);
        assert_eq!(
            run(&kernels(p.clone(), true), &md, n, None),
            "begin\n\
             Short Prefix(32) causal=false sinks=true Prefix q[0, max) dense=false\n\
             Short Suffix(32) causal=true sinks=false Suffix q[0, max) dense=false\n\
             merge\n\
             finish io=true"
        );
        // A backend without the cascade passes runs the batch as one full pass.
        let log = run(&kernels(p, false), &md, n, None);
        assert!(
            log.contains("Decode Full causal=true sinks=true Output"),
            "{log}"
        );
        assert!(!log.contains("merge"), "{log}");
    }

    #[test]
    fn encoder_attention_reads_dense_keys_without_a_mask() {
        let (md, n) = batch(0);
        let mut p = params();
        p.attn_type = AttentionType::EncoderOnly;
        let k = kernels(p, true);
        let kv = Tensor::zeros(&Device::cpu(), &[n, 2, 32], DType::F32).unwrap();
        assert_eq!(
            run(&k, &md, n, Some((&kv, &kv))),
            "begin\n\
             Short Full causal=false sinks=false Output q[0, max) dense=true\n\
             finish io=true"
        );
        assert_eq!(
            run(&k, &md, n, None),
            "error: invalid configuration: encoder attention needs key and value tensors"
        );
    }

    #[test]
    fn the_rules_name_what_is_refused() {
        let (md, n) = batch(0);
        let mut p = params();
        p.attn_type = AttentionType::EncoderDecoder;
        let e = run(&kernels(p, true), &md, n, None);
        assert!(
            e.contains("the test backend does not implement encoder_decoder attention"),
            "{e}"
        );

        let (md, n) = batch(32);
        let mut p = params();
        p.sliding_window = Some(8);
        let e = run(&kernels(p, true), &md, n, None);
        assert!(
            e.contains("cannot be combined with ALiBi, a sliding window"),
            "{e}"
        );

        let (md, n) = batch(0);
        let k = kernels(params(), true);
        let kv = Tensor::zeros(&Device::cpu(), &[n, 2, 32], DType::F32).unwrap();
        let q = Tensor::zeros(&Device::cpu(), &[n, 4, 32], DType::F32).unwrap();
        let mut out = Tensor::zeros(&Device::cpu(), &[n, 4, 32], DType::F32).unwrap();
        let mut cache = cache(2, 32);
        let e = forward(
            &k,
            &AttentionLayer::new("test"),
            &q,
            Some(&kv),
            None,
            &mut cache,
            &md,
            &mut out,
            None,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("key and value must be given together"),
            "{e}"
        );

        // A query of the wrong length is refused before anything is recorded.
        let short = Tensor::zeros(&Device::cpu(), &[n - 1, 4, 32], DType::F32).unwrap();
        let e = forward(
            &k,
            &AttentionLayer::new("test"),
            &short,
            None,
            None,
            &mut cache,
            &md,
            &mut out,
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("query"), "{e}");
        assert!(k.log.borrow().is_empty());
    }

    #[test]
    fn new_keys_are_written_before_the_passes_read_the_cache() {
        let (md, n) = batch(0);
        let k = kernels(params(), true);
        let kv = Tensor::zeros(&Device::cpu(), &[n, 2, 32], DType::F32).unwrap();
        let log = run(&k, &md, n, Some((&kv, &kv)));
        assert!(log.starts_with("begin\nwrite\nDecode Full"), "{log}");
    }
}
