//! Recording one step into the caller's encoder: the uniform slot of a clip
//! configuration, the passes, and the copy that brings the report back.

use super::{lock, GradSet, CONFIG_SLOTS};
use crate::config::{ClipNorm, Reduction};
use crate::records::{
    ClipConfig, CFG_PER_TENSOR, CFG_TENSOR_NORMS, DISPATCH_OFFSET, DISPATCH_SIZE,
};

/// Where `clip_norm_timed` writes its timestamps: a query set and the first index.
pub(super) type Timing<'a> = Option<(&'a wgpu::QuerySet, u32)>;

pub(super) trait TimingWrites<'a> {
    fn writes(self, begin: u32, end: u32) -> Option<wgpu::ComputePassTimestampWrites<'a>>;
}

impl<'a> TimingWrites<'a> for Timing<'a> {
    /// Timestamps at the beginning and end of a pass, `begin` and `end` past the first index.
    fn writes(self, begin: u32, end: u32) -> Option<wgpu::ComputePassTimestampWrites<'a>> {
        self.map(|(query_set, first)| wgpu::ComputePassTimestampWrites {
            query_set,
            beginning_of_pass_write_index: Some(first + begin),
            end_of_pass_write_index: Some(first + end),
        })
    }
}

/// Which clip configurations are in which uniform slot.
#[derive(Debug, Default)]
pub(super) struct ConfigCache {
    slots: Vec<ClipConfig>,
    next: usize,
}

impl GradSet {
    /// Dynamic offset of the uniform slot holding `config`; uploads it the
    /// first time it is seen. Slots are reused round-robin past
    /// `CONFIG_SLOTS` distinct configurations.
    pub(super) fn config_offset(&self, config: ClipConfig) -> u32 {
        let mut cache = lock(&self.configs);
        let slot = match cache.slots.iter().position(|c| c.same_bits(&config)) {
            Some(slot) => slot,
            None => {
                let slot = if (cache.slots.len() as u64) < CONFIG_SLOTS {
                    cache.slots.push(config);
                    cache.slots.len() - 1
                } else {
                    let slot = cache.next;
                    cache.next = (slot + 1) % CONFIG_SLOTS as usize;
                    cache.slots[slot] = config;
                    slot
                };
                self.inner.queue.write_buffer(
                    &self.uniforms,
                    self.config_base + slot as u64 * self.uniform_stride,
                    bytemuck::bytes_of(&config),
                );
                slot
            }
        };
        (slot as u64 * self.uniform_stride) as u32
    }

    pub(super) fn pass<'e>(
        &self,
        encoder: &'e mut wgpu::CommandEncoder,
        label: &'static str,
        timestamp_writes: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) -> wgpu::ComputePass<'e> {
        encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(label),
            timestamp_writes,
        })
    }

    /// The workgroups the shaders stride with for `config` (WGSL's
    /// `stride_workgroups()`): per-tensor chunks when per-tensor results are
    /// asked for, flat chunks otherwise.
    pub(super) fn workgroups_for(&self, config: &ClipConfig) -> u32 {
        if config.flags & (CFG_TENSOR_NORMS | CFG_PER_TENSOR) != 0 {
            self.workgroups
        } else {
            self.flat_workgroups
        }
    }

    /// The reduce dispatches (one per window) and the finalize dispatch;
    /// timestamps 0, 1 (inside the pass, where the device can) and 2.
    pub(super) fn encode_norm(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        reduction: Reduction,
        config: &ClipConfig,
        offset: u32,
        timing: Timing<'_>,
    ) {
        let pipelines = &self.inner.pipelines;
        let mut pass = self.pass(encoder, "gradclip reduce + finalize", timing.writes(0, 2));
        if self.has_elements {
            for (bind_group, elem) in self.bind_groups.iter().zip(&self.window_pipelines) {
                pass.set_pipeline(elem.reduce(reduction));
                pass.set_bind_group(0, bind_group, &[offset]);
                pass.dispatch_workgroups(self.workgroups_for(config), 1, 1);
            }
        }
        if let Some((query_set, first)) = timing {
            if self
                .inner
                .device
                .features()
                .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES)
            {
                pass.write_timestamp(query_set, first + 1);
            }
        }
        pass.set_pipeline(pipelines.finalize(reduction));
        pass.set_bind_group(0, &self.bind_groups[0], &[offset]);
        pass.dispatch_workgroups(1, 1, 1);
    }

    /// The scale pass, as many workgroups as finalize decided (often none);
    /// timestamps 3 and 4.
    pub(super) fn encode_scale(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        offset: u32,
        timing: Timing<'_>,
    ) {
        if !self.has_elements {
            return;
        }
        // The indirect arguments cannot be read from the stats binding
        // itself: a buffer may not be both storage and indirect in one dispatch.
        encoder.copy_buffer_to_buffer(
            &self.stats,
            DISPATCH_OFFSET,
            &self.indirect,
            0,
            DISPATCH_SIZE,
        );
        let mut pass = self.pass(encoder, "gradclip scale", timing.writes(3, 4));
        for (bind_group, elem) in self.bind_groups.iter().zip(&self.window_pipelines) {
            pass.set_pipeline(&elem.scale);
            pass.set_bind_group(0, bind_group, &[offset]);
            pass.dispatch_workgroups_indirect(&self.indirect, 0);
        }
    }

    pub(super) fn record_report(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        config: &ClipConfig,
        clip: &ClipNorm,
    ) {
        let step = {
            let mut steps = lock(&self.steps);
            *steps += 1;
            *steps
        };
        let tensors = clip.reports_tensor_norms();
        self.reports.record(
            encoder,
            &self.stats,
            step,
            config.error_if_nonfinite != 0,
            tensors,
        );
    }
}
