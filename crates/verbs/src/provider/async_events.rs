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
    /// Queues being destroyed: their events are set aside, not queued.
    retired: Vec<Element>,
    /// The events not yet taken of queues being destroyed, set aside in
    /// their order: a destroy that fails gives them back, one that
    /// succeeds drops them. Each destroy in progress sets aside at most
    /// `MAX_QUEUED_EVENTS`, as they were queued.
    set_aside: Vec<Raised>,
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
            // Set aside with the queue's unread events: a destroy then
            // refused gives it back (dropped, it was lost to a program
            // that went on using the queue), one that succeeds drops it.
            let aside = state
                .set_aside
                .iter()
                .filter(|kept| kept.element == raised.element)
                .count();
            if aside < MAX_QUEUED_EVENTS {
                state.set_aside.push(raised);
            }
            return;
        }
        let sent = self.queue_locked(&mut state, raised);
        drop(state);
        if !sent {
            super::report_once("asynchronous events are not being read; new ones are dropped");
        }
    }

    /// Queues `raised` and its byte under the state's lock; whether there
    /// was room.
    fn queue_locked(&self, state: &mut EventState, raised: Raised) -> bool {
        if state.queued.len() >= MAX_QUEUED_EVENTS {
            return false;
        }
        state.queued.push_back(raised);
        let sent = rustix::net::send(&self.writer, &[1], SendFlags::DONTWAIT).is_ok();
        if !sent {
            state.queued.pop_back();
        }
        sent
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
    /// sets aside those not yet taken (their bytes taken back, so the
    /// descriptor is not left readable with no event), as it does those
    /// raised for the queue from then on. Whether it could: if not, nothing changed, and the
    /// destroy is refused (EBUSY). A destroy that then fails calls
    /// [`AsyncEvents::unretire`], which gives the events set aside back;
    /// one that succeeds, [`AsyncEvents::retired`], once nothing raises
    /// events for it.
    pub(super) fn retire(&self, element: Element) -> bool {
        let started = Instant::now();
        loop {
            {
                let mut state = self.state();
                if !state.unacknowledged.contains_key(&element) {
                    let (named, others): (VecDeque<Raised>, VecDeque<Raised>) = state
                        .queued
                        .drain(..)
                        .partition(|raised| raised.element == element);
                    state.queued = others;
                    for _ in 0..named.len() {
                        let mut byte = [0u8; 1];
                        // A reader may hold it already (it passes over a
                        // byte with no event).
                        let _ = rustix::net::recv(&self.reader, &mut byte, RecvFlags::DONTWAIT);
                    }
                    state.set_aside.extend(named);
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
    /// lives on, its events are raised again, and those set aside wait
    /// again to be taken, behind the other queues' events queued meanwhile
    /// and ahead of any new one of its own (put back under the lock that
    /// raising takes), those raised while it was retired among them.
    /// Dropped, they were lost to a program whose destroy was refused and
    /// that went on using the queue.
    pub(super) fn unretire(&self, element: Element) {
        let mut state = self.state();
        state.retired.retain(|retired| *retired != element);
        let (named, others): (Vec<Raised>, Vec<Raised>) = state
            .set_aside
            .drain(..)
            .partition(|raised| raised.element == element);
        state.set_aside = others;
        let all_back = named
            .into_iter()
            .all(|raised| self.queue_locked(&mut state, raised));
        drop(state);
        if !all_back {
            super::report_once("asynchronous events are not being read; new ones are dropped");
        }
    }

    /// A destroy begun with [`AsyncEvents::retire`] finished: nothing
    /// raises events for the queue any more, its events set aside go,
    /// and its address may name a new queue.
    pub(super) fn retired(&self, element: Element) {
        let mut state = self.state();
        state.retired.retain(|retired| *retired != element);
        state.set_aside.retain(|raised| raised.element != element);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, EventState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUEUE: Element = Element::CompletionQueue(0x1000);
    const OTHER: Element = Element::CompletionQueue(0x2000);

    fn raised(element: Element) -> Raised {
        Raised {
            kind: IBV_EVENT_CQ_ERR,
            element,
        }
    }

    /// The element of the next event, taken without waiting; none if the
    /// descriptor has no byte.
    fn take_now(events: &AsyncEvents) -> Option<Element> {
        let mut byte = [0u8; 1];
        let peeked = rustix::net::recv(
            &events.reader,
            &mut byte,
            RecvFlags::DONTWAIT | RecvFlags::PEEK,
        );
        if peeked.is_err() {
            return None;
        }
        let mut event = std::mem::MaybeUninit::<ibv_async_event>::zeroed();
        // SAFETY: `event` is ours, and a byte waits, so this does not block.
        let taken = unsafe { events.take(event.as_mut_ptr()) };
        assert_eq!(taken, 0);
        // SAFETY: `take` wrote it.
        let event = unsafe { event.assume_init() };
        // SAFETY: `take` wrote it, with the field its type names.
        let element = unsafe { Element::of(&event) };
        events.acknowledge(element);
        Some(element)
    }

    /// A destroy refused after `retire` (the queue still had work, say)
    /// dropped the events not yet taken for the queue, which lived on:
    /// the program never saw them. They wait again now.
    #[test]
    fn a_refused_destroy_gives_the_queues_events_back() {
        let events = AsyncEvents::new().unwrap();
        events.raise(raised(QUEUE));
        events.raise(raised(OTHER));
        assert!(events.retire(QUEUE));
        events.raise(raised(QUEUE));
        events.unretire(QUEUE);
        assert_eq!(take_now(&events), Some(OTHER));
        assert_eq!(take_now(&events), Some(QUEUE), "the event set aside");
        assert_eq!(
            take_now(&events),
            Some(QUEUE),
            "the event raised while retired"
        );
        assert_eq!(take_now(&events), None);
    }

    #[test]
    fn a_finished_destroy_drops_the_queues_events() {
        let events = AsyncEvents::new().unwrap();
        events.raise(raised(QUEUE));
        assert!(events.retire(QUEUE));
        events.retired(QUEUE);
        assert_eq!(take_now(&events), None);
        events.unretire(QUEUE);
        assert_eq!(take_now(&events), None, "nothing left to give back");
    }
}
