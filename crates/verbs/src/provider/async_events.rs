//! Asynchronous events (`ibv_get_async_event`): a context's queue of
//! them, and the eventfd that is its `async_fd`, counting one per event
//! queued, as the kernel's event file is readable while events wait.

use super::set_errno;
use crate::abi::*;
use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

/// Events a context keeps for the program to take; past it, a new event
/// is dropped (and said once on stderr). A program that never reads its
/// events must not grow the process without bound.
const MAX_QUEUED_EVENTS: usize = 4096;

/// What an event names: a completion queue's or a shared receive queue's
/// `ibv_*` handle, as the program holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Element {
    CompletionQueue(usize),
    SharedReceiveQueue(usize),
}

/// One event raised and not yet taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Raised {
    pub kind: ibv_event_type,
    pub element: Element,
}

/// A context's events.
pub(super) struct AsyncEvents {
    /// A semaphore eventfd: each read takes one count, one event.
    descriptor: OwnedFd,
    queued: Mutex<VecDeque<Raised>>,
}

impl AsyncEvents {
    pub(super) fn new() -> rustix::io::Result<AsyncEvents> {
        use rustix::event::EventfdFlags;
        let descriptor =
            rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::SEMAPHORE)?;
        Ok(AsyncEvents {
            descriptor,
            queued: Mutex::new(VecDeque::new()),
        })
    }

    /// The descriptor `async_fd` names.
    pub(super) fn descriptor(&self) -> RawFd {
        self.descriptor.as_raw_fd()
    }

    /// Queues `raised` and counts it on the descriptor: the count after
    /// the event, so a reader that took a count finds its event.
    pub(super) fn raise(&self, raised: Raised) {
        {
            let mut queued = self.queued();
            if queued.len() >= MAX_QUEUED_EVENTS {
                drop(queued);
                super::report_once("asynchronous events are not being read; new ones are dropped");
                return;
            }
            queued.push_back(raised);
        }
        // A semaphore eventfd's count overflows only past 2^64 - 2.
        let _ = rustix::io::write(self.descriptor.as_fd(), &1u64.to_ne_bytes());
    }

    /// `ibv_get_async_event`: waits for an event (unless the descriptor
    /// is non-blocking: -1 with EAGAIN) and describes it in `event`.
    ///
    /// # Safety
    /// `event` points at an `ibv_async_event` the caller owns.
    pub(super) unsafe fn take(&self, event: *mut ibv_async_event) -> std::ffi::c_int {
        // A count can outlive its event: one `forget` dropped after this
        // reader took the count. Such a count is passed over. Bounded:
        // each turn takes a count, and no more counts are written than
        // events were queued.
        let mut raised = None;
        for _ in 0..=MAX_QUEUED_EVENTS {
            let mut count = [0u8; 8];
            if let Err(error) = rustix::io::read(self.descriptor.as_fd(), &mut count) {
                set_errno(error.raw_os_error());
                return -1;
            }
            raised = self.queued().pop_front();
            if raised.is_some() {
                break;
            }
        }
        let Some(raised) = raised else {
            set_errno(libc::EIO);
            return -1;
        };
        let element = match raised.element {
            Element::CompletionQueue(cq) => ibv_async_event__bindgen_ty_1 {
                cq: cq as *mut ibv_cq,
            },
            Element::SharedReceiveQueue(srq) => ibv_async_event__bindgen_ty_1 {
                srq: srq as *mut ibv_srq,
            },
        };
        // SAFETY: the caller's promise.
        unsafe {
            event.write(ibv_async_event {
                element,
                event_type: raised.kind,
            })
        };
        0
    }

    /// Drops the events that name `element` (it is being destroyed): a
    /// program must not be handed a freed queue. A count is taken back
    /// for each, so the descriptor is not left readable with no event (a
    /// program that polls it, then waits in `ibv_get_async_event`, would
    /// wait for ever).
    pub(super) fn forget(&self, element: Element) {
        let mut queued = self.queued();
        let before = queued.len();
        queued.retain(|raised| raised.element != element);
        let dropped = before - queued.len();
        drop(queued);
        for _ in 0..dropped {
            self.take_back_one_count();
        }
    }

    /// Takes one count off the descriptor without waiting.
    fn take_back_one_count(&self) {
        let mut count = [0u8; 8];
        let flags = rustix::fs::fcntl_getfl(self.descriptor.as_fd());
        let Ok(flags) = flags else { return };
        let nonblocking = flags | rustix::fs::OFlags::NONBLOCK;
        if rustix::fs::fcntl_setfl(self.descriptor.as_fd(), nonblocking).is_err() {
            return;
        }
        let _ = rustix::io::read(self.descriptor.as_fd(), &mut count);
        let _ = rustix::fs::fcntl_setfl(self.descriptor.as_fd(), flags);
    }

    fn queued(&self) -> std::sync::MutexGuard<'_, VecDeque<Raised>> {
        self.queued
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
