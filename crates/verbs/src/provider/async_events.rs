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

use super::resources::UNACKNOWLEDGED_EVENTS_WAIT;
use super::set_errno;
use crate::abi::*;
use rustix::net::{RecvFlags, SendFlags};
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Events a context keeps for the program to take; past it, a new event
/// is dropped (and said once on stderr). A program that never reads its
/// events must not grow the process without bound; and each byte waits in
/// the socket buffer at the cost of its whole allocation (several hundred
/// bytes), so a few hundred is all the default send buffer holds.
const MAX_QUEUED_EVENTS: usize = 128;

/// What an event names: a completion queue's, a shared receive queue's or
/// a queue pair's `ibv_*` handle, as the program holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Element {
    CompletionQueue(usize),
    SharedReceiveQueue(usize),
    QueuePair(usize),
}

impl Element {
    /// What `event` names, by its type.
    ///
    /// # Safety
    /// `event` is one [`AsyncEvents::take`] wrote: its union's field is
    /// the one its type names.
    pub(super) unsafe fn of(event: &ibv_async_event) -> Element {
        // SAFETY: the caller's promise.
        unsafe {
            match event.event_type {
                IBV_EVENT_SRQ_LIMIT_REACHED => {
                    Element::SharedReceiveQueue(event.element.srq as usize)
                }
                IBV_EVENT_QP_LAST_WQE_REACHED => Element::QueuePair(event.element.qp as usize),
                _ => Element::CompletionQueue(event.element.cq as usize),
            }
        }
    }

    /// The context of the queue it names.
    ///
    /// # Safety
    /// The queue is live.
    pub(super) unsafe fn context(self) -> *mut ibv_context {
        // SAFETY: the caller's promise.
        unsafe {
            match self {
                Element::CompletionQueue(cq) => (*(cq as *mut ibv_cq)).context,
                Element::SharedReceiveQueue(srq) => (*(srq as *mut ibv_srq)).context,
                Element::QueuePair(qp) => (*(qp as *mut ibv_qp)).context,
            }
        }
    }
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
    /// Under one lock: an event leaves the queue and is counted as taken
    /// at once, so a destroy never finds it in neither place.
    state: Mutex<EventState>,
}

#[derive(Default)]
struct EventState {
    queued: VecDeque<Raised>,
    /// Events taken and not yet acknowledged, by what they name.
    unacknowledged: HashMap<Element, u32>,
    /// Queues being destroyed: nothing is raised for them.
    retired: Vec<Element>,
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
            state: Mutex::new(EventState::default()),
        })
    }

    /// The descriptor `async_fd` names.
    pub(super) fn descriptor(&self) -> RawFd {
        self.reader.as_raw_fd()
    }

    /// Queues `raised` and its byte: the byte after the event, so a
    /// reader that took a byte finds its event; both under the lock, so
    /// that a byte the socket refuses takes its event back with it (an
    /// event with no byte left the descriptor unreadable while it waited).
    pub(super) fn raise(&self, raised: Raised) {
        let mut state = self.state();
        if state.retired.contains(&raised.element) {
            return;
        }
        let sent = state.queued.len() < MAX_QUEUED_EVENTS && {
            state.queued.push_back(raised);
            let sent = rustix::net::send(&self.writer, &[1], SendFlags::DONTWAIT).is_ok();
            if !sent {
                state.queued.pop_back();
            }
            sent
        };
        drop(state);
        if !sent {
            super::report_once("asynchronous events are not being read; new ones are dropped");
        }
    }

    /// `ibv_get_async_event`: waits for an event (unless the program made
    /// the descriptor non-blocking: -1 with EAGAIN) and describes it in
    /// `event`.
    ///
    /// # Safety
    /// `event` points at an `ibv_async_event` the caller owns.
    pub(super) unsafe fn take(&self, event: *mut ibv_async_event) -> std::ffi::c_int {
        // A byte can outlive its event: a `retire` that dropped the event
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
            let mut state = self.state();
            raised = state.queued.pop_front();
            if let Some(taken) = raised {
                *state.unacknowledged.entry(taken.element).or_default() += 1;
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
            Element::QueuePair(qp) => ibv_async_event__bindgen_ty_1 {
                qp: qp as *mut ibv_qp,
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

    /// `ibv_ack_async_event`: the program is done with an event it took,
    /// which names `element`.
    pub(super) fn acknowledge(&self, element: Element) {
        let mut state = self.state();
        if let Some(count) = state.unacknowledged.get_mut(&element) {
            *count -= 1;
            if *count == 0 {
                state.unacknowledged.remove(&element);
            }
        }
    }

    /// Starts a queue's destroy: waits (bounded) until every event the
    /// program took that names `element` is acknowledged, then at once
    /// drops those not yet taken (their bytes taken back, so the
    /// descriptor is not left readable with no event) and raises none for
    /// it from then on. Whether it could: if not, nothing changed, and the
    /// destroy is refused (EBUSY). A destroy that then fails calls
    /// [`AsyncEvents::unretire`]; one that succeeds,
    /// [`AsyncEvents::retired`], once nothing raises events for it.
    pub(super) fn retire(&self, element: Element) -> bool {
        let started = Instant::now();
        loop {
            {
                let mut state = self.state();
                if !state.unacknowledged.contains_key(&element) {
                    let before = state.queued.len();
                    state.queued.retain(|raised| raised.element != element);
                    for _ in state.queued.len()..before {
                        let mut byte = [0u8; 1];
                        // A reader may hold it already (it passes over a
                        // byte with no event).
                        let _ = rustix::net::recv(&self.reader, &mut byte, RecvFlags::DONTWAIT);
                    }
                    state.retired.push(element);
                    return true;
                }
            }
            if started.elapsed() > UNACKNOWLEDGED_EVENTS_WAIT {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A destroy begun with [`AsyncEvents::retire`] failed: the queue
    /// lives on, and its events are raised again.
    pub(super) fn unretire(&self, element: Element) {
        self.state().retired.retain(|retired| *retired != element);
    }

    /// A destroy begun with [`AsyncEvents::retire`] finished: nothing
    /// raises events for the queue any more, and its address may name a
    /// new queue.
    pub(super) fn retired(&self, element: Element) {
        self.unretire(element);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, EventState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
