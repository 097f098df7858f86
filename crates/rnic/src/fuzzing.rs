//! The harness behind the `rnic_frames` fuzz target, here so that inputs
//! the fuzzer finds can be replayed as ordinary regression tests.
//!
//! Frames are built from fuzzer bytes with valid ICRCs, so they reach the
//! queue-pair state machines instead of dying at the checksum, and are
//! fired at both sides of a connected queue pair that has work in flight.

use crate::back_to_back::{BackToBack, RunSummary};
use crate::*;
use remora_wire::*;

/// Reads fuzzer bytes as header fields.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let (first, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        *first
    }

    fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    fn u64(&mut self) -> u64 {
        (u64::from(self.u32()) << 32) | u64::from(self.u32())
    }
}

fn forged_frame(input: &mut Input, template: &FrameRepr, regions: &[MemoryRegion; 2]) -> Vec<u8> {
    let opcode = Opcode::ALL[usize::from(input.byte()) % Opcode::ALL.len()];
    let mut repr = *template;
    repr.bth = BthRepr::new(
        opcode,
        template.bth.destination_qp,
        template.bth.psn.add(u32::from(input.byte()) % 8),
    );
    repr.bth.ack_request = input.byte() & 1 == 1;
    let region = &regions[usize::from(input.byte() & 1)];
    // Mostly aim inside the real region, sometimes anywhere.
    let address = if input.byte() & 3 == 0 {
        VirtAddr(input.u64())
    } else {
        VirtAddr(region.address.0 + u64::from(input.u32() % 8192))
    };
    let rkey = if input.byte() & 3 == 0 {
        Rkey(input.u32())
    } else {
        region.rkey
    };
    let extension = &mut repr.extension;
    *extension = ExtensionHeaders::default();
    if opcode.has_reth() {
        extension.reth = Some(RethRepr {
            virtual_address: address,
            rkey,
            dma_length: input.u32() % 20_000,
        });
    }
    if opcode.has_aeth() {
        let syndrome =
            AckSyndrome::from_u8(input.byte()).unwrap_or(AckSyndrome::Ack { credit_count: 31 });
        extension.aeth = Some(AethRepr {
            syndrome,
            msn: Msn::new(input.u32()),
        });
    }
    if opcode.has_atomic_eth() {
        extension.atomic_eth = Some(AtomicEthRepr {
            virtual_address: address,
            rkey,
            swap_or_add: input.u64(),
            compare: input.u64(),
        });
    }
    if opcode.has_atomic_ack_eth() {
        extension.atomic_ack_eth = Some(AtomicAckEthRepr {
            original_data: input.u64(),
        });
    }
    if opcode.has_immediate() || opcode.has_invalidate() {
        extension.immediate = Some(ImmDtRepr {
            immediate: input.u32(),
        });
    }
    // Only opcodes that carry a payload get one: given one, the others
    // made emit_frame refuse the frame and this harness panic (found when
    // a property test first ran it on random input). The bytes are read
    // either way, so a seed means what it meant.
    let wanted_len = usize::from(input.byte()) * 17 % 4200;
    let payload_len = if opcode.carries_payload() {
        wanted_len
    } else {
        0
    };
    let payload = vec![input.byte(); payload_len];
    let mut buffer = vec![0u8; repr.frame_len(payload_len)];
    let written = emit_frame(&repr, &payload, &mut buffer).expect("buffer sized by frame_len");
    buffer.truncate(written);
    buffer
}

/// Builds a connected pair with a READ and two SENDs in flight, delivers
/// up to 16 forged frames decoded from `bytes`, then runs the fabric for at
/// most `max_steps`. The RNIC may NAK, drop or fail queue pairs, but the
/// fabric must settle.
pub fn run_forged_frames(bytes: &[u8], max_steps: u64) -> RunSummary {
    let mut fabric = BackToBack::new(1);
    let mut regions = Vec::new();
    let mut builders = Vec::new();
    for device in [&mut fabric.left, &mut fabric.right] {
        let pd = device.alloc_protection_domain().unwrap();
        regions.push(device.register_memory(pd, 8192, AccessFlags::ALL).unwrap());
        let cq = device.create_completion_queue(256).unwrap();
        let mut builder = QueuePairBuilder::new(pd, cq, cq);
        builder.path_mtu = Mtu::MTU_1024;
        builder.initial_psn = Some(Psn::new(100));
        // rnr_retry 7 retries forever, legitimately: a forged SEND that eats
        // the only receive would then leave the fabric busy for good.
        builder.rnr_retry = 6;
        builders.push(builder);
    }
    let (left_qp, right_qp) = fabric.connect(&builders[0], &builders[1]).unwrap();
    let regions = [regions[0], regions[1]];
    fabric
        .right
        .post_receive(
            right_qp,
            ReceiveRequest::new(1, &[regions[1].slice(0, 4096)]).unwrap(),
        )
        .unwrap();
    let read = SendRequest::new(
        1,
        SendOperation::Read {
            remote: regions[1].remote(0),
        },
        &[regions[0].slice(0, 3000)],
    )
    .unwrap();
    fabric.left.post_send(left_qp, read).unwrap();
    // Capture one real frame each way to learn the addressing.
    let mut templates = Vec::new();
    let mut buffer = vec![0u8; remora_wire::frame::MAX_FRAME_LEN];
    for device in [&mut fabric.left, &mut fabric.right] {
        let write = SendRequest::new(2, SendOperation::Send { immediate: None }, &[]).unwrap();
        let _ = device.post_send(
            QueuePair(if templates.is_empty() {
                left_qp.0
            } else {
                right_qp.0
            }),
            write,
        );
        if let Some(len) = device.poll_transmit(fabric.now, &mut buffer) {
            templates.push(parse_frame(&buffer[..len]).unwrap().repr);
        }
    }
    let mut input = Input(bytes);
    for _ in 0..16 {
        if input.0.is_empty() {
            break;
        }
        let toward_right = input.byte() & 1 == 0;
        let (template, target) = if toward_right {
            (templates[0], &mut fabric.right)
        } else {
            (templates[1], &mut fabric.left)
        };
        let bytes = forged_frame(&mut input, &template, &regions);
        target.handle_frame(fabric.now, &bytes);
    }
    fabric.run(max_steps)
}
