//! Asynchronous events (`ibv_get_async_event`): a context's queue of
//! them, and the descriptor that is its `async_fd`, readable while events
//! wait, as the kernel's event file is.
//!
//! The descriptor is one end of a Unix stream socket pair holding one
//! byte per event queued. A byte can be taken back without waiting
//! (`MSG_DONTWAIT`) when a destroyed queue's events go, so the descriptor
//! is never left readable with no event, and no flag of the program's
//! descriptor is touched (an eventfd needed `O_NONBLOCK` toggled on it,
//! which a blocking reader in another thread saw as EAGAIN, and which
//! could undo the program's own `fcntl`).

use super::set_errno;
use crate::abi::*;
use rustix::net::{RecvFlags, SendFlags};
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Events a context keeps for the program to take; past it, a new event
/// is dropped (and said once on stderr). A program that never reads its
/// events must not grow the process without bound.
const MAX_QUEUED_EVENTS: usize = 4096;

/// How long destroying a queue waits for the program to acknowledge the
/// events it took that name the queue (as rdma-core's destroy waits),
/// before it answers EBUSY rather than free what an event names.
pub(super) const UNACKNOWLEDGED_EVENTS_WAIT: Duration = Duration::from_secs(1);

/// What an event names: a completion queue's or a shared receive queue's
/// `ibv_*` handle, as the program holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// `async_fd`: one byte waits here per event queued.
    reader: OwnedFd,
    writer: OwnedFd,
    queued: Mutex<VecDeque<Raised>>,
    /// Events taken and not yet acknowledged, by what they name.
    unacknowledged: Mutex<HashMap<Element, u32>>,
}

impl AsyncEvents {
    pub(super) fn new() -> rustix::io::Result<AsyncEvents> {
        use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
        let (reader, writer) = socketpair(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )?;
        Ok(AsyncEvents {
            reader,
            writer,
            queued: Mutex::new(VecDeque::new()),
            unacknowledged: Mutex::new(HashMap::new()),
        })
    }

    /// The descriptor `async_fd` names.
    pub(super) fn descriptor(&self) -> RawFd {
        self.reader.as_raw_fd()
    }

    /// Queues `raised` and its byte: the byte after the event, so a
    /// reader that took a byte finds its event.
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
        // 4096 bytes at most wait: far within a stream socket's buffer.
        let _ = rustix::net::send(&self.writer, &[1], SendFlags::DONTWAIT);
    }

    /// `ibv_get_async_event`: waits for an event (unless the program made
    /// the descriptor non-blocking: -1 with EAGAIN) and describes it in
    /// `event`.
    ///
    /// # Safety
    /// `event` points at an `ibv_async_event` the caller owns.
    pub(super) unsafe fn take(&self, event: *mut ibv_async_event) -> std::ffi::c_int {
        // A byte can outlive its event: a `forget` that dropped the event
        // after this reader took its byte. Such a byte is passed over.
        // Bounded: each turn takes a byte, and no more bytes are written
        // than events are queued.
        let mut raised = None;
        for _ in 0..=MAX_QUEUED_EVENTS {
            let mut byte = [0u8; 1];
            match rustix::net::recv(&self.reader, &mut byte, RecvFlags::empty()) {
                Ok((0, _)) => {
                    set_errno(libc::EIO);
                    return -1;
                }
                Ok(_) => {}
                Err(error) => {
                    set_errno(error.raw_os_error());
                    return -1;
                }
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
        *self.unacknowledged().entry(raised.element).or_default() += 1;
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

    /// `ibv_ack_async_event`: the program is done with an event it took.
    ///
    /// # Safety
    /// `event` is null or points at an event [`AsyncEvents::take`] wrote.
    pub(super) unsafe fn acknowledge(&self, event: *const ibv_async_event) {
        if event.is_null() {
            return;
        }
        // SAFETY: the caller's promise.
        let event = unsafe { event.read() };
        // SAFETY: the union's field as `take` wrote it for the event type.
        let element = unsafe {
            match event.event_type {
                IBV_EVENT_SRQ_LIMIT_REACHED => {
                    Element::SharedReceiveQueue(event.element.srq as usize)
                }
                _ => Element::CompletionQueue(event.element.cq as usize),
            }
        };
        let mut unacknowledged = self.unacknowledged();
        if let Some(count) = unacknowledged.get_mut(&element) {
            *count -= 1;
            if *count == 0 {
                unacknowledged.remove(&element);
            }
        }
    }

    /// Waits (bounded) until every event taken that names `element` is
    /// acknowledged; whether they are. A queue must not be freed while
    /// the program holds an event that names it.
    pub(super) fn acknowledged(&self, element: Element) -> bool {
        let started = Instant::now();
        loop {
            if !self.unacknowledged().contains_key(&element) {
                return true;
            }
            if started.elapsed() > UNACKNOWLEDGED_EVENTS_WAIT {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Drops the events not yet taken that name `element` (it is being
    /// destroyed): a program must not be handed a freed queue. Their bytes
    /// are taken back, so the descriptor is not left readable with no
    /// event.
    pub(super) fn forget(&self, element: Element) {
        let mut queued = self.queued();
        let before = queued.len();
        queued.retain(|raised| raised.element != element);
        let dropped = before - queued.len();
        drop(queued);
        for _ in 0..dropped {
            let mut byte = [0u8; 1];
            // Gone already if a reader took it first (and passes over it).
            let _ = rustix::net::recv(&self.reader, &mut byte, RecvFlags::DONTWAIT);
        }
    }

    fn queued(&self) -> std::sync::MutexGuard<'_, VecDeque<Raised>> {
        self.queued
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn unacknowledged(&self) -> std::sync::MutexGuard<'_, HashMap<Element, u32>> {
        self.unacknowledged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
