//! Regression: a simulated rack whose next wakeup was more than one look
//! (100 µs) away, with no frame in flight, never got there: `run_until`
//! advanced time only when the simulation had quiesced, so a rack waiting
//! out a crash with only far timers left spun forever at one instant
//! (found by Bifröst's failover scenario).

use remora_base::Timestamp;
use remora_host::{Agent, AgentError, Progress};
use remora_rack::scenario::{Rack, RackStage, SimulatedStage};
use remora_rack::topology::{Topology, COMPUTE_HOST};
use remora_rnic::Verbs;
use std::time::Duration;

/// Wants a turn every millisecond, and counts its turns.
struct Ticker {
    next: Timestamp,
    turns: u64,
}

impl Agent for Ticker {
    fn name(&self) -> &'static str {
        "ticker"
    }

    fn poll(&mut self, now: Timestamp, _nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        if now >= self.next {
            self.turns += 1;
            self.next = now.saturating_add(Duration::from_millis(1));
        }
        Ok(Progress::Idle)
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        Some(self.next)
    }

    fn crash(&mut self) {}

    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Ok(())
    }
}

#[test]
fn a_rack_whose_next_timer_is_more_than_a_look_away_still_gets_there() {
    let topology = Topology::compute_and_memory();
    let mut stage = SimulatedStage::new(1, &topology, 1);
    stage.add_agent(
        COMPUTE_HOST,
        Box::new(Ticker {
            next: Timestamp::ZERO,
            turns: 0,
        }),
    );
    let mut rack = stage.start(topology.forwarding()).unwrap();
    rack.run_for(Duration::from_millis(10)).unwrap();
    let turns = rack
        .with_agent::<Ticker, _>(COMPUTE_HOST, 0, |ticker| ticker.turns)
        .unwrap();
    assert!((10..=11).contains(&turns), "{turns} turns in 10 ms");
}

/// Due again at the very instant it is handled, for ever.
struct Stuck;

impl Agent for Stuck {
    fn name(&self) -> &'static str {
        "stuck"
    }

    fn poll(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        Ok(Progress::Idle)
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        Some(Timestamp::ZERO)
    }

    fn crash(&mut self) {}

    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Ok(())
    }
}

/// An agent whose timer was due at the instant it was handled spent each
/// look's events without moving time, and `run_until` looped for ever.
#[test]
fn a_rack_stuck_at_one_instant_is_an_error_not_a_hang() {
    let topology = Topology::compute_and_memory();
    let mut stage = SimulatedStage::new(1, &topology, 1);
    stage.add_agent(COMPUTE_HOST, Box::new(Stuck));
    let mut rack = stage.start(topology.forwarding()).unwrap();
    let error = rack.run_for(Duration::from_millis(10)).unwrap_err();
    assert!(
        matches!(error, remora_rack::RackError::Livelock { at_ns: 0, .. }),
        "{error}"
    );
}
