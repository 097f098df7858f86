//! Protection domains, memory regions, completion queues and channels,
//! shared receive queues, queue pairs and address handles.

use super::async_events::{Element, Raised};
use super::device::{context_object, node_of, MAX_QUEUE_DEPTH, MAX_SCATTER_GATHER};
use super::{errno_of, set_errno};
use crate::abi::*;
use crate::foreign_memory::ForeignMemory;
use crate::node::Awaited;
use remora_rnic::{
    AccessFlags, CompletionQueue, MemoryRegion, ProtectionDomain, SharedReceiveQueue, Verbs,
};
use remora_wire::VirtAddr;
use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Boxes `object` and hands the program a pointer to its first field.
pub(super) fn hand_out<T, C>(object: T) -> *mut C {
    Box::into_raw(Box::new(object)).cast::<C>()
}

/// Takes back what [`hand_out`] gave: the program destroys the object.
///
/// # Safety
/// `pointer` came from `hand_out::<T, _>` and is not used again.
pub(super) unsafe fn take_back<T, C>(pointer: *mut C) -> Box<T> {
    // SAFETY: the caller's promise.
    unsafe { Box::from_raw(pointer.cast::<T>()) }
}

/// The object a program's pointer stands for, shared: threads may call
/// verbs on one object at once, so no call may hold it as `&mut` (two
/// would alias). What changes after creation is in a cell, an atomic or a
/// mutex.
///
/// # Safety
/// `pointer` came from `hand_out::<T, _>` and is not yet destroyed.
pub(super) unsafe fn object<'a, T, C>(pointer: *mut C) -> &'a T {
    // SAFETY: the caller's promise; `T` is repr(C) with `C` first.
    unsafe { &*pointer.cast::<T>() }
}

pub(super) fn null_with<T>(errno: i32) -> *mut T {
    set_errno(errno);
    std::ptr::null_mut()
}

/// How many objects use a PD, CQ or SRQ: destroying it while any does is
/// EBUSY, as the kernel answers rdma-core (a QP would otherwise complete
/// into a queue the program freed).
#[derive(Default)]
pub(super) struct Users(std::sync::atomic::AtomicU32);

impl Users {
    pub fn hold(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    pub fn release(&self) {
        let before = self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        debug_assert!(before > 0, "released more than held");
    }

    pub fn in_use(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire) > 0
    }
}

/// The users of the PD behind `pd`.
///
/// # Safety
/// `pd` is live.
pub(super) unsafe fn pd_users<'a>(pd: *mut ibv_pd) -> &'a Users {
    // SAFETY: the caller's promise.
    &unsafe { object::<PdObject, _>(pd) }.users
}

/// The users of the CQ behind `cq`.
///
/// # Safety
/// `cq` is live.
pub(super) unsafe fn cq_users<'a>(cq: *mut ibv_cq) -> &'a Users {
    // SAFETY: the caller's promise.
    &unsafe { object::<CqObject, _>(cq) }.users
}

/// The users of the SRQ behind `srq`, if there is one.
///
/// # Safety
/// `srq` is null or live.
pub(super) unsafe fn srq_users<'a>(srq: *mut ibv_srq) -> Option<&'a Users> {
    // SAFETY: the caller's promise.
    (!srq.is_null()).then(|| &unsafe { object::<SrqObject, _>(srq) }.users)
}

#[repr(C)]
pub(super) struct PdObject {
    pub pd: ibv_pd,
    pub handle: ProtectionDomain,
    pub users: Users,
}

pub(super) unsafe fn alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    if context.is_null() {
        return null_with(libc::EINVAL);
    }
    // SAFETY: a live context.
    let node = unsafe { node_of(context) };
    match node.with_device(|rnic| rnic.alloc_protection_domain()) {
        Ok(handle) => hand_out(PdObject {
            pd: ibv_pd { context, handle: 0 },
            handle,
            users: Users::default(),
        }),
        Err(error) => null_with(errno_of(&error)),
    }
}

pub(super) unsafe fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    if pd.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live PD.
    if unsafe { pd_users(pd) }.in_use() {
        return libc::EBUSY;
    }
    // SAFETY: the program gives the PD up.
    drop(unsafe { take_back::<PdObject, _>(pd) });
    0
}

#[repr(C)]
pub(super) struct MrObject {
    pub mr: ibv_mr,
    pub region: MemoryRegion,
}

pub(super) fn access_of(flags: u32) -> AccessFlags {
    let mut access = AccessFlags::NONE;
    for (bit, flag) in [
        (IBV_ACCESS_LOCAL_WRITE, AccessFlags::LOCAL_WRITE),
        (IBV_ACCESS_REMOTE_WRITE, AccessFlags::REMOTE_WRITE),
        (IBV_ACCESS_REMOTE_READ, AccessFlags::REMOTE_READ),
        (IBV_ACCESS_REMOTE_ATOMIC, AccessFlags::REMOTE_ATOMIC),
    ] {
        if flags & bit != 0 {
            access = access | flag;
        }
    }
    access
}

/// Whether every byte of `[start, start + length)` is mapped readable (and
/// writable, if `writable`), by the process's own map of its memory.
fn is_mapped(start: usize, length: usize, writable: bool) -> bool {
    if length == 0 {
        return true;
    }
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        // No map to read (no procfs): leave it to the program's promise.
        return true;
    };
    let end = start.saturating_add(length);
    let mut covered_until = start;
    // The map lists mappings in address order, once each.
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(permissions)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((low, high)) = range.split_once('-') else {
            continue;
        };
        let (Ok(low), Ok(high)) = (
            usize::from_str_radix(low, 16),
            usize::from_str_radix(high, 16),
        ) else {
            continue;
        };
        if high <= covered_until {
            continue;
        }
        if low > covered_until {
            return false;
        }
        let permitted = permissions.starts_with('r')
            && (!writable || permissions.as_bytes().get(1) == Some(&b'w'));
        if !permitted {
            return false;
        }
        covered_until = high;
        if covered_until >= end {
            return true;
        }
    }
    false
}

/// Flags Remora does not implement: a real provider without them refuses
/// with EOPNOTSUPP (on-demand paging, zero-based, memory windows).
const UNSUPPORTED_ACCESS: u32 = IBV_ACCESS_ON_DEMAND | IBV_ACCESS_ZERO_BASED | IBV_ACCESS_MW_BIND;

pub(super) unsafe fn reg_mr_iova(
    pd: *mut ibv_pd,
    address: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    if pd.is_null() || address.is_null() || length == 0 {
        return null_with(libc::EINVAL);
    }
    // A range that runs past the address space is not memory the program
    // has (the kernel's pinning refuses it with EFAULT).
    if (address as usize).checked_add(length).is_none() {
        return null_with(libc::EFAULT);
    }
    let access_bits = access as u32;
    if access_bits & UNSUPPORTED_ACCESS != 0 {
        return null_with(libc::EOPNOTSUPP);
    }
    // ibv_reg_mr(3): remote write or atomic access needs local write too
    // (the kernel refuses it with EINVAL; accepted, a program's error
    // path behaved otherwise here than on hardware).
    let remote_writes = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
    if access_bits & remote_writes != 0 && access_bits & IBV_ACCESS_LOCAL_WRITE == 0 {
        return null_with(libc::EINVAL);
    }
    // The kernel's pinning refuses memory that is not mapped, or not
    // writable when the device may write it; accepted, the first peer
    // WRITE or landing answer faulted inside the progress thread.
    let written = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
    if !is_mapped(address as usize, length, access_bits & written != 0) {
        return null_with(libc::EFAULT);
    }
    // A peer's atomic names an 8-byte-aligned IOVA; it must land on an
    // 8-byte-aligned word of the program's memory, so the IOVA and the
    // address must agree modulo 8.
    let misaligned = !iova.wrapping_sub(address as u64).is_multiple_of(8);
    if access_bits & IBV_ACCESS_REMOTE_ATOMIC != 0 && misaligned {
        return null_with(libc::EINVAL);
    }
    // SAFETY: a live PD.
    let pd_object = unsafe { object::<PdObject, _>(pd) };
    // SAFETY: ibv_reg_mr's contract is ForeignMemory's: the program keeps
    // the range mapped until ibv_dereg_mr and respects posted requests.
    let memory = unsafe { ForeignMemory::new(address.cast(), length) };
    // SAFETY: a PD's context is live while the PD is.
    let node = unsafe { node_of(pd_object.pd.context) };
    let registered = node.with_device(|rnic| {
        rnic.register_external_memory(
            pd_object.handle,
            Box::new(memory),
            VirtAddr(iova),
            access_of(access_bits),
        )
    });
    if registered.is_ok() {
        pd_object.users.hold();
    }
    if let Ok(region) = &registered {
        // SAFETY: as above.
        unsafe { context_object(pd_object.pd.context) }
            .owned()
            .regions
            .push(region.lkey);
    }
    match registered {
        Ok(region) => hand_out(MrObject {
            mr: ibv_mr {
                context: pd_object.pd.context,
                pd,
                addr: address,
                length,
                handle: region.lkey.0,
                lkey: region.lkey.0,
                rkey: region.rkey.0,
            },
            region,
        }),
        Err(error) => null_with(errno_of(&error)),
    }
}

pub(super) unsafe fn dereg_mr(mr: *mut ibv_mr) -> c_int {
    if mr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live MR.
    let mr_object = unsafe { object::<MrObject, _>(mr) };
    // SAFETY: its context is live.
    let node = unsafe { node_of(mr_object.mr.context) };
    match node.with_device(|rnic| rnic.deregister_memory(mr_object.region.lkey)) {
        Ok(()) => {
            let lkey = mr_object.region.lkey;
            // SAFETY: its context is live.
            unsafe { context_object(mr_object.mr.context) }
                .owned()
                .regions
                .retain(|owned| *owned != lkey);
            // SAFETY: an MR's PD outlives it (EBUSY above).
            unsafe { pd_users(mr_object.mr.pd) }.release();
            // SAFETY: the program gives the MR up.
            drop(unsafe { take_back::<MrObject, _>(mr) });
            0
        }
        Err(error) => errno_of(&error),
    }
}

/// A completion channel: an eventfd that counts events (semaphore mode,
/// so one read takes one event) and the queues they came from.
///
/// The count and the queue list change together, under the lock, so the
/// descriptor is readable exactly when an event waits, as the kernel's
/// event file is. (A destroyed queue's events once stayed counted: `poll`
/// said readable, and `ibv_get_cq_event` then blocked.) Only a holder of
/// the lock reads the descriptor, and only when `poll` says a count is
/// there, so it never blocks holding the lock that every completion
/// takes. (A program reading the descriptor itself at that very moment
/// can still block it.) A caller waiting for an event blocks instead in a
/// `read` of `doorbell`, a second eventfd rung for each event a waiter
/// needs: a waiter that read the program's descriptor took counts a lock holder
/// had just seen there, which then blocked in its own read holding the
/// lock, and the node with it (found by review).
pub(super) struct ChannelShared {
    events: OwnedFd,
    /// Rung for a waiter no ring is owed to yet, once per event raised
    /// (semaphore mode: each ring wakes one waiter). A ring may outlast
    /// its event (another caller took it); the waiter it wakes finds
    /// none and waits again.
    doorbell: OwnedFd,
    /// The lock also guards the channel's `refcnt`, which rdma-core
    /// updates under the context's lock.
    ready: Mutex<Ready>,
}

/// A channel's events and waiters, under its lock.
#[derive(Default)]
struct Ready {
    /// The queues the counted events came from, in order.
    queues: VecDeque<usize>,
    /// Callers waiting on the doorbell, or on their way to it.
    waiting: usize,
    /// Rings on the doorbell no waiter has taken yet. Rung only while
    /// fewer than `waiting`: rung for every event, the rings of events
    /// other callers took piled up, and a later wait spun through each.
    rung: usize,
}

impl ChannelShared {
    fn new() -> rustix::io::Result<ChannelShared> {
        let flags = rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::SEMAPHORE;
        Ok(ChannelShared {
            events: rustix::event::eventfd(0, flags)?,
            doorbell: rustix::event::eventfd(0, flags)?,
            ready: Mutex::new(Ready::default()),
        })
    }

    fn ready(&self) -> std::sync::MutexGuard<'_, Ready> {
        self.ready
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn raise(&self, cq: *mut ibv_cq) {
        let mut ready = self.ready();
        // Listed only if counted: listed uncounted, it was an event no
        // `poll` would ever show.
        if rustix::io::write(&self.events, &1u64.to_ne_bytes()).is_ok() {
            ready.queues.push_back(cq as usize);
            if ready.rung < ready.waiting
                && rustix::io::write(&self.doorbell, &1u64.to_ne_bytes()).is_ok()
            {
                ready.rung += 1;
            }
        }
    }

    /// Takes one counted event off the descriptor if one is there, without
    /// waiting; the caller holds the lock. Whether one was.
    fn take_count(&self) -> bool {
        if !self.readable() {
            return false;
        }
        let mut counter = [0u8; 8];
        rustix::io::read(&self.events, &mut counter).is_ok()
    }

    /// Whether the program's descriptor holds a count, as `poll` says.
    fn readable(&self) -> bool {
        let mut descriptor = [rustix::event::PollFd::new(
            &self.events,
            rustix::event::PollFlags::IN,
        )];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(rustix::event::poll(&mut descriptor, Some(&zero)), Ok(1))
    }

    /// Forgets `cq`'s pending events, and uncounts them: the program can
    /// no longer be handed a queue it destroyed, nor see the channel
    /// readable for it.
    fn forget(&self, cq: *mut ibv_cq) {
        let mut ready = self.ready();
        let before = ready.queues.len();
        ready.queues.retain(|entry| *entry != cq as usize);
        for _ in ready.queues.len()..before {
            self.take_count();
        }
    }

    /// The next event, waiting for one in a blocking `read` of the
    /// doorbell, as rdma-core's `ibv_get_cq_event` waits in a `read`:
    /// EAGAIN at once if the program made its descriptor non-blocking,
    /// and the kernel's answer to a signal. A handler installed with
    /// `SA_RESTART` (glibc's `signal`, perftest's duration alarm) has the
    /// read restarted, and the wait goes on; one without it ends the wait
    /// with EINTR, which a program may rely on to leave it. (Waiting in
    /// `poll`, which is never restarted, gave the first EINTR, which
    /// perftest takes as fatal, and then the second none.) `take` is
    /// handed the event under the lock: a destroy forgets its queue under
    /// this lock first, so the queue named is live.
    fn next_event<T>(&self, take: impl FnOnce(usize) -> T) -> Result<T, c_int> {
        // Each turn either takes an event or waits for a ring; another
        // thread may take the event behind a ring first, so it loops.
        // Bounded by the events raised while it waits.
        let mut ready = self.ready();
        loop {
            // Without an event, a count is taken all the same: one with no
            // event behind it (the program read the descriptor itself,
            // say) would keep the descriptor readable.
            self.take_count();
            if let Some(queue) = ready.queues.pop_front() {
                return Ok(take(queue));
            }
            let flags =
                rustix::fs::fcntl_getfl(&self.events).map_err(|error| error.raw_os_error())?;
            if flags.contains(rustix::fs::OFlags::NONBLOCK) {
                return Err(libc::EAGAIN);
            }
            // Counted before the lock goes, so an event raised from here
            // on rings for it.
            ready.waiting += 1;
            drop(ready);
            let mut ring = [0u8; 8];
            let rang = rustix::io::read(&self.doorbell, &mut ring);
            ready = self.ready();
            ready.waiting -= 1;
            match rang {
                Ok(_) => ready.rung -= 1,
                // A ring meant for it, if one came, stays for the next
                // waiter, still counted in `rung`.
                Err(error) => return Err(error.raw_os_error()),
            }
        }
    }

    /// Changes the channel's count of queues under the lock.
    ///
    /// # Safety
    /// `channel` is live.
    unsafe fn count_queues(&self, channel: *mut ibv_comp_channel, change: c_int) {
        let _guard = self.ready();
        // SAFETY: live (the caller's promise); the lock serializes writers.
        unsafe { (*channel).refcnt += change };
    }
}

#[repr(C)]
pub(super) struct ChannelObject {
    pub channel: ibv_comp_channel,
    pub shared: Arc<ChannelShared>,
}

/// The shared half of a channel, reached without a reference to the
/// whole object: `refcnt`, in the `ibv_comp_channel` at its head, changes
/// through the raw pointer (it is rdma-core's field), and a reference
/// covering it while it changes, as `object` gave, is undefined behaviour
/// (found by reading).
///
/// # Safety
/// `channel` is live.
unsafe fn channel_shared<'a>(channel: *mut ibv_comp_channel) -> &'a Arc<ChannelShared> {
    // SAFETY: the caller's promise; `ChannelObject` is repr(C) with the
    // channel first, and only the `shared` field is borrowed.
    unsafe { &*std::ptr::addr_of!((*channel.cast::<ChannelObject>()).shared) }
}

pub(super) unsafe fn create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel {
    if context.is_null() {
        return null_with(libc::EINVAL);
    }
    let shared = match ChannelShared::new() {
        Ok(shared) => shared,
        Err(error) => return null_with(error.raw_os_error()),
    };
    let fd = shared.events.as_raw_fd();
    hand_out(ChannelObject {
        channel: ibv_comp_channel {
            context,
            fd,
            refcnt: 0,
        },
        shared: Arc::new(shared),
    })
}

pub(super) unsafe fn destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    if channel.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live channel.
    let shared = unsafe { channel_shared(channel) };
    let in_use = {
        let _guard = shared.ready();
        // SAFETY: live; read through the raw pointer, under the lock its
        // writers take.
        unsafe { std::ptr::addr_of!((*channel).refcnt).read() > 0 }
    };
    if in_use {
        return libc::EBUSY;
    }
    // SAFETY: the program gives it up.
    drop(unsafe { take_back::<ChannelObject, _>(channel) });
    0
}

/// `ibv_get_cq_event`: waits for an event (or fails with EAGAIN if the
/// program made the channel's descriptor non-blocking, or EINTR as a
/// `read` would), then names the queue.
pub(super) unsafe fn get_cq_event(
    channel: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    context_out: *mut *mut c_void,
) -> c_int {
    if channel.is_null() || cq_out.is_null() || context_out.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: a live channel.
    let shared = Arc::clone(unsafe { channel_shared(channel) });
    let named = shared.next_event(|cq| {
        let cq = cq as *mut ibv_cq;
        // SAFETY: live (a destroy forgets it under the lock this runs
        // under); the out-parameters are the caller's.
        unsafe {
            let cq_object = object::<CqObject, _>(cq);
            cq_object.events_handed.fetch_add(1, Ordering::AcqRel);
            *cq_out = cq;
            *context_out = (*cq).cq_context;
        }
    });
    match named {
        Ok(()) => 0,
        Err(errno) => {
            set_errno(errno);
            -1
        }
    }
}

/// How long `ibv_destroy_cq` waits for the events it handed out to be
/// acknowledged before it gives up with EBUSY (rdma-core's waits for
/// ever; freed before, the acknowledging thread wrote freed memory).
pub(super) const UNACKNOWLEDGED_EVENTS_WAIT: Duration = Duration::from_secs(1);

#[repr(C)]
pub(super) struct CqObject {
    /// The program's `ibv_cq`: `ibv_ack_cq_events` writes its
    /// `comp_events_completed` while other threads may poll the queue, so
    /// each access goes through the cell's pointer to one field.
    pub cq: UnsafeCell<ibv_cq>,
    pub queue: CompletionQueue,
    pub channel: Option<Arc<ChannelShared>>,
    pub users: Users,
    /// Threads may ack one queue's events at once: rdma-core sums them
    /// under the CQ's lock, and so does this.
    pub acknowledging: Mutex<()>,
    /// Events `ibv_get_cq_event` named this queue in, all told.
    pub events_handed: AtomicU32,
}

impl CqObject {
    /// The queue's context, set at creation and never written after.
    pub fn context(&self) -> *mut ibv_context {
        // SAFETY: a read of one field of the live cell.
        unsafe { (*self.cq.get()).context }
    }

    /// The queue's completion channel, set at creation.
    fn channel_pointer(&self) -> *mut ibv_comp_channel {
        // SAFETY: a read of one field of the live cell.
        unsafe { (*self.cq.get()).channel }
    }

    /// The events acknowledged; the caller holds `acknowledging`.
    fn events_completed(&self, _acknowledging: &std::sync::MutexGuard<'_, ()>) -> u32 {
        // SAFETY: a read of one field of the live cell, which changes only
        // under the guard the caller holds.
        unsafe { (*self.cq.get()).comp_events_completed }
    }

    fn acknowledging(&self) -> std::sync::MutexGuard<'_, ()> {
        self.acknowledging
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The depth of a CQ asked for `entries`, as mlx5 sizes it: the next
/// power of two above them, less one, within the device's limit. It is
/// written back to `cq->cqe`. A program that sized its CQ to exactly the
/// work it keeps in flight has the slack it has on hardware; without it,
/// one completion more than the count overran the queue here alone.
fn completion_queue_depth(entries: c_int) -> c_int {
    debug_assert!((1..=MAX_QUEUE_DEPTH).contains(&entries));
    let rounded = (entries as u32 + 1).next_power_of_two() - 1;
    (rounded as c_int).clamp(entries, MAX_QUEUE_DEPTH)
}

pub(super) unsafe fn create_cq(
    context: *mut ibv_context,
    entries: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    vector: c_int,
) -> *mut ibv_cq {
    if context.is_null() || !(1..=MAX_QUEUE_DEPTH).contains(&entries) || vector != 0 {
        return null_with(libc::EINVAL);
    }
    let entries = completion_queue_depth(entries);
    // SAFETY: a live context.
    let node = unsafe { node_of(context) };
    let queue = match node.with_device(|rnic| rnic.create_completion_queue(entries as usize)) {
        Ok(queue) => queue,
        Err(error) => return null_with(errno_of(&error)),
    };
    // SAFETY: a live context.
    unsafe { context_object(context) }
        .owned()
        .completion_queues
        .push(queue);
    let shared = if channel.is_null() {
        None
    } else {
        // SAFETY: a live channel.
        let shared = unsafe { channel_shared(channel) };
        // SAFETY: live, as above.
        unsafe { shared.count_queues(channel, 1) };
        Some(Arc::clone(shared))
    };
    let cq: *mut ibv_cq = hand_out(CqObject {
        cq: UnsafeCell::new(ibv_cq {
            context,
            channel,
            cq_context,
            handle: 0,
            cqe: entries,
            ..Default::default()
        }),
        queue,
        channel: shared,
        users: Users::default(),
        acknowledging: Mutex::new(()),
        events_handed: AtomicU32::new(0),
    });
    // An overrun is reported on the context's async_fd, as the kernel
    // reports a CQ in error.
    // SAFETY: a live context.
    let events = Arc::clone(&unsafe { context_object(context) }.events);
    let element = Element::CompletionQueue(cq as usize);
    node.arm(
        Awaited::Overrun(queue),
        Arc::new(move || {
            events.raise(Raised {
                kind: IBV_EVENT_CQ_ERR,
                element,
            })
        }),
    );
    cq
}

pub(super) unsafe fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live CQ.
    let cq_object = unsafe { object::<CqObject, _>(cq) };
    if cq_object.users.in_use() {
        return libc::EBUSY;
    }
    // Events handed out and not acked refuse the destroy before anything
    // changes: refused after, the CQ lived on disarmed, its queued events
    // dropped, and a thread waiting for its next event waited for ever.
    if cq_object.channel.is_some() && !events_acknowledged(cq_object) {
        return libc::EBUSY;
    }
    // An asynchronous event the program took that names it must be
    // acknowledged before it goes, as rdma-core waits: refused before
    // anything changes. From here no asynchronous event names it.
    // SAFETY: its context is live.
    let events = Arc::clone(&unsafe { context_object(cq_object.context()) }.events);
    let element = Element::CompletionQueue(cq as usize);
    if !events.retire(element) {
        return libc::EBUSY;
    }
    // SAFETY: its context is live.
    unsafe { node_of(cq_object.context()) }.disarm(cq_object.queue);
    if let Some(shared) = &cq_object.channel {
        // No event names it from now on; one handed out since the check
        // above must be acked too (a race with another thread's
        // ibv_get_cq_event, the only way this refusal comes now).
        shared.forget(cq);
        if !events_acknowledged(cq_object) {
            events.unretire(element);
            return libc::EBUSY;
        }
    }
    // SAFETY: its context is live. No queue pair uses it (`users`), so
    // the device frees it, and a later queue takes its number.
    let node = unsafe { node_of(cq_object.context()) };
    if let Err(error) = node.with_device(|rnic| rnic.destroy_completion_queue(cq_object.queue)) {
        events.unretire(element);
        return errno_of(&error);
    }
    // Disarmed and gone from the device: nothing raises for it now.
    events.retired(element);
    let queue = cq_object.queue;
    // SAFETY: its context is live.
    unsafe { context_object(cq_object.context()) }
        .owned()
        .completion_queues
        .retain(|owned| *owned != queue);
    // Only once nothing can fail: counted off before a refusal, the CQ
    // lived on while its channel could be destroyed, and a later destroy
    // of the CQ counted off again in the freed channel.
    if let Some(shared) = &cq_object.channel {
        // SAFETY: a CQ's channel outlives it (destroying it first is EBUSY).
        unsafe { shared.count_queues(cq_object.channel_pointer(), -1) };
    }
    // SAFETY: the program gives it up.
    drop(unsafe { take_back::<CqObject, _>(cq) });
    0
}

/// Waits (bounded) until every event handed out for the queue is
/// acknowledged; whether they are.
fn events_acknowledged(cq_object: &CqObject) -> bool {
    let started = Instant::now();
    loop {
        let acknowledged = cq_object.events_completed(&cq_object.acknowledging());
        if acknowledged == cq_object.events_handed.load(Ordering::Acquire) {
            return true;
        }
        if started.elapsed() > UNACKNOWLEDGED_EVENTS_WAIT {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub(super) unsafe fn ack_cq_events(cq: *mut ibv_cq, count: u32) {
    if !cq.is_null() {
        // SAFETY: a live CQ.
        let cq_object = unsafe { object::<CqObject, _>(cq) };
        let guard = cq_object.acknowledging();
        let completed = cq_object.events_completed(&guard).wrapping_add(count);
        // SAFETY: a write of one field of the live cell, under the guard.
        unsafe { (*cq_object.cq.get()).comp_events_completed = completed };
    }
}

/// `req_notify_cq`: the next completion raises an event on the channel;
/// with `solicited_only`, the next solicited receive or failed request.
pub(super) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live CQ.
    let cq_object = unsafe { object::<CqObject, _>(cq) };
    // Arming a CQ with no channel is legal, as in mlx5 and rxe: there is
    // just nowhere for the event to go. Programs arm unconditionally.
    let Some(channel) = cq_object.channel.clone() else {
        return 0;
    };
    let cq_address = cq as usize;
    // SAFETY: its context is live.
    let node = unsafe { node_of(cq_object.context()) };
    let awaited = Awaited::Completion {
        queue: cq_object.queue,
        solicited_only: solicited_only != 0,
    };
    node.arm(
        awaited,
        Arc::new(move || channel.raise(cq_address as *mut ibv_cq)),
    );
    0
}

#[repr(C)]
pub(super) struct SrqObject {
    pub srq: ibv_srq,
    pub queue: SharedReceiveQueue,
    pub users: Users,
    /// Its depth and gather limit, as `ibv_query_srq` reports them.
    capacity: ibv_srq_attr,
    /// The armed `srq_limit`, 0 when none is (it disarms as it fires).
    limit: Arc<AtomicU32>,
}

pub(super) unsafe fn create_srq(
    pd: *mut ibv_pd,
    attributes: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    if pd.is_null() || attributes.is_null() {
        return null_with(libc::EINVAL);
    }
    // SAFETY: a live PD and the caller's attributes.
    let (pd_object, attributes) = unsafe { (object::<PdObject, _>(pd), &mut *attributes) };
    if attributes.attr.max_sge > MAX_SCATTER_GATHER as u32 {
        return null_with(libc::EINVAL);
    }
    // SAFETY: a PD's context is live.
    let node = unsafe { node_of(pd_object.pd.context) };
    let depth = attributes.attr.max_wr.max(1) as usize;
    match node.with_device(|rnic| rnic.create_shared_receive_queue(pd_object.handle, depth)) {
        Ok(queue) => {
            attributes.attr.max_sge = MAX_SCATTER_GATHER as u32;
            pd_object.users.hold();
            // SAFETY: a PD's context is live.
            unsafe { context_object(pd_object.pd.context) }
                .owned()
                .shared_receive_queues
                .push(queue);
            hand_out(SrqObject {
                srq: ibv_srq {
                    context: pd_object.pd.context,
                    srq_context: attributes.srq_context,
                    pd,
                    ..Default::default()
                },
                queue,
                users: Users::default(),
                capacity: ibv_srq_attr {
                    max_wr: depth as u32,
                    max_sge: MAX_SCATTER_GATHER as u32,
                    srq_limit: 0,
                },
                limit: Arc::new(AtomicU32::new(0)),
            })
        }
        Err(error) => null_with(errno_of(&error)),
    }
}

pub(super) unsafe fn destroy_srq(srq: *mut ibv_srq) -> c_int {
    if srq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live SRQ.
    let srq_object = unsafe { object::<SrqObject, _>(srq) };
    if srq_object.users.in_use() {
        return libc::EBUSY;
    }
    // SAFETY: its context is live.
    let context = unsafe { context_object(srq_object.srq.context) };
    let element = Element::SharedReceiveQueue(srq as usize);
    // A limit event the program took must be acknowledged first; from
    // here none names it.
    if !context.events.retire(element) {
        return libc::EBUSY;
    }
    let node = &context.node;
    let queue = srq_object.queue;
    // No queue pair uses it (`users`). Gone from the device, its limit's
    // watch ends with it.
    if let Err(error) = node.with_device(|rnic| rnic.destroy_shared_receive_queue(queue)) {
        context.events.unretire(element);
        return errno_of(&error);
    }
    node.unwatch(Awaited::ReceivesBelow { queue, limit: 0 });
    context.events.retired(element);
    context
        .owned()
        .shared_receive_queues
        .retain(|owned| *owned != queue);
    // SAFETY: an SRQ's PD outlives it.
    unsafe { pd_users(srq_object.srq.pd) }.release();
    // SAFETY: the program gives it up.
    drop(unsafe { take_back::<SrqObject, _>(srq) });
    0
}

/// `ibv_modify_srq`: arms the SRQ's limit (`IBV_SRQ_LIMIT`): once its
/// posted receives fall below it, `IBV_EVENT_SRQ_LIMIT_REACHED` comes on
/// the context's `async_fd` (at once if they are below it already), and
/// the limit disarms. 0 disarms it; a limit past the SRQ's depth is
/// EINVAL. Resizing (`IBV_SRQ_MAX_WR`) is EINVAL, as mlx5 answers it.
pub(super) unsafe fn modify_srq(
    srq: *mut ibv_srq,
    attributes: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    if srq.is_null() || attributes.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live SRQ and the caller's attributes.
    let (srq_object, attributes) = unsafe { (object::<SrqObject, _>(srq), &*attributes) };
    let mask = mask as u32;
    if mask & !IBV_SRQ_LIMIT != 0 || attributes.srq_limit > srq_object.capacity.max_wr {
        return libc::EINVAL;
    }
    if mask & IBV_SRQ_LIMIT == 0 {
        return 0;
    }
    // SAFETY: its context is live.
    let context = unsafe { context_object(srq_object.srq.context) };
    let (queue, limit) = (srq_object.queue, attributes.srq_limit);
    srq_object.limit.store(limit, Ordering::Release);
    if limit == 0 {
        context
            .node
            .unwatch(Awaited::ReceivesBelow { queue, limit: 0 });
        return 0;
    }
    let events = Arc::clone(&context.events);
    let armed = Arc::clone(&srq_object.limit);
    let element = Element::SharedReceiveQueue(srq as usize);
    let awaited = Awaited::ReceivesBelow {
        queue,
        limit: limit as usize,
    };
    context.node.arm(
        awaited,
        Arc::new(move || {
            armed.store(0, Ordering::Release);
            events.raise(Raised {
                kind: IBV_EVENT_SRQ_LIMIT_REACHED,
                element,
            })
        }),
    );
    0
}

/// `ibv_query_srq`: its depth, gather limit and armed limit (0 once it
/// fired).
pub(super) unsafe fn query_srq(srq: *mut ibv_srq, attributes: *mut ibv_srq_attr) -> c_int {
    if srq.is_null() || attributes.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live SRQ.
    let srq_object = unsafe { object::<SrqObject, _>(srq) };
    let answer = ibv_srq_attr {
        srq_limit: srq_object.limit.load(Ordering::Acquire),
        ..srq_object.capacity
    };
    // SAFETY: the caller's attributes.
    unsafe { attributes.write(answer) };
    0
}

#[repr(C)]
struct AhObject {
    ah: ibv_ah,
}

/// Address handles exist for programs that make them (perftest does for
/// every connection); an RC queue pair takes its peer from `modify_qp`.
pub(super) unsafe fn create_ah(pd: *mut ibv_pd, attributes: *mut ibv_ah_attr) -> *mut ibv_ah {
    if pd.is_null() || attributes.is_null() {
        return null_with(libc::EINVAL);
    }
    // SAFETY: a live PD.
    let pd_object = unsafe { object::<PdObject, _>(pd) };
    pd_object.users.hold();
    let context = pd_object.pd.context;
    hand_out(AhObject {
        ah: ibv_ah {
            context,
            pd,
            handle: 0,
        },
    })
}

pub(super) unsafe fn destroy_ah(ah: *mut ibv_ah) -> c_int {
    if ah.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live AH, whose PD outlives it.
    unsafe { pd_users((*ah).pd) }.release();
    // SAFETY: the program gives it up.
    drop(unsafe { take_back::<AhObject, _>(ah) });
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two waiters, and events raised while they wait and taken by a
    /// third caller too: each event goes to one caller, the descriptor
    /// is readable exactly while one waits, and no ring is left over. Waiters that read
    /// the program's descriptor took counts a lock holder had just seen
    /// there, which then blocked in its read holding the lock (found by
    /// review); they wait on the doorbell now.
    #[test]
    fn waiters_and_a_taker_share_the_events_each_once() {
        let channel = Arc::new(ChannelShared::new().unwrap());
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let channel = Arc::clone(&channel);
                std::thread::spawn(move || channel.next_event(|queue| queue).unwrap())
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        for queue in [0x10, 0x20, 0x30] {
            channel.raise(queue as *mut ibv_cq);
        }
        let mut taken: Vec<usize> = waiters
            .into_iter()
            .map(|waiter| waiter.join().unwrap())
            .collect();
        // The third event is the taker's; none is left.
        assert!(channel.readable());
        taken.push(channel.next_event(|queue| queue).unwrap());
        taken.sort_unstable();
        assert_eq!(taken, vec![0x10, 0x20, 0x30]);
        assert!(!channel.readable(), "a count with no event behind it");
        assert!(channel.ready().queues.is_empty());
        // No ring is left over: the third event, which no waiter needed,
        // rang nothing (rung for every event, the rings of events others
        // took piled up, and a later wait spun through each).
        assert_eq!(channel.ready().rung, 0);
        rustix::fs::fcntl_setfl(&channel.doorbell, rustix::fs::OFlags::NONBLOCK).unwrap();
        let mut ring = [0u8; 8];
        assert_eq!(
            rustix::io::read(&channel.doorbell, &mut ring),
            Err(rustix::io::Errno::AGAIN)
        );
        // A non-blocking descriptor answers EAGAIN with no event.
        rustix::fs::fcntl_setfl(&channel.events, rustix::fs::OFlags::NONBLOCK).unwrap();
        assert_eq!(channel.next_event(|queue| queue), Err(libc::EAGAIN));
    }
}
