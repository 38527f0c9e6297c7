//! The tuning a wgpu layer runs with: the WGSL family's knobs ([`WgpuTuning`],
//! `crate::kernels::wgsl::tuning`) for the kind of adapter the device opened.

pub use crate::kernels::wgsl::tuning::*;

use std::sync::OnceLock;

use crate::device::WgpuDevice;

use crate::kernels::tuning_env::{self, Env};

impl WgpuTuning {
    /// The tuning a layer on `dev` runs with: [`WgpuTuning::for_adapter`] for the device's
    /// adapter kind (a CPU adapter or a GPU, with or without subgroups).
    pub fn for_device(dev: &WgpuDevice) -> Self {
        let cpu = dev.adapter_info().device_type == wgpu::DeviceType::Cpu;
        Self::for_adapter(cpu, dev.has_subgroups())
    }
}

/// Knobs of pipeline compilation (every WGSL kernel, attention or not), read once per
/// process through the same parser as [`WgpuTuning`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PipelineTuning {
    /// Put naga's loop-bounding counters back into every kernel
    /// (`POLYATTN_WGPU_LOOP_BOUNDING=0|1`; default off: the kernels' loops are bounded by
    /// construction, and the counters cost registers and time on GPUs).
    pub loop_bounding: bool,
    /// Print the key of every pipeline compiled to stderr (`POLYATTN_WGPU_LOG_PIPELINES=0|1`;
    /// default off): which specialisation a tuning knob actually produced (a tile or
    /// blocking that does not fit falls back to another form).
    pub log_pipelines: bool,
}

impl PipelineTuning {
    /// The process's pipeline knobs, read on first use.
    pub fn get() -> &'static PipelineTuning {
        static T: OnceLock<PipelineTuning> = OnceLock::new();
        T.get_or_init(|| Self::from_lookup(&tuning_env::process_env))
    }

    /// The knobs with the variables read through `lookup`.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Self {
        let env = Env::new(lookup);
        PipelineTuning {
            loop_bounding: env.switch("POLYATTN_WGPU_LOOP_BOUNDING", false),
            log_pipelines: env.switch("POLYATTN_WGPU_LOG_PIPELINES", false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kernels::tuning_env::table as lookup;

    #[test]
    fn pipeline_knobs_parse() {
        let p = PipelineTuning::from_lookup(&lookup(&[("POLYATTN_WGPU_LOG_PIPELINES", "1")]));
        assert!(p.log_pipelines && !p.loop_bounding);
    }
}
