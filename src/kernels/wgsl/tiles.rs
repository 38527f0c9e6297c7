//! Tile sizing policy of the attention kernels: the tile candidates and the first that fits
//! an adapter's workgroup memory ([`choose_tile`]), each form's workgroup-memory formula, the
//! per-thread register blocking ([`AttentionBlocking`]) and the cooperative-matrix form's
//! tile and subgroup-split rules. Plain arithmetic on shapes: the adapter's limits come in
//! as numbers.

/// Threads per workgroup of the attention kernel.
pub const ATTENTION_WORKGROUP: u32 = 128;

/// Which of the two work-item kinds a tile shape serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TileKind {
    /// Short queries (decode, speculative decode): few rows, split-KV.
    Decode,
    /// Long queries: many rows per tile, no split.
    Prefill,
}

/// Tile shapes tried in order (rows BM, keys BN); the first that fits the adapter's
/// workgroup memory is used.
fn tile_candidates(kind: TileKind) -> &'static [(u32, u32)] {
    match kind {
        TileKind::Prefill => &[
            (64, 32),
            (32, 32),
            (32, 16),
            (16, 16),
            (16, 8),
            (8, 8),
            (4, 8),
        ],
        TileKind::Decode => &[(16, 32), (16, 16), (8, 16), (8, 8), (4, 8)],
    }
}

/// Bytes of workgroup memory the attention kernel needs for a tile shape.
pub fn attention_shared_bytes(head_size: u32, block_m: u32, block_n: u32) -> u32 {
    let d4 = head_size / 4;
    block_m * d4 * 16 // queries
        + block_n * (d4 + 1) * 16 // keys, then values (rows padded by one vec4)
        + block_m * (block_n + 1) * 4 // scores / probabilities
        + block_m * 5 * 4 // m, l, alpha, position, head
        + block_n * 8 // key addresses (8 bytes: a chunked cache's (chunk, element) pairs)
}

/// The first tile shape of `kind` whose workgroup memory fits `max_shared_bytes`.
pub fn choose_tile(head_size: u32, max_shared_bytes: u32, kind: TileKind) -> Option<(u32, u32)> {
    tile_candidates(kind)
        .iter()
        .copied()
        .find(|&(m, n)| attention_shared_bytes(head_size, m, n) <= max_shared_bytes)
}

/// How `paged_attention.wgsl` spreads a tile over its [`ATTENTION_WORKGROUP`] threads: in
/// phase A (scores) each thread computes `keys_per_thread` keys of `ceil(BM /
/// score_row_groups)` rows, in phase C (P·V) `cols_per_thread` vec4 columns of `ceil(BM /
/// out_row_groups)` rows. Why blocks: every shared-memory load then feeds several dot
/// products (a 4 × 4 block of a 64 × 32 tile loads 8 vec4s for 16 dot products, where one
/// key per thread loaded 17).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionBlocking {
    /// Keys per thread in phase A (divides BN).
    pub keys_per_thread: u32,
    /// Threads sharing a row group in phase A: BN / keys_per_thread.
    pub key_lanes: u32,
    /// Row groups in phase A: WG / key_lanes.
    pub score_row_groups: u32,
    /// vec4 output columns per thread in phase C (divides D / 4).
    pub cols_per_thread: u32,
    /// Threads sharing a row group in phase C: (D / 4) / cols_per_thread.
    pub col_lanes: u32,
    /// Row groups in phase C: WG / col_lanes.
    pub out_row_groups: u32,
}

impl AttentionBlocking {
    /// The blocking for `d4` vec4 columns and tiles of `block_n` keys.
    pub fn new(d4: u32, block_n: u32) -> Self {
        let wg = ATTENTION_WORKGROUP;
        let divisor = |n: u32| {
            [4u32, 2, 1]
                .into_iter()
                .find(|k| n.is_multiple_of(*k))
                .unwrap_or(1)
        };
        let keys_per_thread = divisor(block_n);
        let key_lanes = block_n / keys_per_thread;
        let cols_per_thread = divisor(d4);
        let col_lanes = d4 / cols_per_thread;
        AttentionBlocking {
            keys_per_thread,
            key_lanes,
            score_row_groups: (wg / key_lanes).max(1),
            cols_per_thread,
            col_lanes,
            out_row_groups: (wg / col_lanes).max(1),
        }
    }

    /// The blocking of the tiled2 form ([`Tiled2`]) for `d4` vec4 columns, tiles of
    /// `block_n` keys and `wg` threads, whose phase-A row groups span at most
    /// `max_key_lanes` lanes (they reduce over them with subgroup shuffles; 1 without
    /// subgroups). Key lanes: the largest power of two that divides `block_n` and `wg`, is
    /// at most `max_key_lanes` and leaves at least 4 keys per thread (a 4-key block loads
    /// each query vec4 once for 4 dot products). `None` when `wg` is not a power of two or
    /// `block_n` is not a positive multiple of 4.
    ///
    /// [`Tiled2`]: super::Tiled2
    pub fn tiled2(d4: u32, block_n: u32, wg: u32, max_key_lanes: u32) -> Option<Self> {
        Self::tiled2_with(d4, block_n, wg, max_key_lanes, TILED2_DEFAULT_BLOCK)
    }

    /// [`AttentionBlocking::tiled2`] with another per-thread block `(keys, cols)`
    /// ([`Tiled2::block`]): at least `keys` keys per thread in phase A where the lanes
    /// allow (4, 8 or 16), and `cols` vec4 output columns per thread in phase C (1, 2, 4 or
    /// 8; the largest of 4, 2, 1 dividing `d4` when `cols` does not, or when `d4 / cols`
    /// column lanes would outnumber the threads). `None` as `tiled2`, or for a `keys` that
    /// is not a power of two from 1 to 16.
    ///
    /// [`Tiled2::block`]: super::Tiled2::block
    pub fn tiled2_with(
        d4: u32,
        block_n: u32,
        wg: u32,
        max_key_lanes: u32,
        (keys, cols): (u32, u32),
    ) -> Option<Self> {
        if !wg.is_power_of_two() || block_n == 0 || !block_n.is_multiple_of(4) || d4 == 0 {
            return None;
        }
        if !keys.is_power_of_two() || keys > 16 {
            return None;
        }
        let cap = max_key_lanes.max(1).min(wg).min((block_n / keys).max(1));
        let key_lanes = (0..=cap.ilog2())
            .rev()
            .map(|e| 1u32 << e)
            .find(|kl| block_n.is_multiple_of(*kl))
            .unwrap_or(1);
        let cols_per_thread = if cols > 0 && d4.is_multiple_of(cols) && d4 / cols <= wg {
            cols
        } else {
            [4u32, 2, 1]
                .into_iter()
                .find(|k| d4.is_multiple_of(*k))
                .unwrap_or(1)
        };
        let col_lanes = d4 / cols_per_thread;
        Some(AttentionBlocking {
            keys_per_thread: block_n / key_lanes,
            key_lanes,
            score_row_groups: wg / key_lanes,
            cols_per_thread,
            col_lanes,
            out_row_groups: (wg / col_lanes).max(1),
        })
    }
}

/// The tiled2 forms' default per-thread block ([`Tiled2::block`]): ≥ 4 keys per thread in
/// phase A, 4 vec4 columns per thread in phase C.
///
/// [`Tiled2::block`]: super::Tiled2::block
pub const TILED2_DEFAULT_BLOCK: (u32, u32) = (4, 4);

/// Bytes of workgroup memory the tiled2 form needs for a tile shape: the tiled form's
/// ([`attention_shared_bytes`]) with score rows padded to a multiple of 4 floats (BN + 4,
/// so phase C loads four probabilities at once), no key addresses, and one more float per
/// row (the new running maxima).
pub fn tiled2_shared_bytes(head_size: u32, block_m: u32, block_n: u32) -> u32 {
    tiled2_bytes_with(head_size, block_m, block_n, 4)
}

/// Bytes of workgroup memory the tiled2h form ([`Tiled2::half`]) needs for a tile shape:
/// the tiled2 form's ([`tiled2_shared_bytes`]) with queries, keys / values and
/// probabilities stored as f16 (half of their bytes); the per-row statistics stay f32.
///
/// [`Tiled2::half`]: super::Tiled2::half
pub fn tiled2h_shared_bytes(head_size: u32, block_m: u32, block_n: u32) -> u32 {
    tiled2_bytes_with(head_size, block_m, block_n, 2)
}

/// The tiled2 forms' workgroup memory with `elem` bytes per query, key, value and
/// probability element.
fn tiled2_bytes_with(head_size: u32, block_m: u32, block_n: u32, elem: u32) -> u32 {
    let d4 = head_size / 4;
    block_m * d4 * 4 * elem // queries
        + block_n * (d4 + 1) * 4 * elem // keys, then values
        + block_m * (block_n + 4) * elem // probabilities
        + block_m * 6 * 4 // m (2 halves), l, alpha, position, head
        + 8 // the unused key-address slot (8 bytes for a chunked cache)
}

/// Query rows per tile of the coop form by default (4 subgroups of 16 rows).
pub const COOP_ROWS: u32 = 64;

/// Keys per chunk of the coop form by default.
pub const COOP_KEYS: u32 = 64;

/// Bytes of workgroup memory the coop form needs: kv_s (the Q tile, then K / V, f16 rows of
/// D + 8), s_s (f32 scores, rows of BN + 4; later the staging tiles), p_s (f16
/// probabilities, rows of BN + 8) and the per-row statistics.
pub fn coop_shared_bytes(head_size: u32, block_m: u32, block_n: u32) -> u32 {
    block_m.max(block_n) * (head_size + 8) * 2
        + block_m * (block_n + 4) * 4
        + block_m * (block_n + 8) * 2
        + block_m * 9 * 4
        + block_m / 16 * 4
}

/// Whether the coop form can give each 16-row tile `split` subgroups at this shape: the
/// split divides the key tiles of a chunk and the output tiles, the softmax lanes of a row
/// (2 · split) take a multiple of 4 keys, and the per-subgroup staging tiles (256 floats
/// each) fit in the score array.
pub fn coop_split_fits(head_size: u32, block_m: u32, block_n: u32, split: u32) -> bool {
    split.is_power_of_two()
        && split <= 8
        && (block_n / 16).is_multiple_of(split)
        && (head_size / 16).is_multiple_of(split)
        && (block_n / (2 * split)).is_multiple_of(4)
        && (block_m / 16) * split * 256 <= block_m * (block_n + 4)
}

/// Subgroups per 16-row tile for the coop form at a shape: `asked` where it fits
/// ([`coop_split_fits`]), else the most that fit (4 at 64 rows × 64 keys, the fastest on the
/// H200: see `WgpuTuning::prefill_coop_split`).
pub fn coop_split(head_size: u32, block_m: u32, block_n: u32, asked: Option<u32>) -> u32 {
    asked
        .into_iter()
        .chain([4, 2])
        .find(|&q| coop_split_fits(head_size, block_m, block_n, q))
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::wgsl::coop_shader_split;
    /// The coop split: what was asked where it fits, else the most that fit; its workgroup
    /// is 32 threads per subgroup.
    #[test]
    fn coop_split_takes_the_most_that_fit() {
        assert_eq!(coop_split(128, 64, 64, None), 4);
        assert_eq!(coop_split(128, 64, 64, Some(1)), 1);
        assert_eq!(coop_split(128, 64, 64, Some(2)), 2);
        // 8 does not divide 4 key tiles: the most that fit.
        assert_eq!(coop_split(128, 64, 64, Some(8)), 4);
        // 32-key chunks: two key tiles, 16 softmax keys per row.
        assert_eq!(coop_split(128, 48, 32, None), 2);
        // 16-key chunks: one key tile, no room for a split.
        assert_eq!(coop_split(128, 64, 16, Some(4)), 1);
        assert_eq!(coop_shader_split(128, 64, 64, 4, true).workgroup(), 512);
    }

    #[test]
    fn tiles_fit_the_limits() {
        assert_eq!(
            choose_tile(128, 32 * 1024, TileKind::Prefill),
            Some((32, 16))
        );
        assert_eq!(
            choose_tile(128, 48 * 1024, TileKind::Prefill),
            Some((32, 32))
        );
        assert_eq!(
            choose_tile(128, 32 * 1024, TileKind::Decode),
            Some((16, 32))
        );
        for d in (4..=512).step_by(4) {
            for kind in [TileKind::Decode, TileKind::Prefill] {
                let (m, n) = choose_tile(d, 32 * 1024, kind).expect("fits lavapipe");
                assert!(attention_shared_bytes(d, m, n) <= 32 * 1024);
            }
        }
    }

    #[test]
    fn blocking_divides_the_tile_and_fits_the_workgroup() {
        let wg = ATTENTION_WORKGROUP;
        // The main GPU tile: 4 x 4 score blocks and 4 x 4 output blocks for D = 128, 64 x 32.
        let b = AttentionBlocking::new(32, 32);
        assert_eq!(
            (b.keys_per_thread, b.key_lanes, b.score_row_groups),
            (4, 8, 16)
        );
        assert_eq!(
            (b.cols_per_thread, b.col_lanes, b.out_row_groups),
            (4, 8, 16)
        );
        // Every tile choose_tile can pick (workgroup memory of lavapipe, most GPUs, NVIDIA).
        let limits = [16 * 1024, 32 * 1024, 48 * 1024];
        for d in (4..=512).step_by(4) {
            let d4 = d / 4;
            let tiles = limits.iter().flat_map(|&limit| {
                [TileKind::Prefill, TileKind::Decode]
                    .into_iter()
                    .filter_map(move |k| choose_tile(d, limit, k))
            });
            for (m, n) in tiles {
                let b = AttentionBlocking::new(d4, n);
                assert_eq!(b.keys_per_thread * b.key_lanes, n, "d{d} {m}x{n}");
                assert_eq!(b.cols_per_thread * b.col_lanes, d4, "d{d} {m}x{n}");
                assert!(b.key_lanes * b.score_row_groups <= wg, "d{d} {m}x{n}");
                assert!(b.col_lanes * b.out_row_groups <= wg, "d{d} {m}x{n}");
                // Per-thread blocks stay register-sized: at most 16 scores and 16 vec4
                // accumulators (what the 64 x 32 tile at D = 128 uses).
                let scores = m.div_ceil(b.score_row_groups) * b.keys_per_thread;
                let accs = m.div_ceil(b.out_row_groups) * b.cols_per_thread;
                assert!(
                    scores <= 16 && accs <= 16,
                    "d{d} {m}x{n}: {scores} scores, {accs} accs"
                );
            }
        }
    }

    #[test]
    fn tiled2_blocking_fits_lanes_and_threads() {
        // The H200's prefill tile at head size 128: 2 x 4 score and output blocks with 128
        // threads, 4 x 4 with 64.
        let b = AttentionBlocking::tiled2(32, 32, 128, 32).unwrap();
        assert_eq!(
            (b.keys_per_thread, b.key_lanes, b.score_row_groups),
            (4, 8, 16)
        );
        assert_eq!(32u32.div_ceil(b.out_row_groups) * b.cols_per_thread, 8);
        let b = AttentionBlocking::tiled2(32, 32, 64, 32).unwrap();
        assert_eq!(32u32.div_ceil(b.score_row_groups) * b.keys_per_thread, 16);
        assert_eq!(32u32.div_ceil(b.out_row_groups) * b.cols_per_thread, 16);
        assert_eq!(AttentionBlocking::tiled2(32, 32, 96, 32), None);
        assert_eq!(AttentionBlocking::tiled2(32, 30, 128, 32), None);
        for d4 in 1..=128u32 {
            for bn in [8u32, 16, 32, 64] {
                for wg in [32u32, 64, 128, 256] {
                    for max_kl in [1u32, 4, 8, 16, 32, 64, 128] {
                        let b = AttentionBlocking::tiled2(d4, bn, wg, max_kl).unwrap();
                        let kl = b.key_lanes;
                        assert!(kl.is_power_of_two() && kl <= max_kl, "{b:?}");
                        assert_eq!(kl * b.keys_per_thread, bn, "{b:?}");
                        assert_eq!(kl * b.score_row_groups, wg, "{b:?}");
                        assert_eq!(b.cols_per_thread * b.col_lanes, d4, "{b:?}");
                        assert!(b.col_lanes * b.out_row_groups <= wg.max(b.col_lanes));
                    }
                }
            }
        }
        // Other per-thread blocks: at least `keys` keys per thread where the lanes allow,
        // `cols` columns where they divide the head and fit the threads.
        let b = AttentionBlocking::tiled2_with(32, 64, 256, 32, (8, 2)).unwrap();
        assert_eq!(
            (b.keys_per_thread, b.key_lanes, b.score_row_groups),
            (8, 8, 32)
        );
        assert_eq!(
            (b.cols_per_thread, b.col_lanes, b.out_row_groups),
            (2, 16, 16)
        );
        let b = AttentionBlocking::tiled2_with(32, 16, 64, 32, (16, 8)).unwrap();
        assert_eq!((b.keys_per_thread, b.cols_per_thread), (16, 8));
        let b = AttentionBlocking::tiled2_with(6, 16, 32, 32, (4, 8)).unwrap();
        assert_eq!(
            b.cols_per_thread, 2,
            "8 does not divide 6 columns: the default rule"
        );
        assert_eq!(AttentionBlocking::tiled2_with(32, 16, 64, 32, (3, 4)), None);
        for block in [(4u32, 1u32), (8, 2), (8, 8), (16, 4)] {
            for d4 in [1u32, 16, 20, 32, 64, 128] {
                for bn in [8u32, 16, 32, 64] {
                    for wg in [32u32, 128, 512] {
                        let b = AttentionBlocking::tiled2_with(d4, bn, wg, 32, block).unwrap();
                        assert_eq!(b.key_lanes * b.keys_per_thread, bn, "{b:?}");
                        assert!(b.keys_per_thread >= block.0.min(bn), "{b:?}");
                        assert_eq!(b.key_lanes * b.score_row_groups, wg, "{b:?}");
                        assert_eq!(b.cols_per_thread * b.col_lanes, d4, "{b:?}");
                        assert!(b.col_lanes <= wg, "{b:?}");
                    }
                }
            }
        }
        // The tiled2 form fits wherever the tiled form's prefill tile does at 48 KiB
        // (NVIDIA) for the common head sizes.
        for d in [64u32, 80, 96, 128, 256] {
            let (m, n) = choose_tile(d, 48 * 1024, TileKind::Prefill).unwrap();
            assert!(tiled2_shared_bytes(d, m, n) <= 48 * 1024, "d{d} {m}x{n}");
        }
    }

    #[test]
    fn tiled2h_halves_the_tiles() {
        // Queries, keys / values and probabilities at 2 bytes instead of 4; the per-row
        // statistics (6 words per row) and the key-address slot (8 bytes) unchanged.
        for (d, m, n) in [
            (128u32, 64u32, 16u32),
            (128, 32, 32),
            (64, 64, 64),
            (4, 4, 8),
        ] {
            let f32_tiles = tiled2_shared_bytes(d, m, n) - m * 24 - 8;
            assert_eq!(tiled2h_shared_bytes(d, m, n) - m * 24 - 8, f32_tiles / 2);
        }
        // The H200's 64 x 16 tile at head size 128: 24.1 KiB instead of 46.8 (of 48), so
        // 64 x 32 or 128 x 16 tiles would fit as well.
        assert_eq!(tiled2h_shared_bytes(128, 64, 16), 24_712);
        assert_eq!(tiled2_shared_bytes(128, 64, 16), 47_880);
        assert!(tiled2h_shared_bytes(128, 64, 32) <= 48 * 1024);
        assert!(tiled2h_shared_bytes(128, 128, 16) <= 48 * 1024);
    }
}
