//! The harnesses of the `cowbird_engine` and `cowbird_p4` fuzz targets,
//! kept in the crate so findings replay as tests: a hostile compute node
//! writes arbitrary bytes into its block (tail words and metadata
//! entries), and the Spot engine, over two real soft RNICs, must refuse or
//! serve them without a panic and without touching memory outside the
//! pool and the block; hostile hosts answer Cowbird-P4 with arbitrary
//! well-formed frames, and the switch must stay up.

use crate::deploy::{deploy, CowbirdSpec};
use crate::layout::RingSizes;
use crate::spot::SpotConfig;
use remora_rnic::back_to_back::BackToBack;
use std::time::Duration;

const POOL_BYTES: u64 = 4096;
/// Engine turns per input: enough for several batches.
const TURNS: usize = 64;

/// Runs the engine against a block holding `bytes` (from offset 0).
/// Returns how many engine turns ran before it stopped, or refused the
/// instance (stopped serving it alone).
pub fn hostile_block(bytes: &[u8]) -> usize {
    hostile_run(bytes).turns
}

/// One client thread with small rings, over one small pool region.
fn one_instance(spot: SpotConfig) -> CowbirdSpec {
    CowbirdSpec {
        threads: 1,
        sizes: RingSizes {
            metadata_entries: 8,
            request_data_bytes: 4096,
            response_data_bytes: 4096,
        },
        pool_regions: vec![POOL_BYTES],
        spot,
        ack_timeout: Duration::from_micros(100),
        direct: None,
        rpc: None,
    }
}

/// How a run against a hostile block ended. (The fuzz target counts the
/// turns; the tests look at why it stopped.)
#[cfg_attr(not(test), allow(dead_code))]
struct HostileOutcome {
    turns: usize,
    /// The engine's own error, which stops every instance.
    engine_error: Option<crate::spot::SpotError>,
    failures: Vec<crate::spot::InstanceFailure>,
}

fn hostile_run(bytes: &[u8]) -> HostileOutcome {
    let mut fabric = BackToBack::new(7);
    let spec = one_instance(SpotConfig {
        batch_entries: 4,
        ..SpotConfig::DEFAULT
    });
    let mut deployment =
        deploy(spec, &mut fabric.left, &mut fabric.right).expect("a fixed deployment works");
    let block = deployment.clients[0].block();
    let length = bytes.len().min(block.len());
    block.write(0, &bytes[..length]).expect("within the block");
    for turn in 0..TURNS {
        let now = fabric.now;
        let turned = deployment.engine.turn(now, &mut fabric.right);
        if turned.is_err() || !deployment.engine.failures().is_empty() {
            return HostileOutcome {
                turns: turn,
                engine_error: turned.err(),
                failures: deployment.engine.failures().to_vec(),
            };
        }
        fabric.run(1_000);
        fabric.now = fabric.now.saturating_add(Duration::from_micros(5));
    }
    HostileOutcome {
        turns: TURNS,
        engine_error: None,
        failures: Vec::new(),
    }
}

/// The harness of the `cowbird_p4` fuzz target's first half: hostile
/// hosts answer Cowbird-P4. Each chunk of `bytes` becomes one well-formed
/// RoCEv2 frame (valid ICRC) to one of the switch's impersonated queue
/// pairs, with a fuzzer-chosen opcode, PSN near the window, syndrome and
/// payload, between generator ticks. The engine must drop, count or act
/// on each without a panic, and everything it emits must be a valid frame.
/// Returns how many frames the switch sent.
/// The switch running Cowbird-P4 with one instance between hosts 1
/// (compute, port 0) and 2 (memory, port 1), its probe template armed;
/// with the switch-side queue pair numbers (compute's, memory's).
fn p4_switch_with_one_instance() -> (
    remora_switch::Switch<crate::p4::CowbirdP4>,
    remora_wire::Qpn,
    remora_wire::Qpn,
) {
    use crate::p4::impersonated::Peer;
    use crate::p4::{InstanceSpec, P4Engine};
    use crate::simulated::{forwarding, p4_config};
    use remora_rack::topology::standard_host;
    use remora_rnic::{RemoteAddress, Timestamp};
    use remora_switch::{PortId, Switch, SwitchConfig};
    use remora_wire::{Psn, Qpn, Rkey, VirtAddr};
    let mac = |index: u8| standard_host(usize::from(index) - 1).0;
    let ip = |index: u8| standard_host(usize::from(index) - 1).1;
    let mut program = P4Engine::with_forwarding(p4_config(), forwarding());
    let peer = |index: u8, port: u16| Peer {
        port: PortId(port),
        mac: mac(index),
        address: ip(index),
        qpn: Qpn::new(0x11).expect("24 bits"),
        initial_psn: Psn::new(0),
    };
    let remote = RemoteAddress {
        address: VirtAddr(0x1000),
        rkey: Rkey(0x42),
    };
    let (compute_qpn, memory_qpn) = program
        .add_instance(InstanceSpec {
            compute: peer(1, 0),
            memory: peer(2, 1),
            block: remote,
            sizes: RingSizes {
                metadata_entries: 64,
                request_data_bytes: 4096,
                response_data_bytes: 4096,
            },
            regions: vec![remote],
        })
        .expect("one instance fits");
    let template = program.probe_template();
    let mut switch = Switch::new(SwitchConfig::new(2), program);
    switch
        .add_template(template, Timestamp::ZERO)
        .expect("one template");
    (switch, compute_qpn, memory_qpn)
}

pub fn p4_hostile_answers(bytes: &[u8]) -> usize {
    use crate::simulated::p4_config;
    use remora_rack::topology::standard_host;
    let mac = |index: u8| standard_host(usize::from(index) - 1).0;
    let ip = |index: u8| standard_host(usize::from(index) - 1).1;
    use remora_rnic::Timestamp;
    use remora_switch::PortId;
    use remora_wire::frame::{emit_frame, FrameRepr, MAX_FRAME_LEN};
    use remora_wire::{
        AckSyndrome, AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, ImmDtRepr, Msn, Opcode,
        Psn, RethRepr, Rkey, RoceFrame, VirtAddr,
    };

    let config = p4_config();
    let (mut switch, compute_qpn, memory_qpn) = p4_switch_with_one_instance();
    let mut now = Timestamp::ZERO;
    let mut frame = vec![0u8; MAX_FRAME_LEN];
    let mut out = vec![0u8; MAX_FRAME_LEN];
    let mut sent = 0;
    for chunk in bytes.chunks(12) {
        let byte = |index: usize| chunk.get(index).copied().unwrap_or(0);
        now = now.saturating_add(Duration::from_micros(u64::from(byte(0) % 8)));
        switch.handle_timeout(now);
        let Some(opcode) = Opcode::from_u8(byte(1)) else {
            continue;
        };
        let to_memory = byte(2) & 1 == 1;
        let (host, port, qpn) = match to_memory {
            false => (1, 0, compute_qpn),
            true => (2, 1, memory_qpn),
        };
        let psn = Psn::new(u32::from(u16::from_le_bytes([byte(3), byte(4)])) % 512);
        let mut repr = FrameRepr::between(
            (mac(host), ip(host)),
            (config.mac, config.address),
            0xc000,
            BthRepr::new(opcode, qpn, psn),
        );
        let syndrome =
            AckSyndrome::from_u8(byte(5)).unwrap_or(AckSyndrome::Ack { credit_count: 0 });
        let extension = &mut repr.extension;
        extension.aeth = opcode.has_aeth().then_some(AethRepr {
            syndrome,
            msn: Msn::new(0),
        });
        extension.reth = opcode.has_reth().then_some(RethRepr {
            virtual_address: VirtAddr(0x1000),
            rkey: Rkey(0x42),
            dma_length: u32::from(byte(6)),
        });
        extension.atomic_eth = opcode.has_atomic_eth().then_some(AtomicEthRepr {
            virtual_address: VirtAddr(0x1000),
            rkey: Rkey(0x42),
            swap_or_add: 1,
            compare: 0,
        });
        extension.atomic_ack_eth = opcode
            .has_atomic_ack_eth()
            .then_some(AtomicAckEthRepr { original_data: 0 });
        extension.immediate = (opcode.has_immediate() || opcode.has_invalidate())
            .then_some(ImmDtRepr { immediate: 0 });
        // The payload: the chunk's tail, repeated to a fuzzer-chosen length
        // (an entry is 32 bytes, client words 16).
        let payload_len = usize::from(byte(7)) % 64;
        let seed = chunk
            .get(8..)
            .filter(|tail| !tail.is_empty())
            .unwrap_or(&[0xa5]);
        let payload: Vec<u8> = seed.iter().copied().cycle().take(payload_len).collect();
        let Ok(length) = emit_frame(&repr.with_payload_len(payload_len), &payload, &mut frame)
        else {
            continue;
        };
        switch.handle_frame(now, PortId(port), &frame[..length]);
        while let Some((_, length)) = switch.poll_transmit(now, &mut out) {
            assert!(
                RoceFrame::new_checked(&out[..length]).is_ok(),
                "the engine emitted a malformed frame"
            );
            sent += 1;
        }
    }
    sent
}

/// The harness of the `cowbird_p4` fuzz target's second half: a hostile
/// compute node writes `bytes` into its block and Cowbird-P4 (in the
/// simulator, with real soft RNICs) probes it. The instance must serve or
/// stop with a reason, never panic. Returns the reason it stopped, if it
/// did.
pub fn p4_hostile_block(bytes: &[u8]) -> Option<String> {
    use crate::deploy::{deploy_p4, SwitchPorts};
    use crate::p4::P4Engine;
    use crate::simulated::{forwarding, p4_config};
    use remora_rack::topology::standard_host;
    let mac = |index: u8| standard_host(usize::from(index) - 1).0;
    let ip = |index: u8| standard_host(usize::from(index) - 1).1;
    use remora_host::Host;
    use remora_rack::simulated::SimulatedRack;
    use remora_rnic::{RnicConfig, Timestamp};
    use remora_sim::{LinkConfig, PortId};

    let mut compute = Host::new("compute", RnicConfig::new(mac(1), ip(1), 7));
    let mut memory = Host::new("memory", RnicConfig::new(mac(2), ip(2), 8));
    let spec = CowbirdSpec {
        threads: 1,
        sizes: RingSizes {
            metadata_entries: 64,
            request_data_bytes: 4096,
            response_data_bytes: 4096,
        },
        pool_regions: vec![POOL_BYTES],
        spot: SpotConfig::DEFAULT,
        ack_timeout: Duration::from_micros(100),
        direct: None,
        rpc: None,
    };
    let mut program = P4Engine::with_forwarding(p4_config(), forwarding());
    let ports = SwitchPorts {
        compute: PortId(0),
        memory: PortId(1),
    };
    let deployment = deploy_p4(
        &spec,
        compute.nic_mut(),
        memory.nic_mut(),
        &mut program,
        ports,
    )
    .expect("a fixed deployment works");
    let block = deployment.clients[0].block();
    let length = bytes.len().min(block.len());
    block.write(0, &bytes[..length]).expect("within the block");
    let template = program.probe_template();
    let mut rack = SimulatedRack::new(9, program, vec![compute, memory], LinkConfig::rack());
    rack.switch_mut()
        .add_template(template, Timestamp::ZERO)
        .expect("one template");
    rack.simulation
        .run_until(Timestamp::from_nanos(300_000), 1_000_000);
    rack.program().failure(0).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Entry, Kind, ENTRY_BYTES, METADATA_RING_AT};

    #[test]
    fn p4_probes_an_empty_block_quietly() {
        assert_eq!(p4_hostile_block(&[]), None);
    }

    #[test]
    fn p4_stops_an_instance_whose_entries_make_no_sense() {
        let mut bytes = vec![0xa5u8; 512];
        bytes[0..8].copy_from_slice(&3u64.to_le_bytes());
        let reason = p4_hostile_block(&bytes).expect("garbage entries stop the instance");
        assert!(reason.contains("makes no sense"), "{reason}");
    }

    /// A host that answers nothing (a restarted NIC drops frames for a
    /// queue pair it no longer knows) kept the instance going back for
    /// ever, and it never said why its requests did not finish. It now
    /// fails, naming the silence, after a bounded number of go-backs.
    #[test]
    fn p4_fails_an_instance_whose_host_answers_nothing() {
        use remora_rnic::Timestamp;
        let (mut switch, _, _) = p4_switch_with_one_instance();
        let mut out = vec![0u8; remora_wire::frame::MAX_FRAME_LEN];
        let mut now = Timestamp::ZERO;
        // A second of virtual time in 20 µs steps, every frame lost.
        for _ in 0..50_000 {
            now = now.saturating_add(Duration::from_micros(20));
            switch.handle_timeout(now);
            while switch.poll_transmit(now, &mut out).is_some() {}
            if switch.program().overlay().failure(0).is_some() {
                break;
            }
        }
        let failure = switch.program().overlay().failure(0);
        assert!(
            failure.is_some_and(|reason| reason.contains("answered nothing")),
            "{failure:?}"
        );
    }

    type P4Switch = remora_switch::Switch<crate::p4::CowbirdP4>;

    /// The frames the switch sends now: each one's port, opcode and PSN.
    fn sent(switch: &mut P4Switch) -> Vec<(u16, remora_wire::Opcode, u32)> {
        use remora_rnic::Timestamp;
        let mut out = vec![0u8; remora_wire::frame::MAX_FRAME_LEN];
        let mut frames = Vec::new();
        while let Some((port, length)) = switch.poll_transmit(Timestamp::ZERO, &mut out) {
            let frame = remora_wire::RoceFrame::new_checked(&out[..length])
                .expect("the engine sends valid frames");
            frames.push((port.0, frame.opcode(), frame.bth().psn.value()));
        }
        frames
    }

    /// Host `host` on `port` answers the switch's queue pair `qpn` with a
    /// READ response packet of `payload` at `psn`; what the switch sends.
    fn answer(
        switch: &mut P4Switch,
        (host, port, qpn): (u8, u16, remora_wire::Qpn),
        opcode: remora_wire::Opcode,
        psn: u32,
        payload: &[u8],
    ) -> Vec<(u16, remora_wire::Opcode, u32)> {
        use crate::simulated::p4_config;
        use remora_rack::topology::standard_host;
        use remora_wire::frame::{emit_frame, FrameRepr, MAX_FRAME_LEN};
        use remora_wire::{AckSyndrome, AethRepr, BthRepr, Msn, Psn};
        let config = p4_config();
        let from = standard_host(usize::from(host) - 1);
        let mut repr = FrameRepr::between(
            from,
            (config.mac, config.address),
            0xc000,
            BthRepr::new(opcode, qpn, Psn::new(psn)),
        );
        repr.extension.aeth = opcode.has_aeth().then_some(AethRepr {
            syndrome: AckSyndrome::Ack { credit_count: 31 },
            msn: Msn::new(0),
        });
        let mut frame = vec![0u8; MAX_FRAME_LEN];
        let length = emit_frame(&repr.with_payload_len(payload.len()), payload, &mut frame)
            .expect("a valid answer");
        let now = remora_rnic::Timestamp::ZERO;
        switch.handle_frame(now, remora_switch::PortId(port), &frame[..length]);
        sent(switch)
    }

    /// A READ response packet shorter than the path MTU (a host of
    /// another MTU, or a hostile one) went on as a WRITE packet of its
    /// length: the message took more PSNs than its reservation, and a
    /// go-back's fillers, counted in MTUs from the bytes left, more
    /// still. A requester checks a response's length; the switch fails
    /// the instance, as the soft RNIC fails the READ.
    #[test]
    fn a_read_response_shorter_than_the_path_mtu_fails_its_instance() {
        use remora_wire::Opcode;
        let (mut switch, compute_qpn, memory_qpn) = p4_switch_with_one_instance();
        let (compute, memory) = ((1, 0, compute_qpn), (2, 1, memory_qpn));
        switch.handle_timeout(remora_rnic::Timestamp::ZERO);
        assert_eq!(
            sent(&mut switch),
            [(0, Opcode::RdmaReadRequest, 0)],
            "a probe"
        );
        let mut words = [0u8; 16];
        words[..8].copy_from_slice(&1u64.to_le_bytes());
        let only = Opcode::RdmaReadResponseOnly;
        assert_eq!(
            answer(&mut switch, compute, only, 0, &words),
            [(0, Opcode::RdmaReadRequest, 1)],
            "the metadata READ of entry 0"
        );
        let entry = Entry {
            kind: Kind::Read,
            region: 0,
            length: 4096,
            request_address: 0,
            response_address: 0,
            sequence: 1,
        };
        let mut raw = [0u8; ENTRY_BYTES as usize];
        entry.emit(&mut raw);
        assert_eq!(
            answer(&mut switch, compute, only, 1, &raw),
            [(1, Opcode::RdmaReadRequest, 0)],
            "the data READ, four packets at MTU 1024"
        );
        // The memory node answers in 256-byte packets.
        let first = Opcode::RdmaReadResponseFirst;
        let forwarded = answer(&mut switch, memory, first, 0, &[7; 256]);
        assert!(forwarded.is_empty(), "went on as {forwarded:?}");
        let failure = switch.program().overlay().failure(0);
        assert!(
            failure.is_some_and(|reason| reason.contains("256 bytes where 1024")),
            "{failure:?}"
        );
    }

    #[test]
    fn p4_survives_answers_of_every_opcode() {
        let mut bytes = Vec::new();
        for opcode in 0..=255u8 {
            for psn in [0u8, 1, 2, 200] {
                bytes.extend([
                    3,
                    opcode,
                    opcode & 1,
                    psn,
                    0,
                    opcode,
                    64,
                    16 + psn % 40,
                    1,
                    2,
                    3,
                    4,
                ]);
            }
        }
        // Generator ticks alone make the switch probe.
        assert!(p4_hostile_answers(&bytes) > 0);
    }

    #[test]
    fn an_empty_block_is_probed_quietly() {
        assert_eq!(hostile_block(&[]), TURNS);
    }

    /// The instance alone is refused: a run that stopped for the engine's
    /// own error (which stops every instance) passed these tests too
    /// (found by reading).
    fn assert_refused_alone(outcome: &HostileOutcome) {
        assert!(outcome.turns < TURNS, "never refused");
        assert!(outcome.engine_error.is_none(), "{:?}", outcome.engine_error);
        assert_eq!(outcome.failures.len(), 1, "{:?}", outcome.failures);
    }

    #[test]
    fn a_tail_far_ahead_with_garbage_entries_is_refused() {
        let mut bytes = vec![0xa5u8; 512];
        bytes[0..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_refused_alone(&hostile_run(&bytes));
    }

    /// A block whose ring holds one 64-byte READ of the pool at
    /// `pool_offset` into the block at `response_address`.
    fn block_with_one_read(pool_offset: u64, response_address: u64) -> Vec<u8> {
        let mut bytes = vec![0u8; 512];
        bytes[0..8].copy_from_slice(&1u64.to_le_bytes());
        let entry = Entry {
            kind: Kind::Read,
            region: 0,
            length: 64,
            request_address: pool_offset,
            response_address,
            sequence: 1,
        };
        let mut raw = [0u8; ENTRY_BYTES as usize];
        entry.emit(&mut raw);
        let at = METADATA_RING_AT as usize;
        bytes[at..at + raw.len()].copy_from_slice(&raw);
        bytes
    }

    /// A read whose response address lies near 2^64 saturated the remote
    /// address; the post's refusal was the engine's error and stopped
    /// every instance. It is that instance's alone now.
    #[test]
    fn an_entry_outside_its_block_stops_its_instance_alone() {
        let outcome = hostile_run(&block_with_one_read(0, u64::MAX - 8));
        assert!(outcome.engine_error.is_none(), "{:?}", outcome.engine_error);
        assert!(
            matches!(
                outcome.failures.first().map(|failure| &failure.error),
                Some(crate::spot::SpotError::OutsideBlock { .. })
            ),
            "{:?}",
            outcome.failures
        );
    }

    /// An idle instance's reconnections added up across separate outages
    /// (only a finished batch reset them), and the seventeenth failed it
    /// for good; the flag that lands a redone batch's writes first
    /// outlived a resume with nothing to redo, and reordered the next
    /// fresh batch. An empty probe clears both.
    #[test]
    fn an_empty_probe_ends_the_count_of_outages_and_the_redo() {
        let mut fabric = BackToBack::new(7);
        let spec = one_instance(SpotConfig::DEFAULT);
        let mut deployment = deploy(spec, &mut fabric.left, &mut fabric.right).unwrap();
        fn running(deployment: &mut crate::deploy::Deployment) -> &mut crate::spot::SpotEngine {
            deployment.engine.engine_mut().expect("running")
        }
        running(&mut deployment).after_outages(0, crate::spot::MAX_RECONNECTS_IN_A_ROW - 1);
        for _ in 0..8 {
            let now = fabric.now;
            deployment.engine.turn(now, &mut fabric.right).unwrap();
            fabric.run(1_000);
            fabric.now = fabric.now.saturating_add(Duration::from_micros(5));
        }
        assert!(deployment.engine.stats().empty_probes > 0);
        assert_eq!(running(&mut deployment).recovery_state(0), (0, false));
    }

    /// A payload READ that died with its queue pair may have placed some
    /// of a write's bytes (a torn payload) or all of them (answered, then
    /// flushed): the reconnection took the write out of the overlap
    /// guard, so another thread's read of the same bytes was served
    /// before the redo landed the write whole. It waits for the redo.
    #[test]
    fn a_dead_queue_pairs_write_stays_guarded_during_reconnection() {
        use remora_rnic::back_to_back::{Direction, Verdict};
        let mut fabric = BackToBack::new(7);
        let spec = CowbirdSpec {
            threads: 2,
            ..one_instance(SpotConfig::DEFAULT)
        };
        let mut deployment = deploy(spec, &mut fabric.left, &mut fabric.right).unwrap();
        deployment.clients[0]
            .async_write(0, 0, &[0xaa; 1024])
            .unwrap();
        // Every answer that carries the payload is lost, until the engine
        // gives the queue pair up.
        let mut lose_payloads = |direction, frame: &mut [u8]| match direction {
            Direction::LeftToRight if frame.len() > 1024 => Verdict::Drop,
            _ => Verdict::Deliver,
        };
        let mut turns = 0;
        while deployment.engine.stats().reconnects == 0 {
            turns += 1;
            assert!(turns < 10_000, "the engine never gave the queue pair up");
            spot_step(&mut deployment, &mut fabric, false, &mut lose_payloads);
        }
        // The compute node's connection service is not polled yet: the
        // first thread's instance stays reconnecting.
        deployment.clients[1].async_read(0, 0, 1024).unwrap();
        let mut deliver = |_, _: &mut [u8]| Verdict::Deliver;
        for _ in 0..16 {
            spot_step(&mut deployment, &mut fabric, false, &mut deliver);
        }
        assert_eq!(
            deployment.engine.stats().reads,
            0,
            "a read was served over the write of a dead queue pair"
        );
        assert!(deployment.engine.stats().stalls > 0);
        // Reconnected, the redo lands the write, and the read is served.
        for _ in 0..2_000 {
            spot_step(&mut deployment, &mut fabric, true, &mut deliver);
            if deployment.engine.stats().reads == 1 {
                break;
            }
        }
        assert_eq!(
            deployment.engine.stats().reads,
            1,
            "the read waited for ever"
        );
        let mut pool = vec![0u8; 1024];
        deployment.pool_memory[0].read(0, &mut pool).unwrap();
        assert!(
            pool.iter().all(|byte| *byte == 0xaa),
            "the write landed whole"
        );
    }

    /// A restarted engine whose compute node runs no connection service:
    /// the first instance's refused request failed the whole restart (the
    /// engine stayed down, its new queue pairs leaked), though a refusal
    /// is the instance's own error. The instances fail; the engine runs.
    #[test]
    fn a_restart_without_a_connection_service_fails_instances_not_the_engine() {
        use remora_host::Agent;
        let mut fabric = BackToBack::new(7);
        let spec = one_instance(SpotConfig::DEFAULT);
        let mut deployment = deploy(spec, &mut fabric.left, &mut fabric.right).unwrap();
        drop(deployment.connection_service);
        deployment.engine.crash();
        deployment
            .engine
            .restart(fabric.now, &mut fabric.right)
            .expect("the engine restarts");
        let failures = deployment.engine.failures();
        assert!(
            matches!(
                failures,
                [crate::spot::InstanceFailure {
                    instance: 0,
                    error: crate::spot::SpotError::Reconnect {
                        error: crate::connection::ConnectionError::NoService,
                        ..
                    },
                }]
            ),
            "{failures:?}"
        );
    }

    /// Contiguous read responses merge into one WRITE, without bound: a
    /// batch of them past the NIC's message limit was refused at its post,
    /// an engine error that stopped every instance. Runs are cut at
    /// `MAX_RESPONSE_WRITE_BYTES`, and every read still completes.
    #[test]
    fn contiguous_reads_past_the_largest_response_write_take_several() {
        const READS: u64 = 300;
        let mut fabric = BackToBack::new(7);
        let spec = CowbirdSpec {
            sizes: RingSizes {
                metadata_entries: 512,
                request_data_bytes: 4096,
                response_data_bytes: 2 << 20,
            },
            ..one_instance(SpotConfig {
                batch_entries: READS,
                ..SpotConfig::DEFAULT
            })
        };
        let mut deployment = deploy(spec, &mut fabric.left, &mut fabric.right).unwrap();
        for _ in 0..READS {
            deployment.clients[0].async_read(0, 0, 4096).unwrap();
        }
        for _ in 0..2_000 {
            if deployment.engine.stats().reads == READS && fabric.run(10_000).quiesced {
                break;
            }
            let now = fabric.now;
            deployment.engine.turn(now, &mut fabric.right).unwrap();
            fabric.run(10_000);
            fabric.now = fabric.now.saturating_add(Duration::from_micros(5));
        }
        assert!(deployment.engine.failures().is_empty());
        let stats = deployment.engine.stats();
        assert_eq!(stats.reads, READS);
        assert!(
            stats.response_writes >= 2,
            "1.2 MiB of responses went in {} WRITE(s)",
            stats.response_writes
        );
    }

    #[test]
    fn an_entry_outside_the_pool_is_refused() {
        let bytes = block_with_one_read(POOL_BYTES - 8, 1024);
        assert_refused_alone(&hostile_run(&bytes));
    }

    /// One engine turn, the fabric run through `filter`, and the clock 5 µs
    /// on; the compute node's connection service answers when `connect`.
    fn spot_step(
        deployment: &mut crate::deploy::Deployment,
        fabric: &mut BackToBack,
        connect: bool,
        filter: &mut impl FnMut(
            remora_rnic::back_to_back::Direction,
            &mut [u8],
        ) -> remora_rnic::back_to_back::Verdict,
    ) {
        use remora_host::Agent;
        let now = fabric.now;
        if connect {
            let _ = deployment
                .connection_service
                .poll(now, &mut fabric.left)
                .unwrap();
        }
        deployment.engine.turn(now, &mut fabric.right).unwrap();
        fabric.run_filtered(10_000, filter);
        fabric.now = fabric.now.saturating_add(Duration::from_micros(5));
    }

    /// Runs until `done` holds, for at most 4,000 steps.
    fn spot_steps_until(
        deployment: &mut crate::deploy::Deployment,
        fabric: &mut BackToBack,
        connect: bool,
        mut done: impl FnMut(&crate::deploy::Deployment) -> bool,
    ) {
        let mut deliver = |_, _: &mut [u8]| remora_rnic::back_to_back::Verdict::Deliver;
        for _ in 0..4_000 {
            if done(deployment) {
                return;
            }
            spot_step(deployment, fabric, connect, &mut deliver);
        }
        panic!("the run never got there");
    }

    /// Thread 1 reads 64 bytes at offset 0 and returns them.
    fn read_at_zero(deployment: &mut crate::deploy::Deployment, fabric: &mut BackToBack) -> u8 {
        let read = deployment.clients[1].async_read(0, 0, 64).unwrap();
        spot_steps_until(deployment, fabric, false, |deployment| {
            deployment.clients[1].is_complete(read)
        });
        let client = &mut deployment.clients[1];
        let group = client.poll_create().unwrap();
        client.poll_add(group, read).unwrap();
        let mut completions = Vec::new();
        assert_eq!(
            client
                .poll_wait(group, &mut completions, 1, Duration::ZERO)
                .unwrap(),
            1
        );
        let mut bytes = [0u8; 64];
        client.response(&completions[0], &mut bytes).unwrap();
        client.poll_destroy(group).unwrap();
        assert!(bytes.iter().all(|byte| *byte == bytes[0]), "a torn read");
        bytes[0]
    }

    /// Three threads on one engine where thread 0's write of 0xaa at
    /// offset 0 landed in a batch that never commits (its other write's
    /// payload is lost, and the queue pair given up), and thread 2's
    /// newer write of 0xbb there completed since; thread 1 read 0xaa,
    /// then 0xbb. Returns the deployment, the fabric, and thread 0's two
    /// writes.
    fn a_landed_write_under_a_newer_one() -> (
        crate::deploy::Deployment,
        BackToBack,
        [crate::layout::RequestId; 2],
    ) {
        use remora_rnic::back_to_back::{Direction, Verdict};
        let mut fabric = BackToBack::new(7);
        let spec = CowbirdSpec {
            threads: 3,
            ..one_instance(SpotConfig::DEFAULT)
        };
        let mut deployment = deploy(spec, &mut fabric.left, &mut fabric.right).unwrap();
        let first = deployment.clients[0]
            .async_write(0, 0, &[0xaa; 64])
            .unwrap();
        let stuck = deployment.clients[0]
            .async_write(0, 1024, &[0xcc; 2048])
            .unwrap();
        let mut lose_large_payloads = |direction, frame: &mut [u8]| match direction {
            Direction::LeftToRight if frame.len() > 1000 => Verdict::Drop,
            _ => Verdict::Deliver,
        };
        // Until the engine gives thread 0's queue pair up (its redo then
        // waits for a connection service no one runs yet).
        for _ in 0..4_000 {
            if deployment.engine.stats().reconnects > 0 {
                break;
            }
            spot_step(
                &mut deployment,
                &mut fabric,
                false,
                &mut lose_large_payloads,
            );
        }
        assert_eq!(deployment.engine.stats().reconnects, 1);
        assert!(!deployment.clients[0].is_complete(first));
        assert_eq!(read_at_zero(&mut deployment, &mut fabric), 0xaa);
        let newer = deployment.clients[2]
            .async_write(0, 0, &[0xbb; 64])
            .unwrap();
        spot_steps_until(&mut deployment, &mut fabric, false, |deployment| {
            deployment.clients[2].is_complete(newer)
        });
        assert_eq!(read_at_zero(&mut deployment, &mut fabric), 0xbb);
        (deployment, fabric, [first, stuck])
    }

    /// Restarts the engine, runs until thread 0's writes complete, and
    /// checks that offset 0 still holds the newer write.
    fn restart_and_check_the_newer_write_holds(
        deployment: &mut crate::deploy::Deployment,
        fabric: &mut BackToBack,
        [first, stuck]: [crate::layout::RequestId; 2],
    ) {
        use remora_host::Agent;
        deployment.engine.crash();
        deployment
            .engine
            .restart(fabric.now, &mut fabric.right)
            .expect("the engine restarts");
        spot_steps_until(deployment, fabric, true, |deployment| {
            deployment.clients[0].is_complete(stuck)
        });
        assert!(deployment.clients[0].is_complete(first));
        assert_eq!(
            read_at_zero(deployment, fabric),
            0xbb,
            "a landed write was landed again over a newer one"
        );
    }

    /// A write that landed in a batch whose progress never reached the
    /// compute node was landed again by the engine that restarted after
    /// its host crashed: over another thread's newer write, which had
    /// landed and completed since. Reads saw the first write, then the
    /// newer one, then the first again. The landed writes are recorded in
    /// memory that outlives the engine, as the pool does, and the
    /// restarted engine does not land them again.
    #[test]
    fn a_restarted_engine_does_not_land_a_write_again_over_a_newer_one() {
        let (mut deployment, mut fabric, writes) = a_landed_write_under_a_newer_one();
        restart_and_check_the_newer_write_holds(&mut deployment, &mut fabric, writes);
    }

    /// An instance that failed had its landed writes forgotten, as when
    /// the record lived and died with the engine; but a later restart
    /// serves every instance again, and its redo landed them again over
    /// newer ones. Here a restart with no connection service fails every
    /// instance, and the next one, with the service back, serves them.
    #[test]
    fn a_failed_instance_keeps_its_landed_writes_for_a_later_restart() {
        use remora_host::Agent;
        let (mut deployment, mut fabric, writes) = a_landed_write_under_a_newer_one();
        deployment.engine.crash();
        deployment.connection_service.set_served(false);
        deployment
            .engine
            .restart(fabric.now, &mut fabric.right)
            .expect("the engine restarts");
        assert_eq!(deployment.engine.failures().len(), 3);
        deployment.connection_service.set_served(true);
        restart_and_check_the_newer_write_holds(&mut deployment, &mut fabric, writes);
    }
}
