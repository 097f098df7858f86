//! The agent trait: one shape for every sans-IO host program.

use remora_base::Timestamp;
use remora_rnic::{Verbs, VerbsError};
use std::any::Any;
use std::error::Error;

/// What one turn of an agent did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Progress {
    /// Nothing changed: no verb posted, no completion taken.
    Idle,
    /// Something moved; a driver that sleeps should kick the NIC.
    Moved,
}

impl Progress {
    pub fn moved(self) -> bool {
        self == Progress::Moved
    }

    /// `Moved` when either turn moved.
    pub fn or(self, other: Progress) -> Progress {
        if self.moved() || other.moved() {
            Progress::Moved
        } else {
            Progress::Idle
        }
    }

    pub fn from_moved(moved: bool) -> Progress {
        if moved {
            Progress::Moved
        } else {
            Progress::Idle
        }
    }
}

/// Why an agent stopped. A system's own error travels inside
/// [`AgentError::System`], so a test can downcast it and match on which
/// check failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    #[error("{agent}: {source}")]
    System {
        agent: &'static str,
        source: Box<dyn Error + Send + Sync>,
    },
}

impl AgentError {
    /// Wraps a system's typed error.
    pub fn system(agent: &'static str, source: impl Error + Send + Sync + 'static) -> AgentError {
        AgentError::System {
            agent,
            source: Box::new(source),
        }
    }

    /// The system's error, when it is of type `E`.
    pub fn downcast_ref<E: Error + 'static>(&self) -> Option<&E> {
        match self {
            AgentError::System { source, .. } => source.downcast_ref::<E>(),
            AgentError::Verbs(error) => (error as &dyn Error).downcast_ref::<E>(),
        }
    }
}

/// A host program as a sans-IO state machine.
///
/// Agents take the NIC as `&mut dyn Verbs` rather than being generic over
/// it: a host holds agents of different systems side by side in one list
/// (`Box<dyn Agent>`), which a generic method would forbid, and one
/// indirect call per verb is noise beside the verb's own work (a frame
/// built, an ICRC computed).
pub trait Agent: AsAny + Send {
    /// A short name for reports, traces and errors.
    fn name(&self) -> &'static str;

    /// Takes completions and posts what is due at `now`.
    fn poll(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError>;

    /// When the agent next wants a turn without any frame arriving (a
    /// probe, a retry, a deadline). `None`: only when something arrives.
    fn poll_timeout(&self) -> Option<Timestamp>;

    /// Whether frames reaching the host's NIC may give this agent work
    /// (completions to take). An agent whose work comes only from its
    /// timer (a control-plane service) says false, and is then polled
    /// only when its timer is due: the fabric thread does not pay for it
    /// on every turn.
    fn woken_by_frames(&self) -> bool {
        true
    }

    /// The host went down: drop everything volatile. The NIC is gone with
    /// it (queue pairs, keys); what the agent keeps must be what its
    /// system declares durable.
    fn crash(&mut self);

    /// The host is back with a fresh NIC: rebuild from durable state.
    fn restart(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<(), AgentError>;
}

/// A boxed agent is an agent: a harness that holds `Box<dyn Agent>` can
/// put it wherever an agent goes (behind the embedded rack's lock, say).
impl<A: Agent + ?Sized> Agent for Box<A> {
    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn poll(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        (**self).poll(now, nic)
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        (**self).poll_timeout()
    }

    fn woken_by_frames(&self) -> bool {
        (**self).woken_by_frames()
    }

    fn crash(&mut self) {
        (**self).crash()
    }

    fn restart(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<(), AgentError> {
        (**self).restart(now, nic)
    }
}

/// Lets a harness reach its own agent's concrete type inside a host
/// (`Host::agent_as`), for the checks at the end of a run.
pub trait AsAny: Any {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: Any> AsAny for T {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
