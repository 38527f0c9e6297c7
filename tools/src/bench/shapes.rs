//! The benchmark shape table of `perf-anchors.md` §10, as data.
//!
//! Every backend runs the same cases, so their numbers line up row by row (and with the
//! PyTorch reference, which reads the same table from `benches/shapes.json`). A case id names
//! its group first (`P2.b1s4k.p16` is group P2), and `--shapes` takes group ids, case ids or
//! `all`:
//!
//! | group | what |
//! |---|---|
//! | P1 | FA sweep: hidden 2048, D ∈ {64,128,256}, (B,S) from (32,512) to (1,16k), causal and not, MHA |
//! | P2 | Llama-3-8B prefill: 32/8 heads, D 128, causal, 1×1k…1×32k and 8×4k, pages 16 and 64 |
//! | P3 | Llama-3-70B-style: 64/8 heads, 1×8k |
//! | P4 | chunked prefill: Sq ∈ {512, 2048} after an 8k prefix, causal bottom-right |
//! | P5 | ragged: 16 sequences, lengths U[512, 2048] and Zipf-skewed |
//! | D1 | decode 32/8, D 128, page 16, B ∈ {1,8,16,64,256} × S ∈ {1k,4k,16k,32k}; bf16 and fp8 KV; Sq 2 and 4 at B=64 S=4k |
//! | D2 | MHA 32/32, B=16, S ∈ {128, 2000, 4000}, page 8 |
//! | D3 | vLLM's default: B=8, S=4096, 64/8 heads |
//! | D4 | B=1, S ∈ {32k, 128k} (needs split-KV) |
//! | D5 | ragged decode: B=64, lengths U[512, 16k] and Zipf-skewed |
//! | M | MLA decode: Hq ∈ {128, 16}, latent 576/512, page 64, B ∈ {16,64,128}, S 1k…32k, Sq ∈ {1,2} |
//! | K | `reshape_and_cache`: T ∈ {1,…,65536}, Hkv ∈ {8,128}, D 128, block 16, NHD and HND |
//! | G | `merge_attn_states`: T ∈ {1,256,1024,65536}, H ∈ {16,32}, D ∈ {128,512} |
//! | C | the CPU set: P2 and D1 at B=1, S ∈ {512, 2048, 4096}, f32 and f16-KV |
//! | DCP | decode context parallelism: D1's layer at B=1, S ∈ {128k, 1M} and B=8, S=128k, the cache over 1, 2 and 4 ranks |
//!
//! `all` is every group of §10 (the GPU table): not C, which is small enough for a 2-core
//! machine, and not DCP, whose rows with several ranks want as many GPUs
//! (`super::dcp`).
//!
//! Zipf-skewed lengths are deterministic: request `i` (from 0) gets `max(min, ⌊max_len/(i+1)⌋)`
//! tokens, one long sequence and a tail of short ones. Uniform lengths are drawn from a
//! seeded [`Rng`], so every machine benchmarks the same batch.

use serde::Serialize;

use polyattn::backend::KvLayout;
use polyattn::dtype::{CacheDType, DType};
use polyattn::error::Result;

use super::config_error;
use polyattn::testing::Rng;

use super::formulas::{self, Request, Traffic};

/// What a case times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// `AttentionImpl::forward` on prefill batches (compute-bound).
    Prefill,
    /// `AttentionImpl::forward` on decode batches (memory-bound).
    Decode,
    /// `AttentionImpl::do_kv_cache_update` (`reshape_and_cache`).
    KvWrite,
    /// `ops::merge_attn_states`.
    Merge,
    /// `MlaAttentionImpl::forward_mqa` (MLA decode on the latent cache).
    Mla,
}

impl Family {
    /// Lower-case name used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Prefill => "prefill",
            Family::Decode => "decode",
            Family::KvWrite => "kv_write",
            Family::Merge => "merge",
            Family::Mla => "mla",
        }
    }

    /// True for the families timed through an attention impl's `forward`.
    pub fn is_attention(self) -> bool {
        matches!(self, Family::Prefill | Family::Decode | Family::Mla)
    }
}

/// One benchmark case: a shape, the dtypes it runs in by default, and why it is in the table.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// Unique id, group first (`P2.b1s4k.p16`).
    pub id: String,
    /// Group id (`P2`).
    pub group: &'static str,
    /// What is timed.
    pub family: Family,
    /// Attention families: `(Sq, Sk)` per request. Empty for K and G.
    pub requests: Vec<Request>,
    /// Query heads (merge: heads of the merged states).
    pub num_heads: usize,
    /// KV heads (MLA: 1).
    pub num_kv_heads: usize,
    /// Query/key head size `Dqk` (MLA: 576).
    pub head_size: usize,
    /// Value head size `Dv` (MLA: 512).
    pub head_size_v: usize,
    /// Causal mask (bottom-right aligned).
    pub causal: bool,
    /// Tokens per cache block.
    pub block_size: usize,
    /// K and G: tokens `T`.
    pub tokens: usize,
    /// K: the cache layout written.
    pub layout: Option<KvLayout>,
    /// Default `(activation, KV-cache)` dtypes; `--dtype` / `--kv-dtype` replace them.
    pub dtypes: Vec<(DType, CacheDType)>,
    /// Decode rows of the DCP group: ranks the cache is sharded over (1: one device, timed as
    /// the group times its rows); 0 everywhere else.
    pub ranks: usize,
}

impl Case {
    /// Batch size (requests; K and G: 1).
    pub fn batch(&self) -> usize {
        self.requests.len().max(1)
    }

    /// Total new tokens (K, G: `T`).
    pub fn num_tokens(&self) -> usize {
        if self.family.is_attention() {
            self.requests.iter().map(|r| r.sq).sum()
        } else {
            self.tokens
        }
    }

    /// True when every request has the same `(Sq, Sk)` (a contiguous SDPA call can run it).
    pub fn is_uniform(&self) -> bool {
        self.requests.windows(2).all(|w| w[0] == w[1])
    }

    /// FLOPs and per-dtype element counts, per §8.
    pub fn traffic(&self) -> Traffic {
        let (hq, hkv, dqk, dv) = (
            self.num_heads,
            self.num_kv_heads,
            self.head_size,
            self.head_size_v,
        );
        match self.family {
            Family::Prefill | Family::Decode => {
                let flops = self
                    .requests
                    .iter()
                    .map(|&r| match self.family {
                        Family::Prefill => formulas::prefill_flops(hq, dqk, dv, r, self.causal),
                        _ => formulas::decode_flops(hq, dqk, dv, r),
                    })
                    .sum();
                let cache = formulas::attention_bytes(&self.requests, hq, hkv, dqk, dv, 0, 1, 0);
                let act = formulas::attention_bytes(&self.requests, hq, hkv, dqk, dv, 1, 0, 1);
                Traffic {
                    flops,
                    act_elems: act,
                    cache_elems: cache,
                    fixed_bytes: 0.0,
                }
            }
            Family::Mla => Traffic {
                flops: self
                    .requests
                    .iter()
                    .map(|&r| formulas::decode_flops(hq, dqk, dv, r))
                    .sum(),
                act_elems: formulas::mla_bytes(&self.requests, hq, dqk, dv, 1, 0),
                cache_elems: formulas::mla_bytes(&self.requests, hq, dqk, dv, 0, 1),
                fixed_bytes: 0.0,
            },
            Family::KvWrite => {
                let t = self.tokens;
                Traffic {
                    flops: 0.0,
                    act_elems: formulas::kv_write_bytes(t, hkv, dqk, dv, 1, 0) - 8.0 * t as f64,
                    cache_elems: formulas::kv_write_bytes(t, hkv, dqk, dv, 0, 1) - 8.0 * t as f64,
                    fixed_bytes: 8.0 * t as f64,
                }
            }
            Family::Merge => {
                let t = self.tokens;
                let fixed = formulas::merge_bytes(t, hq, dv, 0, 0);
                Traffic {
                    flops: 0.0,
                    act_elems: formulas::merge_bytes(t, hq, dv, 1, 1) - fixed,
                    cache_elems: 0.0,
                    fixed_bytes: fixed,
                }
            }
        }
    }

    /// A one-line human description of the shape.
    pub fn describe(&self) -> String {
        let reqs = describe_requests(&self.requests);
        match self.family {
            Family::Prefill | Family::Decode => format!(
                "{reqs} Hq={} Hkv={} D={} {} page {}{}",
                self.num_heads,
                self.num_kv_heads,
                self.head_size,
                if self.causal { "causal" } else { "non-causal" },
                self.block_size,
                match self.ranks {
                    0 => String::new(),
                    1 => ", one rank".to_string(),
                    r => format!(", cache over {r} ranks"),
                }
            ),
            Family::Mla => format!(
                "{reqs} Hq={} latent {}/{} page {}",
                self.num_heads, self.head_size, self.head_size_v, self.block_size
            ),
            Family::KvWrite => format!(
                "T={} Hkv={} D={} block {} {}",
                self.tokens,
                self.num_kv_heads,
                self.head_size,
                self.block_size,
                match self.layout {
                    Some(KvLayout::Hnd) => "HND",
                    _ => "NHD",
                }
            ),
            Family::Merge => format!(
                "T={} H={} D={}",
                self.tokens, self.num_heads, self.head_size_v
            ),
        }
    }
}

/// `B=1 Sq=4096 Sk=4096`, `B=64 Sq=1 Sk=512..16384 (ragged, Σ Sk=…)`.
fn describe_requests(reqs: &[Request]) -> String {
    let Some(first) = reqs.first() else {
        return String::new();
    };
    if reqs.iter().all(|r| r == first) {
        format!("B={} Sq={} Sk={}", reqs.len(), first.sq, first.sk)
    } else {
        let (qmin, qmax) = min_max(reqs.iter().map(|r| r.sq));
        let (kmin, kmax) = min_max(reqs.iter().map(|r| r.sk));
        let sum: usize = reqs.iter().map(|r| r.sk).sum();
        let q = if qmin == qmax {
            format!("{qmin}")
        } else {
            format!("{qmin}..{qmax}")
        };
        format!(
            "B={} Sq={q} Sk={kmin}..{kmax} (ragged, ΣSk={sum})",
            reqs.len()
        )
    }
}

fn min_max(it: impl Iterator<Item = usize>) -> (usize, usize) {
    it.fold((usize::MAX, 0), |(a, b), x| (a.min(x), b.max(x)))
}

/// `512`, `1k`, `16k`, `2000`, `1m`.
fn tok(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}m", n >> 20)
    } else if n >= 1024 && n.is_multiple_of(1024) {
        format!("{}k", n / 1024)
    } else {
        n.to_string()
    }
}

const BF16: (DType, CacheDType) = (DType::Bf16, CacheDType::Auto);

/// Every group id, in table order.
pub const GROUPS: [&str; 15] = [
    "P1", "P2", "P3", "P4", "P5", "D1", "D2", "D3", "D4", "D5", "M", "K", "G", "C", "DCP",
];

#[allow(clippy::too_many_arguments)]
fn attn(
    id: String,
    group: &'static str,
    family: Family,
    requests: Vec<Request>,
    hq: usize,
    hkv: usize,
    d: usize,
    causal: bool,
    block_size: usize,
    dtypes: Vec<(DType, CacheDType)>,
) -> Case {
    Case {
        id,
        group,
        family,
        requests,
        num_heads: hq,
        num_kv_heads: hkv,
        head_size: d,
        head_size_v: d,
        causal,
        block_size,
        tokens: 0,
        layout: None,
        dtypes,
        ranks: 0,
    }
}

fn uniform(b: usize, sq: usize, sk: usize) -> Vec<Request> {
    vec![Request { sq, sk }; b]
}

/// Zipf-skewed lengths: request `i` gets `max(min, ⌊max_len/(i+1)⌋)`.
pub fn zipf_lengths(n: usize, max_len: usize, min: usize) -> Vec<usize> {
    (0..n).map(|i| (max_len / (i + 1)).max(min)).collect()
}

/// Seeded uniform lengths in `lo..=hi`.
pub fn uniform_lengths(n: usize, lo: usize, hi: usize, seed: u64) -> Vec<usize> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| lo + rng.below(hi - lo + 1)).collect()
}

/// The whole table, every group, in order.
pub fn table() -> Vec<Case> {
    let mut v = Vec::new();
    // P1: FlashAttention sweep, hidden 2048 (H = 2048 / D), B·S = 16k, MHA.
    for d in [64, 128, 256] {
        for causal in [false, true] {
            for (b, s) in [
                (32, 512),
                (16, 1024),
                (8, 2048),
                (4, 4096),
                (2, 8192),
                (1, 16384),
            ] {
                let h = 2048 / d;
                let id = format!(
                    "P1.d{d}.b{b}s{}.{}",
                    tok(s),
                    if causal { "c" } else { "nc" }
                );
                v.push(attn(
                    id,
                    "P1",
                    Family::Prefill,
                    uniform(b, s, s),
                    h,
                    h,
                    d,
                    causal,
                    16,
                    vec![BF16],
                ));
            }
        }
    }
    // P2: Llama-3-8B prefill, paged 16 and 64.
    for page in [16, 64] {
        for (b, s) in [(1, 1024), (1, 4096), (1, 16384), (1, 32768), (8, 4096)] {
            let id = format!("P2.b{b}s{}.p{page}", tok(s));
            v.push(attn(
                id,
                "P2",
                Family::Prefill,
                uniform(b, s, s),
                32,
                8,
                128,
                true,
                page,
                vec![BF16],
            ));
        }
    }
    // P3: larger group (g = 8).
    v.push(attn(
        "P3.b1s8k.p16".into(),
        "P3",
        Family::Prefill,
        uniform(1, 8192, 8192),
        64,
        8,
        128,
        true,
        16,
        vec![BF16],
    ));
    // P4: chunked prefill after an 8k prefix.
    for sq in [512, 2048] {
        let id = format!("P4.q{}.ctx8k", tok(sq));
        v.push(attn(
            id,
            "P4",
            Family::Prefill,
            uniform(1, sq, sq + 8192),
            32,
            8,
            128,
            true,
            16,
            vec![BF16],
        ));
    }
    // P5: ragged prefill, 16 sequences.
    let p5u = uniform_lengths(16, 512, 2048, 5);
    let p5z = zipf_lengths(16, 8192, 512);
    for (name, lens) in [("u512-2k", p5u), ("zipf", p5z)] {
        let reqs = lens.iter().map(|&s| Request { sq: s, sk: s }).collect();
        v.push(attn(
            format!("P5.{name}"),
            "P5",
            Family::Prefill,
            reqs,
            32,
            8,
            128,
            true,
            16,
            vec![BF16],
        ));
    }
    // D1: the FlashInfer grid, bf16 and fp8 KV; speculative Sq 2 and 4 at B=64 S=4k.
    let d1_dtypes = vec![BF16, (DType::Bf16, CacheDType::Fp8E4m3)];
    for b in [1, 8, 16, 64, 256] {
        for s in [1024, 4096, 16384, 32768] {
            let id = format!("D1.b{b}s{}", tok(s));
            v.push(attn(
                id,
                "D1",
                Family::Decode,
                uniform(b, 1, s),
                32,
                8,
                128,
                true,
                16,
                d1_dtypes.clone(),
            ));
        }
    }
    for sq in [2, 4] {
        let id = format!("D1.b64s4k.q{sq}");
        v.push(attn(
            id,
            "D1",
            Family::Decode,
            uniform(64, sq, 4096),
            32,
            8,
            128,
            true,
            16,
            d1_dtypes.clone(),
        ));
    }
    // D2: MHA, page 8 (FA issue #1572's setting).
    for s in [128, 2000, 4000] {
        v.push(attn(
            format!("D2.b16s{}", tok(s)),
            "D2",
            Family::Decode,
            uniform(16, 1, s),
            32,
            32,
            128,
            true,
            8,
            vec![BF16],
        ));
    }
    // D3: vLLM's benchmark_paged_attention.py defaults.
    v.push(attn(
        "D3.b8s4k".into(),
        "D3",
        Family::Decode,
        uniform(8, 1, 4096),
        64,
        8,
        128,
        true,
        16,
        vec![BF16],
    ));
    // D4: one long sequence.
    for s in [32768, 131072] {
        v.push(attn(
            format!("D4.b1s{}", tok(s)),
            "D4",
            Family::Decode,
            uniform(1, 1, s),
            32,
            8,
            128,
            true,
            16,
            vec![BF16],
        ));
    }
    // D5: ragged decode, 64 requests.
    let d5u = uniform_lengths(64, 512, 16384, 55);
    let d5z = zipf_lengths(64, 16384, 512);
    for (name, lens) in [("u512-16k", d5u), ("zipf", d5z)] {
        let reqs = lens.iter().map(|&s| Request { sq: 1, sk: s }).collect();
        v.push(attn(
            format!("D5.{name}"),
            "D5",
            Family::Decode,
            reqs,
            32,
            8,
            128,
            true,
            16,
            vec![BF16],
        ));
    }
    // M: MLA decode (absorbed: one 576-wide latent per token, values its first 512).
    for hq in [128, 16] {
        for b in [16, 64, 128] {
            for s in [1024, 4096, 8192, 16384, 32768] {
                for sq in [1, 2] {
                    let id = format!("M.h{hq}.b{b}s{}.q{sq}", tok(s));
                    let mut c = attn(
                        id,
                        "M",
                        Family::Mla,
                        uniform(b, sq, s),
                        hq,
                        1,
                        576,
                        true,
                        64,
                        vec![BF16],
                    );
                    c.head_size_v = 512;
                    v.push(c);
                }
            }
        }
    }
    // K: reshape_and_cache.
    for t in [1, 16, 256, 4096, 65536] {
        for hkv in [8, 128] {
            for layout in [KvLayout::Nhd, KvLayout::Hnd] {
                let l = if layout == KvLayout::Nhd {
                    "nhd"
                } else {
                    "hnd"
                };
                let mut c = attn(
                    format!("K.t{t}.h{hkv}.{l}"),
                    "K",
                    Family::KvWrite,
                    Vec::new(),
                    hkv,
                    hkv,
                    128,
                    false,
                    16,
                    vec![BF16],
                );
                c.tokens = t;
                c.layout = Some(layout);
                v.push(c);
            }
        }
    }
    // G: merge of two partial states.
    for t in [1, 256, 1024, 65536] {
        for h in [16, 32] {
            for d in [128, 512] {
                let mut c = attn(
                    format!("G.t{t}.h{h}.d{d}"),
                    "G",
                    Family::Merge,
                    Vec::new(),
                    h,
                    h,
                    d,
                    false,
                    16,
                    vec![BF16],
                );
                c.tokens = t;
                v.push(c);
            }
        }
    }
    // C: the CPU set, P2 and D1 at B=1, f32 with an f32 and an f16 cache.
    let c_dtypes = vec![
        (DType::F32, CacheDType::Auto),
        (DType::F32, CacheDType::F16),
    ];
    for s in [512, 2048, 4096] {
        v.push(attn(
            format!("C.P2.s{}", tok(s)),
            "C",
            Family::Prefill,
            uniform(1, s, s),
            32,
            8,
            128,
            true,
            16,
            c_dtypes.clone(),
        ));
    }
    for s in [512, 2048, 4096] {
        v.push(attn(
            format!("C.D1.s{}", tok(s)),
            "C",
            Family::Decode,
            uniform(1, 1, s),
            32,
            8,
            128,
            true,
            16,
            c_dtypes.clone(),
        ));
    }
    // DCP: one layer's decode with its cache sharded over ranks (block round-robin).
    for (b, s) in [(1, 131072), (1, 1 << 20), (8, 131072)] {
        for ranks in [1, 2, 4] {
            let mut c = attn(
                format!("DCP.b{b}s{}.r{ranks}", tok(s)),
                "DCP",
                Family::Decode,
                uniform(b, 1, s),
                32,
                8,
                128,
                true,
                16,
                vec![BF16],
            );
            c.ranks = ranks;
            v.push(c);
        }
    }
    v
}

/// The cases named by a `--shapes` list: comma-separated group ids (`P2`), case ids
/// (`D1.b64s4k`) or `all` (every group but C and DCP), case-insensitive, in table order, each once.
/// An unknown name is an error that lists the valid ones.
pub fn select(spec: &str) -> Result<Vec<Case>> {
    let all = table();
    let mut keep = vec![false; all.len()];
    let names: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if names.is_empty() {
        return Err(config_error(format!(
            "--shapes is empty; give group ids ({}), case ids (see --list) or all",
            GROUPS.join(", ")
        )));
    }
    for name in names {
        let mut hit = false;
        for (i, c) in all.iter().enumerate() {
            let m = if name.eq_ignore_ascii_case("all") {
                c.group != "C" && c.group != "DCP"
            } else {
                c.group.eq_ignore_ascii_case(name) || c.id.eq_ignore_ascii_case(name)
            };
            if m {
                keep[i] = true;
                hit = true;
            }
        }
        if !hit {
            return Err(config_error(format!(
                "unknown shape '{name}'; valid: all, the groups {}, or a case id such as \
                 P2.b1s4k.p16 or C.D1.s2k (`--list` prints every case id)",
                GROUPS.join(", ")
            )));
        }
    }
    Ok(all
        .into_iter()
        .zip(keep)
        .filter(|(_, k)| *k)
        .map(|(c, _)| c)
        .collect())
}

/// A case as `benches/shapes.json` and `--dump-shapes` write it (what the Python reference
/// reads): the shape, the default dtypes, and the FLOP and element counts of §8.
#[derive(Clone, Debug, Serialize)]
pub struct CaseRecord {
    /// Case id.
    pub id: String,
    /// Group id.
    pub group: String,
    /// Family name.
    pub family: String,
    /// Human description.
    pub shape: String,
    /// The requests as runs `[count, Sq, Sk]` (a uniform batch is one run).
    pub requests: Vec<[usize; 3]>,
    /// Query heads.
    pub num_heads: usize,
    /// KV heads.
    pub num_kv_heads: usize,
    /// `Dqk`.
    pub head_size: usize,
    /// `Dv`.
    pub head_size_v: usize,
    /// Causal (bottom-right).
    pub causal: bool,
    /// Tokens per block.
    pub block_size: usize,
    /// K, G: tokens.
    pub tokens: usize,
    /// K: `nhd` / `hnd`.
    pub layout: Option<String>,
    /// Default `[dtype, kv_dtype]` pairs.
    pub dtypes: Vec<[String; 2]>,
    /// DCP: ranks the cache is sharded over (0 outside the group).
    pub ranks: usize,
    /// FLOPs and element counts.
    pub traffic: Traffic,
}

/// Run-length encoding of a request list: `[count, Sq, Sk]` per run of equal requests.
pub fn runs(reqs: &[Request]) -> Vec<[usize; 3]> {
    let mut out: Vec<[usize; 3]> = Vec::new();
    for r in reqs {
        match out.last_mut() {
            Some(last) if last[1] == r.sq && last[2] == r.sk => last[0] += 1,
            _ => out.push([1, r.sq, r.sk]),
        }
    }
    out
}

/// The whole table as `benches/shapes.json` holds it.
pub fn table_json() -> Result<String> {
    let recs: Vec<CaseRecord> = table().iter().map(CaseRecord::from).collect();
    serde_json::to_string_pretty(&recs)
        .map(|s| s + "\n")
        .map_err(|e| config_error(format!("JSON: {e}")))
}

impl From<&Case> for CaseRecord {
    fn from(c: &Case) -> Self {
        CaseRecord {
            id: c.id.clone(),
            group: c.group.to_string(),
            family: c.family.as_str().to_string(),
            shape: c.describe(),
            requests: runs(&c.requests),
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_size: c.head_size,
            head_size_v: c.head_size_v,
            causal: c.causal,
            block_size: c.block_size,
            tokens: c.tokens,
            layout: c.layout.map(|l| match l {
                KvLayout::Nhd => "nhd".to_string(),
                KvLayout::Hnd => "hnd".to_string(),
            }),
            dtypes: c
                .dtypes
                .iter()
                .map(|(a, k)| [a.as_str().to_string(), k.as_str().to_string()])
                .collect(),
            ranks: c.ranks,
            traffic: c.traffic(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_groups_known() {
        let t = table();
        let mut ids: Vec<&str> = t.iter().map(|c| c.id.as_str()).collect();
        ids.sort();
        let n = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), n, "duplicate case ids");
        for c in &t {
            assert!(GROUPS.contains(&c.group), "{}", c.id);
            assert!(c.id.starts_with(&format!("{}.", c.group)), "{}", c.id);
            assert!(
                c.requests.iter().all(|r| r.sq >= 1 && r.sq <= r.sk),
                "{}",
                c.id
            );
        }
    }

    #[test]
    fn the_cpu_set_is_p2_and_d1_at_b1() {
        let c = select("C").unwrap();
        assert_eq!(c.len(), 6);
        assert!(c
            .iter()
            .all(|c| c.batch() == 1 && c.num_heads == 32 && c.num_kv_heads == 8));
        assert_eq!(c[0].dtypes.len(), 2);
        let all = select("all").unwrap();
        assert!(all.iter().all(|c| c.group != "C" && c.group != "DCP"));
        assert_eq!(select("c.p2.s4k,C").unwrap().len(), 6);
    }

    #[test]
    fn unknown_shape_lists_valid_ids() {
        let e = select("P9").unwrap_err().to_string();
        assert!(
            e.contains("P9") && e.contains("D1") && e.contains("--list"),
            "{e}"
        );
    }

    #[test]
    fn ragged_batches_are_deterministic() {
        assert_eq!(zipf_lengths(4, 8192, 512)[..4], [8192, 4096, 2730, 2048]);
        let u = uniform_lengths(16, 512, 2048, 5);
        assert_eq!(u, uniform_lengths(16, 512, 2048, 5));
        assert!(u.iter().all(|&l| (512..=2048).contains(&l)));
        let p5 = select("P5.zipf").unwrap();
        assert!(!p5[0].is_uniform());
    }

    #[test]
    fn the_committed_table_is_current() {
        // benches/reference_sdpa.py reads this file; it must match the table.
        let committed = include_str!("../../../benches/shapes.json");
        assert!(
            committed == table_json().unwrap(),
            "benches/shapes.json is stale: regenerate it with \
             `cargo run --release -- bench --shapes all,C,DCP --dump-shapes benches/shapes.json`"
        );
        assert_eq!(runs(&[Request { sq: 1, sk: 2 }; 3]), vec![[3, 1, 2]]);
    }

    #[test]
    fn traffic_follows_the_dtypes() {
        let c = &select("C.D1.s4k").unwrap()[0];
        let t = c.traffic();
        // f32 everywhere vs an f16 cache.
        assert_eq!(
            t.bytes(4, 4),
            4096.0 * 8.0 * 256.0 * 4.0 + 2.0 * 32.0 * 128.0 * 4.0
        );
        assert_eq!(
            t.bytes(4, 2),
            4096.0 * 8.0 * 256.0 * 2.0 + 2.0 * 32.0 * 128.0 * 4.0
        );
        let k = &select("K.t4096.h8.nhd").unwrap()[0];
        assert_eq!(
            k.traffic().bytes(2, 2),
            formulas::kv_write_bytes(4096, 8, 128, 128, 2, 2)
        );
        let g = &select("G.t1024.h32.d128").unwrap()[0];
        assert_eq!(
            g.traffic().bytes(2, 2),
            formulas::merge_bytes(1024, 32, 128, 2, 2)
        );
    }
}
