//! The CUDA backend's kernel glue: under the names the backend's files use, the planner's
//! work item ([`WorkItem`], read by `paged_attention.cu`), the family's work-item shape and
//! the runtime's compile and launch (`kernels::function`, `kernels::launch`).

pub use crate::kernels::cuda::{KEYS_PER_CHUNK, ROWS_PER_ITEM};
pub use crate::plan::WorkItem;

pub(crate) use crate::device::cuda::{function, launch};
