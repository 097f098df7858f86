//! What a switch program is: Rust code over the pipeline API.
//!
//! A program owns its tables and registers, each placed in a stage, and
//! applies them in stage order in [`Program::ingress`]. The runtime does
//! the parsing before and the deparsing, recirculation, mirroring and
//! digest delivery after. Control-plane updates are plain methods on the
//! program (tables are typed), called between packets, for example in
//! answer to a digest.

pub use crate::packet::Digest;
use crate::packet::Packet;
use crate::resources::ResourceReport;
use remora_base::Timestamp;

pub trait Program: Send {
    fn name(&self) -> &str;

    /// Runs the match-action stages over one packet. Time comes in as an
    /// argument, as everywhere in Remora.
    fn ingress(&mut self, now: Timestamp, packet: &mut Packet);

    /// The resources the program's tables and registers use.
    fn resources(&self) -> ResourceReport;

    /// The control plane's answer to a digest, applied between packets
    /// (for example, learning a host). Programs without digests ignore it.
    fn control_plane(&mut self, _digest: &Digest) {}

    /// A frame the program's control plane sends back into the pipeline
    /// (a P4 switch's packet-out): frames it held and now releases, such
    /// as calls held for a failed node and replayed to its replacement.
    /// The runtime takes them after each frame and timeout; they enter
    /// from the generator port and count as generated.
    fn poll_packet_out(&mut self) -> Option<Vec<u8>> {
        None
    }

    /// Whether [`poll_packet_out`](Self::poll_packet_out) has a frame, so
    /// that the runtime's timer fires now rather than at the next frame.
    fn has_packet_out(&self) -> bool {
        false
    }
}
