//! A tensor-parallel group: one device per rank, and the sum of the ranks' partial results
//! (the all-reduce after a row-parallel projection).
//!
//! Ranks on distinct CUDA GPUs sum through NCCL: one communicator per GPU of this process,
//! the ranks' calls grouped from one thread (`device::cuda::NcclComms`), each queued on its
//! GPU's stream, so the host never waits. Any other group sums through the host: every
//! rank's tensor is read back, the parts are added in rank order in f32, and the sum is
//! written to every rank. That covers what NCCL does not serve — ranks sharing one device
//! (the math of N GPUs checked on one), CPU, Vulkan, wgpu and HIP devices, mixed kinds, and
//! CUDA where NCCL cannot be loaded — so the same model code runs everywhere; it waits for
//! every rank and moves each tensor twice, so it is a correctness path, not a fast one.
//! [`RankGroup::transport`] says which one a group uses and why.

use crate::device::cuda::NcclComms;
use crate::device::{Device, Tensor};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// How a [`RankGroup`] sums across its ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    /// NCCL between distinct CUDA GPUs.
    Nccl,
    /// Through host memory, with the reason NCCL is not used.
    Host {
        /// Why NCCL does not serve this group.
        why: String,
    },
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Nccl => f.write_str("NCCL"),
            Transport::Host { why } => write!(f, "the host ({why})"),
        }
    }
}

/// The ranks of a tensor-parallel group (rank `r` on `devices[r]`) and their all-reduce.
#[derive(Debug)]
pub struct RankGroup {
    devices: Vec<Device>,
    nccl: Option<NcclComms>,
    transport: Transport,
}

impl RankGroup {
    /// A group with rank `r` on `devices[r]`: NCCL when every device is a distinct CUDA GPU and
    /// NCCL loads, else host sums (module docs). Errors only for an empty list.
    pub fn new(devices: Vec<Device>) -> Result<Self> {
        if devices.is_empty() {
            return Err(Error::config("a rank group needs at least one device"));
        }
        let gpus: Option<Vec<_>> = devices
            .iter()
            .map(|d| match d {
                Device::Cuda(c) => Some(c.clone()),
                _ => None,
            })
            .collect();
        let shared = gpus.as_ref().and_then(|g| {
            g.iter()
                .enumerate()
                .find(|(i, d)| g[..*i].contains(d))
                .map(|(_, d)| d.ordinal())
        });
        let (nccl, transport) = match (gpus, shared) {
            (Some(_), Some(o)) => {
                let why = format!("ranks share GPU {o}: NCCL needs a GPU per rank");
                (None, Transport::Host { why })
            }
            (Some(gpus), None) => match NcclComms::new(&gpus) {
                Ok(comms) => (Some(comms), Transport::Nccl),
                Err(e) => (None, Transport::Host { why: e.to_string() }),
            },
            (None, _) => {
                let kinds: Vec<&str> = devices.iter().map(|d| d.kind().as_str()).collect();
                let why = format!("ranks on {}: NCCL serves CUDA GPUs only", kinds.join(", "));
                (None, Transport::Host { why })
            }
        };
        Ok(RankGroup {
            devices,
            nccl,
            transport,
        })
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.devices.len()
    }

    /// Rank `rank`'s device.
    pub fn device(&self, rank: usize) -> Option<&Device> {
        self.devices.get(rank)
    }

    /// How the group sums.
    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    /// Sums `tensors[r]` (rank `r`'s, on its device; every one the same shape and an f32,
    /// f16 or bf16 dtype) across the ranks, in place: afterwards every rank holds the sum.
    /// Through NCCL the call only queues work on the GPUs' streams.
    pub fn all_reduce_sum(&mut self, tensors: &mut [&mut Tensor]) -> Result<()> {
        let n = self.world_size();
        if tensors.len() != n {
            return Err(Error::config(format!(
                "all-reduce over {n} ranks got {} tensors",
                tensors.len()
            )));
        }
        let (shape, dtype) = (tensors[0].shape().to_vec(), tensors[0].dtype());
        if !matches!(dtype, DType::F32 | DType::F16 | DType::Bf16) {
            return Err(Error::DType {
                what: "all_reduce_sum tensor",
                got: dtype.to_string(),
                expected: "f32, f16 or bf16".into(),
            });
        }
        for (r, t) in tensors.iter().enumerate() {
            t.expect_dtype("all_reduce_sum tensor", dtype)?;
            t.expect_shape("all_reduce_sum tensor", &shape)?;
            if t.device() != &self.devices[r] {
                return Err(Error::config(format!(
                    "all-reduce: rank {r}'s tensor lives on {}, the rank on {}",
                    t.device().description(),
                    self.devices[r].description()
                )));
            }
        }
        match &mut self.nccl {
            Some(comms) => comms.all_reduce_sum(tensors),
            None => host_sum(tensors),
        }
    }
}

/// The host path: parts read back, added in rank order in f32, written to every rank.
fn host_sum(tensors: &mut [&mut Tensor]) -> Result<()> {
    if tensors.len() == 1 {
        return Ok(());
    }
    let mut sum = tensors[0].to_f32_vec()?;
    for t in tensors[1..].iter() {
        for (s, x) in sum.iter_mut().zip(t.to_f32_vec()?) {
            *s += x;
        }
    }
    for t in tensors.iter_mut() {
        if t.dtype() == DType::F32 {
            t.write_f32(&sum)?;
        } else {
            let part = Tensor::from_f32(t.device(), &sum, t.shape(), t.dtype())?;
            t.copy_from(&part)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_sums_leave_the_sum_on_every_rank() {
        let cpu = Device::cpu();
        let mut group = RankGroup::new(vec![cpu.clone(), cpu.clone(), cpu.clone()]).unwrap();
        assert!(matches!(group.transport(), Transport::Host { why } if why.contains("cpu")));
        for dtype in [DType::F32, DType::Bf16] {
            let parts: Vec<Vec<f32>> = (0..3)
                .map(|r| (0..6).map(|i| (i * 3 + r) as f32 * 0.5 - 2.0).collect())
                .collect();
            let mut ts: Vec<Tensor> = parts
                .iter()
                .map(|p| Tensor::from_f32(&cpu, p, &[2, 3], dtype).unwrap())
                .collect();
            let mut refs: Vec<&mut Tensor> = ts.iter_mut().collect();
            group.all_reduce_sum(&mut refs).unwrap();
            let want: Vec<f32> = (0..6).map(|i| parts.iter().map(|p| p[i]).sum()).collect();
            for t in &ts {
                assert_eq!(t.to_f32_vec().unwrap(), want, "{dtype}");
            }
        }
    }

    #[test]
    fn ranks_on_different_device_kinds_sum_through_the_host() {
        let cpu = Device::cpu();
        let other = ["VULKAN", "WGPU"].iter().find_map(|name| {
            let b = crate::registry::global().get(name)?;
            b.availability()
                .is_available()
                .then(|| b.device().ok())
                .flatten()
        });
        let Some(other) = other else {
            eprintln!(
                "SKIP ranks_on_different_device_kinds_sum_through_the_host: no device besides \
                 the CPU (no Vulkan driver)"
            );
            return;
        };
        let mut group = RankGroup::new(vec![cpu.clone(), other.clone()]).unwrap();
        assert!(matches!(group.transport(), Transport::Host { .. }));
        let mut a = Tensor::from_f32(&cpu, &[1.0, 2.0, 3.0], &[3], DType::F32).unwrap();
        let mut b = Tensor::from_f32(&other, &[0.5, -4.0, 8.0], &[3], DType::F32).unwrap();
        group.all_reduce_sum(&mut [&mut a, &mut b]).unwrap();
        assert_eq!(a.to_f32_vec().unwrap(), [1.5, -2.0, 11.0]);
        assert_eq!(b.to_f32_vec().unwrap(), [1.5, -2.0, 11.0]);
        // A part on another rank's device is refused, naming the rank.
        let mut c = Tensor::zeros(&cpu, &[3], DType::F32).unwrap();
        let e = group.all_reduce_sum(&mut [&mut a, &mut c]).unwrap_err();
        assert!(e.to_string().contains("rank 1's tensor lives on"), "{e}");
    }

    #[test]
    fn bad_groups_and_parts_are_errors() {
        let cpu = Device::cpu();
        assert!(RankGroup::new(Vec::new()).is_err());
        let mut group = RankGroup::new(vec![cpu.clone(), cpu.clone()]).unwrap();
        let mut a = Tensor::zeros(&cpu, &[4], DType::F32).unwrap();
        let mut b = Tensor::zeros(&cpu, &[5], DType::F32).unwrap();
        let mut c = Tensor::zeros(&cpu, &[4], DType::I32).unwrap();
        assert!(
            group.all_reduce_sum(&mut [&mut a]).is_err(),
            "one part for two ranks"
        );
        assert!(
            group.all_reduce_sum(&mut [&mut a, &mut b]).is_err(),
            "shapes differ"
        );
        let e = group.all_reduce_sum(&mut [&mut c, &mut a]).unwrap_err();
        assert!(e.to_string().contains("f32, f16 or bf16"), "{e}");
    }
}
