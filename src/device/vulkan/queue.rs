//! Submissions to the compute queue that run ahead of the host.
//!
//! Every submission gets a serial (1, 2, …) and a [`Slot`] — a command buffer, a fence and a
//! pool for its descriptor sets — and returns once the queue has it. What the work reads stays
//! alive until it finishes: the submission's [`Keep`] holds the buffers and pipelines it binds
//! (shared handles) and whatever it owns (staging buffers, descriptor pools of its own), and
//! is dropped when its fence is seen signalled ([`VulkanDevice::wait_for`], or the polling
//! that every new submission does first). A fence signal covers every earlier submission of
//! the queue, so the serials complete in order and "serial `s` is done" means all up to `s`
//! are.
//!
//! Ordering on the device needs nothing more: every command buffer starts with a full memory
//! barrier ([`VulkanDevice::after_earlier_submissions`]), whose first scope is every command
//! submitted before it. The host's side is the callers': a host-visible buffer (a parameter
//! slot) is rewritten only after the submissions that read it are done
//! ([`VulkanDevice::wait_for`] with the serial they returned), and results are read back by
//! a download, which waits.
//!
//! At most [`MAX_IN_FLIGHT`] submissions are pending; the next waits for the oldest.

use std::collections::VecDeque;
use std::sync::Arc;

use ash::vk;

use crate::error::Result;

use super::{vk_error, ComputePipeline, VulkanBuffer, VulkanDevice};

/// Pending submissions at most (each holds a command buffer, a fence and a descriptor pool).
pub(crate) const MAX_IN_FLIGHT: usize = 16;

/// Descriptor sets of one submission that its slot's pool holds (a submission with more takes
/// pools of its own for the rest, kept until it finishes).
pub(crate) const SLOT_SETS: u32 = 64;

/// What one submission records into and signals.
pub(crate) struct Slot {
    pub(crate) cmd: vk::CommandBuffer,
    fence: vk::Fence,
    /// The submission's descriptor sets (reset when the slot is reused).
    pub(crate) sets: vk::DescriptorPool,
}

/// What a pending submission reads or owns, released when it finishes. Its fields are only
/// held (their drop is the point), never read.
#[derive(Default)]
#[allow(dead_code)]
pub(crate) struct Keep {
    /// Buffers it binds.
    pub(crate) buffers: Vec<Arc<VulkanBuffer>>,
    /// Buffers only it uses (staging).
    pub(crate) owned: Vec<VulkanBuffer>,
    /// Pipelines it runs.
    pub(crate) pipelines: Vec<Arc<ComputePipeline>>,
    /// Descriptor pools of its own (destroyed when it finishes).
    pub(crate) pools: Vec<vk::DescriptorPool>,
}

struct InFlight {
    serial: u64,
    slot: Slot,
    keep: Keep,
}

/// The compute queue and its submissions, behind the queue lock.
pub(crate) struct QueueState {
    pub(crate) queue: vk::Queue,
    free: Vec<Slot>,
    in_flight: VecDeque<InFlight>,
    /// The serial the next submission gets.
    next: u64,
    /// Every submission up to this serial has finished.
    completed: u64,
    /// Two timestamp queries, for [`VulkanDevice::timestamp_start`] and
    /// [`VulkanDevice::timestamp_elapsed`].
    pub(crate) stamps: vk::QueryPool,
}

impl QueueState {
    pub(crate) fn new(queue: vk::Queue) -> Self {
        QueueState {
            queue,
            free: Vec::new(),
            in_flight: VecDeque::new(),
            next: 1,
            completed: 0,
            stamps: vk::QueryPool::null(),
        }
    }

    /// Destroys the fences, descriptor pools and query pool (the command buffers go with
    /// their pool). The caller has waited for the device to be idle.
    ///
    /// # Safety
    /// Every object was created on `device`, and none is in use.
    pub(crate) unsafe fn destroy(&mut self, device: &ash::Device) {
        let pending = self.in_flight.drain(..).map(|f| {
            for p in &f.keep.pools {
                device.destroy_descriptor_pool(*p, None);
            }
            f.slot
        });
        let slots: Vec<Slot> = pending.chain(self.free.drain(..)).collect();
        for s in slots {
            device.destroy_fence(s.fence, None);
            device.destroy_descriptor_pool(s.sets, None);
        }
        if self.stamps != vk::QueryPool::null() {
            device.destroy_query_pool(self.stamps, None);
        }
    }
}

impl VulkanDevice {
    /// Releases what finished submissions kept; with `until`, first waits for the
    /// submission of that serial (and so for every earlier one).
    pub(crate) fn reclaim(&self, q: &mut QueueState, until: Option<u64>) -> Result<()> {
        let d = self.raw();
        while let Some(front) = q.in_flight.front() {
            let must = until.is_some_and(|s| front.serial <= s);
            // SAFETY: the fence belongs to this device and was submitted with its slot.
            let done = unsafe {
                if must {
                    d.wait_for_fences(&[front.slot.fence], true, u64::MAX)
                        .map_err(|e| vk_error("vkWaitForFences", e))?;
                    true
                } else {
                    d.get_fence_status(front.slot.fence)
                        .map_err(|e| vk_error("vkGetFenceStatus", e))?
                }
            };
            if !done {
                break;
            }
            let Some(f) = q.in_flight.pop_front() else {
                break;
            };
            // SAFETY: the submission finished: its fence and pools are unused.
            unsafe {
                d.reset_fences(&[f.slot.fence])
                    .map_err(|e| vk_error("vkResetFences", e))?;
                for p in &f.keep.pools {
                    d.destroy_descriptor_pool(*p, None);
                }
            }
            q.completed = f.serial;
            q.free.push(f.slot);
        }
        Ok(())
    }

    /// A slot for a new submission, its command buffer begun (one-time submit) with the
    /// barrier after earlier submissions recorded; waits for the oldest submission when
    /// [`MAX_IN_FLIGHT`] are pending.
    pub(crate) fn begin_slot(&self, q: &mut QueueState) -> Result<Slot> {
        let slot = self.take_slot(q)?;
        let d = self.raw();
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: the slot is free (its submission finished), so its command buffer and
        // descriptor sets are unused; the command pool is used under the queue lock only.
        let begun = unsafe {
            d.reset_descriptor_pool(slot.sets, vk::DescriptorPoolResetFlags::empty())
                .and_then(|_| d.begin_command_buffer(slot.cmd, &begin))
        };
        if let Err(e) = begun {
            q.free.push(slot);
            return Err(vk_error("vkBeginCommandBuffer", e));
        }
        self.after_earlier_submissions(slot.cmd);
        Ok(slot)
    }

    /// A free slot (made when none is), after releasing what finished.
    fn take_slot(&self, q: &mut QueueState) -> Result<Slot> {
        self.reclaim(q, None)?;
        if q.in_flight.len() >= MAX_IN_FLIGHT {
            let oldest = q.in_flight.front().map(|f| f.serial);
            self.reclaim(q, oldest)?;
        }
        if let Some(s) = q.free.pop() {
            return Ok(s);
        }
        let d = self.raw();
        let sizes = [
            vk::DescriptorPoolSize {
                ty: vk::DescriptorType::UNIFORM_BUFFER,
                descriptor_count: SLOT_SETS,
            },
            vk::DescriptorPoolSize {
                ty: vk::DescriptorType::STORAGE_BUFFER,
                descriptor_count: SLOT_SETS * 8,
            },
        ];
        // SAFETY: valid create infos; the objects are destroyed with the queue state (the
        // command buffer with its pool), and the pool is used under the queue lock only.
        unsafe {
            let cmd = d
                .allocate_command_buffers(
                    &vk::CommandBufferAllocateInfo::default()
                        .command_pool(self.inner().pool)
                        .level(vk::CommandBufferLevel::PRIMARY)
                        .command_buffer_count(1),
                )
                .map_err(|e| vk_error("vkAllocateCommandBuffers", e))?[0];
            let fence = match d.create_fence(&vk::FenceCreateInfo::default(), None) {
                Ok(f) => f,
                Err(e) => {
                    d.free_command_buffers(self.inner().pool, &[cmd]);
                    return Err(vk_error("vkCreateFence", e));
                }
            };
            let sets = match d.create_descriptor_pool(
                &vk::DescriptorPoolCreateInfo::default()
                    .max_sets(SLOT_SETS)
                    .pool_sizes(&sizes),
                None,
            ) {
                Ok(p) => p,
                Err(e) => {
                    d.destroy_fence(fence, None);
                    d.free_command_buffers(self.inner().pool, &[cmd]);
                    return Err(vk_error("vkCreateDescriptorPool", e));
                }
            };
            Ok(Slot { cmd, fence, sets })
        }
    }

    /// Ends the slot's command buffer and submits it; returns its serial.
    pub(crate) fn launch(&self, q: &mut QueueState, slot: Slot, keep: Keep) -> Result<u64> {
        // SAFETY: the command buffer is recording (`begin_slot`).
        if let Err(e) = unsafe { self.raw().end_command_buffer(slot.cmd) } {
            self.discard(q, slot, keep);
            return Err(vk_error("vkEndCommandBuffer", e));
        }
        let cmd = slot.cmd;
        self.submit_with(q, slot, keep, cmd)
    }

    /// Submits the recorded `cmd` (not the slot's own command buffer) with a free slot's
    /// fence; returns its serial. `cmd` must not be pending (the caller waits for its
    /// previous submission) and must start with the barrier after earlier submissions.
    pub(crate) fn launch_recorded(
        &self,
        q: &mut QueueState,
        cmd: vk::CommandBuffer,
        keep: Keep,
    ) -> Result<u64> {
        let slot = self.take_slot(q)?;
        self.submit_with(q, slot, keep, cmd)
    }

    fn submit_with(
        &self,
        q: &mut QueueState,
        slot: Slot,
        keep: Keep,
        cmd: vk::CommandBuffer,
    ) -> Result<u64> {
        let cmds = [cmd];
        let submit = vk::SubmitInfo::default().command_buffers(&cmds);
        // SAFETY: `cmd` is fully recorded and not pending; the fence is unsignalled (new, or
        // reset when its last submission was reclaimed).
        match unsafe { self.raw().queue_submit(q.queue, &[submit], slot.fence) } {
            Ok(()) => {
                let serial = q.next;
                q.next += 1;
                q.in_flight.push_back(InFlight { serial, slot, keep });
                Ok(serial)
            }
            Err(e) => {
                self.discard(q, slot, keep);
                Err(vk_error("vkQueueSubmit", e))
            }
        }
    }

    /// Puts back a begun slot without submitting it (its recording failed half-way).
    pub(crate) fn abandon(&self, q: &mut QueueState, slot: Slot, keep: Keep) {
        // SAFETY: the command buffer is recording (`begin_slot`); ending it makes it
        // executable, so the next `begin_slot` may begin it again.
        unsafe {
            let _ = self.raw().end_command_buffer(slot.cmd);
        }
        self.discard(q, slot, keep);
    }

    /// Puts back a slot whose submission failed (nothing of it is pending: the queue did not
    /// take it), releasing what it kept.
    fn discard(&self, q: &mut QueueState, slot: Slot, keep: Keep) {
        // SAFETY: nothing submitted uses the pools.
        unsafe {
            for p in &keep.pools {
                self.raw().destroy_descriptor_pool(*p, None);
            }
        }
        q.free.push(slot);
    }

    /// Waits until the submission of `serial` (and every earlier one) has finished.
    pub(crate) fn wait_for(&self, serial: u64) -> Result<()> {
        let mut q = self.queue_lock()?;
        if serial <= q.completed {
            return Ok(());
        }
        self.reclaim(&mut q, Some(serial))
    }

    /// Waits until every submission so far has finished.
    pub fn wait_idle(&self) -> Result<()> {
        let mut q = self.queue_lock()?;
        let last = q.next - 1;
        self.reclaim(&mut q, Some(last))
    }
}
