//! A soft RNIC as a simulator node: one port, plus the host's delayed
//! actions (receives posted late, to exercise RNR).

use remora_rnic::{QueuePair, ReceiveRequest, RnicConfig, SoftRnic, Timestamp, Verbs};
use remora_sim::{Node, PortId};

pub struct RnicNode {
    pub device: SoftRnic,
    config: RnicConfig,
    /// Receives the host posts at a set time, sorted by time.
    late_receives: Vec<(Timestamp, QueuePair, ReceiveRequest)>,
    /// Whether this node ever crashed: its completions and memory are gone.
    pub crashed_ever: bool,
    incarnation: u64,
}

impl RnicNode {
    pub fn new(config: RnicConfig) -> RnicNode {
        RnicNode {
            device: SoftRnic::new(config.clone()),
            config,
            late_receives: Vec::new(),
            crashed_ever: false,
            incarnation: 0,
        }
    }

    pub fn post_receive_at(
        &mut self,
        at: Timestamp,
        queue_pair: QueuePair,
        request: ReceiveRequest,
    ) {
        self.late_receives.push((at, queue_pair, request));
        self.late_receives.sort_by_key(|(at, _, _)| *at);
    }

    fn post_due_receives(&mut self, now: Timestamp) {
        let due = self
            .late_receives
            .iter()
            .take_while(|(at, _, _)| *at <= now)
            .count();
        for (_, queue_pair, request) in self.late_receives.drain(..due) {
            // The queue pair may be in error by now; that is the scenario's
            // business, not the host's.
            let _ = self.device.post_receive(queue_pair, request);
        }
    }
}

impl Node for RnicNode {
    fn handle_frame(&mut self, now: Timestamp, _port: PortId, frame: &[u8]) {
        self.device.handle_frame(now, frame);
    }

    fn poll_transmit(&mut self, now: Timestamp, buffer: &mut [u8]) -> Option<(PortId, usize)> {
        self.device
            .poll_transmit(now, buffer)
            .map(|len| (PortId(0), len))
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        let host = self.late_receives.first().map(|(at, _, _)| *at);
        [self.device.poll_timeout(), host]
            .into_iter()
            .flatten()
            .min()
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        self.post_due_receives(now);
        self.device.handle_timeout(now);
    }

    fn crash(&mut self, _now: Timestamp) {
        self.crashed_ever = true;
        self.late_receives.clear();
    }

    fn restart(&mut self, _now: Timestamp) {
        // A restarted host has a new device: no queue pairs, no regions.
        self.incarnation += 1;
        let mut config = self.config.clone();
        config.seed = config.seed.wrapping_add(self.incarnation << 32);
        self.device = SoftRnic::new(config);
    }
}
