//! Launch shapes of the family's kernels: threads per CTA, rows and keys per work item, the
//! tensor-core kernels' CTA shapes ([`MmaShape`]) and the dynamic shared memory each kernel
//! needs for a head size. They mirror the `#define`s of the `.cu` files.

use crate::dtype::DType;

/// Rows (query token × head pairs) of one attention work item; `paged_attention.cu`'s
/// `PA_ROWS`.
pub const ROWS_PER_ITEM: usize = 16;

/// Keys per chunk (`PA_KC`).
pub const KEYS_PER_CHUNK: usize = 16;

/// Threads of an NVIDIA warp (`PA_WAVE` on NVIDIA; AMD's wavefront is 64 on CDNA, 32 on RDNA).
pub const NVIDIA_WARP: usize = 32;

/// Warps (wavefronts) per attention CTA (`PA_WARPS`).
pub const ATTN_WARPS: usize = 4;

/// Threads per attention CTA on a device whose warps / wavefronts are `wave` wide
/// (`PA_ATTN_THREADS`).
pub const fn attention_threads(wave: usize) -> u32 {
    (ATTN_WARPS * wave) as u32
}

/// Threads per attention CTA on NVIDIA.
pub const ATTN_THREADS: u32 = attention_threads(NVIDIA_WARP);

/// Dynamic shared memory of the attention kernel for `head_size`.
pub fn attention_smem_bytes(head_size: usize) -> u32 {
    let d = head_size;
    ((ROWS_PER_ITEM * d + KEYS_PER_CHUNK * (d + 2) + KEYS_PER_CHUNK * d) * 4) as u32
}

/// Head size of the CUDA-core decode kernel (`PDC_D` of `paged_decode_cores.cu`).
pub const DECODE_CORES_HEAD_SIZE: usize = 64;

/// The head slots of the CUDA-core decode kernel's variants (`PDC_H`), fewest first.
pub const DECODE_CORES_HEADS: [usize; 3] = [4, 8, 16];

/// The CUDA-core decode variant (head slots, `-D` option, entry point) for work items of at
/// most `head_count` heads: the fewest slots that hold them; `None` past 16.
pub fn decode_cores_variant(head_count: usize) -> Option<(usize, String, String)> {
    let h = DECODE_CORES_HEADS.into_iter().find(|&h| head_count <= h)?;
    Some((
        h,
        format!("-DPDC_ONLY_H={h}"),
        format!("paged_decode_cores_h{h}"),
    ))
}

/// Dynamic shared memory of the CUDA-core decode kernel with `heads` head slots: the query
/// rows, then a `[32][68]` f32 value tile per warp.
pub fn decode_cores_smem_bytes(heads: usize) -> u32 {
    ((heads * DECODE_CORES_HEAD_SIZE + ATTN_WARPS * 32 * (DECODE_CORES_HEAD_SIZE + 4)) * 4) as u32
}

/// The CTA shape of the tensor-core prefill kernel: query rows per CTA (and per work item)
/// and warps per CTA. Every warp owns `rows / (16 warps)` m16 tiles (1 or 2) and every warp
/// reads each K/V tile of the CTA, so more rows per CTA means less K/V traffic per FLOP, and
/// two tiles per warp means less shared-memory traffic per FLOP (at more registers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmaShape {
    /// Query rows per CTA (`MMA_ROWS`).
    pub rows: usize,
    /// Warps per CTA (`MMA_WARPS`).
    pub warps: usize,
}

impl MmaShape {
    /// m16 tiles per warp (`PA_MMA_MT`).
    pub fn tiles_per_warp(self) -> usize {
        self.rows / (16 * self.warps)
    }

    /// Threads per CTA.
    pub fn threads(self) -> u32 {
        (self.warps * 32) as u32
    }
}

/// The CTA shapes the tensor-core kernel can be built for: 64 rows on 4 warps (one m16 tile
/// each), 128 rows on 4 warps (two each) or on 8 warps (one each), 256 rows on 8 warps.
pub const MMA_SHAPES: [MmaShape; 4] = [
    MmaShape { rows: 64, warps: 4 },
    MmaShape {
        rows: 128,
        warps: 4,
    },
    MmaShape {
        rows: 128,
        warps: 8,
    },
    MmaShape {
        rows: 256,
        warps: 8,
    },
];

/// Dynamic shared memory of the tensor-core kernel built for `rows` query rows: the Q tile
/// and two K and two V tiles (double-buffered, 64 keys each), rows of `head_size + 8` 16-bit
/// elements. (Its 1 KiB table of key-row addresses is static shared memory.)
pub fn mma_smem_bytes(head_size: usize, rows: usize) -> u32 {
    ((rows + 4 * 64) * (head_size + 8) * 2) as u32
}

/// Query rows per CTA and per work item of the Hopper prefill kernel
/// (`paged_attention_wgmma_ws.cu`'s `WS_ROWS`: two consumer warpgroups of 64 rows).
pub const WGMMA_ROWS: usize = 128;

/// Threads per CTA of the Hopper prefill kernel (`WS_THREADS`: a producer and two consumer
/// warpgroups).
pub const WGMMA_THREADS: u32 = 384;

/// Keys per tile of the Hopper prefill kernel (`PA_WS_KEYS`; 64-key tiles over four stages
/// were 5–10 % slower on an H100, `benches/results/lease-h100.md`).
pub const WGMMA_KEYS: usize = 128;

/// Shared memory a CTA may hold on compute capability 9.0 (227 KiB).
const HOPPER_SMEM_PER_CTA: usize = 227 * 1024;

/// Static shared memory of the Hopper prefill kernel, rounded up: its
/// mbarriers, the double-buffered row-address table (up to 128 keys), the rows' visible
/// ranges and the consumer warps' bounds.
const WGMMA_STATIC_SMEM: usize = 4096;

/// K / V stages of the Hopper prefill kernel (`-DPA_WS_STAGES`): as many tiles of
/// [`WGMMA_KEYS`] as fit beside the Q tile, up to 4 (2 at head size 128, 4 at 64).
pub fn wgmma_stages(head_size: usize) -> usize {
    let q = WGMMA_ROWS * head_size * 2;
    let stage = 2 * WGMMA_KEYS * head_size * 2;
    let room = HOPPER_SMEM_PER_CTA.saturating_sub(1024 + q + WGMMA_STATIC_SMEM);
    (room / stage.max(1)).clamp(2, 4)
}

/// Dynamic shared memory of the Hopper prefill kernel: the Q tile (128 rows), the stages' K
/// and V tiles, `head_size` 16-bit elements a row, and 1024 bytes that let the kernel round
/// its base up to the 128-byte swizzle's 1024-byte period.
pub fn wgmma_smem_bytes(head_size: usize) -> u32 {
    let stages = wgmma_stages(head_size);
    (1024 + (WGMMA_ROWS + 2 * stages * WGMMA_KEYS) * head_size * 2) as u32
}

/// Query heads per work item of the decode kernel (the m16 rows of its mma tiles).
pub const DECODE_ROWS_PER_ITEM: usize = 16;

/// Threads per decode CTA (`DEC_WARPS` warps).
pub const DECODE_THREADS: u32 = 128;

/// Ring stages per warp of the decode kernel (`DEC_STAGES`).
pub const DECODE_STAGES: usize = 3;

/// Keys per chunk of the decode kernel (`DEC_KEYS`).
pub const DECODE_KEYS_PER_CHUNK: usize = 16;

/// Most key splits of one decode token on the decode kernel (`DEC_MAX_SPLITS` of
/// `paged_decode.cu`: its in-CTA merge holds this many partial weights per warp).
pub const DECODE_MAX_SPLITS: usize = 128;

/// Dynamic shared memory of the decode kernel: Q `[16][D+8]` and, per warp, `DECODE_STAGES`
/// stages of K and V `[16][D+8]`, 16-bit elements; for an fp8 `cache_dtype`, per warp
/// `DECODE_STAGES` stages of raw K and V `[16][D+16]` bytes and one converted K and V
/// `[16][D+8]` tile.
pub fn decode_smem_bytes(head_size: usize, cache_dtype: DType) -> u32 {
    let row = (head_size + 8) * 2;
    let warps = DECODE_THREADS as usize / 32;
    let tile = DECODE_KEYS_PER_CHUNK * row;
    let per_warp = if cache_dtype.is_fp8() {
        DECODE_STAGES * 2 * DECODE_KEYS_PER_CHUNK * (head_size + 16) + 2 * tile
    } else {
        DECODE_STAGES * 2 * tile
    };
    (16 * row + warps * per_warp) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_sizes() {
        // Alignment slack, Q [128][128], 2 x (K + V) [128][128], 2 bytes each: 161 KiB, within
        // the 227 KiB a Hopper CTA may opt into; at head size 64 four stages.
        assert_eq!(wgmma_stages(128), 2);
        assert_eq!(wgmma_stages(64), 4);
        assert_eq!(wgmma_smem_bytes(128), 1024 + (128 + 512) * 128 * 2);
        assert!(wgmma_smem_bytes(128) as usize + 4096 <= 227 * 1024);
        assert!(wgmma_smem_bytes(64) as usize + 4096 <= 227 * 1024);
        assert_eq!(
            attention_smem_bytes(256),
            (16 * 256 + 16 * 258 + 16 * 256) * 4
        );
        // Q [16][136] + 4 warps x 3 stages x (K + V) [16][136], 2 bytes each.
        assert_eq!(
            decode_smem_bytes(128, DType::Bf16),
            16 * 136 * 2 + 4 * 3 * 2 * 16 * 136 * 2
        );
        // fp8: Q, then 4 warps x (3 stages x raw K + V [16][144] bytes + K, V [16][136] x 2).
        assert_eq!(
            decode_smem_bytes(128, DType::Fp8E4m3),
            16 * 136 * 2 + 4 * (3 * 2 * 16 * 144 + 2 * 16 * 136 * 2)
        );
        // CUDA-core decode: Q [16][64] + 4 warps x [32][68] f32, inside the 48 KiB a kernel
        // gets without opting in.
        assert_eq!(decode_cores_smem_bytes(16), (16 * 64 + 4 * 32 * 68) * 4);
        assert!(decode_cores_smem_bytes(16) <= 48 * 1024);
    }

    #[test]
    fn decode_cores_variants() {
        let v = |n| decode_cores_variant(n).map(|(h, _, name)| (h, name));
        assert_eq!(v(1), Some((4, "paged_decode_cores_h4".to_string())));
        assert_eq!(v(3), Some((4, "paged_decode_cores_h4".to_string())));
        assert_eq!(v(5), Some((8, "paged_decode_cores_h8".to_string())));
        assert_eq!(v(16), Some((16, "paged_decode_cores_h16".to_string())));
        assert_eq!(v(17), None);
        // Every variant is an entry point of its source.
        for n in DECODE_CORES_HEADS {
            let (_, define, name) = decode_cores_variant(n).unwrap();
            assert!(super::super::PAGED_DECODE_CORES
                .functions
                .contains(&name.as_str()));
            assert_eq!(define, format!("-DPDC_ONLY_H={n}"));
        }
    }
}
