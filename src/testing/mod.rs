//! Test support shared by the test suite, `polyattn check` and the benchmarks: seeded
//! random batches and per-dtype tolerances. Public so that plugin backends can run the same
//! bodies on their own devices.

mod batch;
pub mod fuzz;

pub use crate::rng::Rng;
pub use batch::{round_to, round_to_cache, BatchSpec, CaseConfig, RandomBatch};

use crate::dtype::DType;

/// Absolute and relative tolerance: `|got − want| ≤ atol + rtol·|want|`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Tolerance {
    /// Absolute part.
    pub atol: f64,
    /// Relative part.
    pub rtol: f64,
}

impl Tolerance {
    /// The tolerance for outputs in `dtype` compared with the f64 reference.
    ///
    /// f32 is tight (the kernels accumulate in f32); f16 / bf16 follow vLLM's attention
    /// tests (1.5e-2, 1e-2). fp8 caches need no looser bound here, because the reference
    /// reads the same dequantised values the cache holds (see [`RandomBatch`]).
    pub fn for_dtype(dtype: DType) -> Self {
        match dtype {
            DType::F32 => Tolerance {
                atol: 2e-5,
                rtol: 1e-5,
            },
            DType::F16 => Tolerance {
                atol: 1.5e-2,
                rtol: 1e-2,
            },
            _ => Tolerance {
                atol: 1.5e-2,
                rtol: 1e-2,
            },
        }
    }

    /// True when `got` is within tolerance of `want`.
    pub fn accepts(&self, got: f64, want: f64) -> bool {
        (got - want).abs() <= self.atol + self.rtol * want.abs()
    }
}
