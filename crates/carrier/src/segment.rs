//! Rings and doorbells laid out in one mapping.
//!
//! The same layout serves threads in one process (an anonymous mapping) and
//! processes on one host (a memfd that children inherit), so in-process
//! and shared-memory carriers run the very same ring code.
//!
//! ```text
//! SegmentHeader | doorbells[doorbell_count] | ring descriptors
//!               | (RingHeader + depth slots) * ring_count
//! ```
//!
//! A [`RingPort`] is a pair of rings (one each way) plus the doorbell of
//! the peer that consumes what it sends. Every endpoint (a node, or the
//! switch for all its ports) sleeps on one doorbell of its own.

use crate::doorbell::{Doorbell, DoorbellRef};
use crate::ring::{Consumer, Producer, RawSlots, RingHeader, SLOT_LENGTH_PREFIX_BYTES};
use crate::wait::WaitSource;
use crate::{check_frame_length, CarrierError, Port, SendStatus, MAX_CARRIED_FRAME_BYTES};
use memmap2::MmapMut;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

const MAGIC: u64 = 0x5245_4d4f_5241_5347; // "REMORASG"
const LAYOUT_VERSION: u32 = 1;
const ALIGNMENT_BYTES: usize = 128;
/// Bounds what a segment may describe, so a corrupt header cannot make an
/// attaching process map or walk an absurd layout.
const MAX_RINGS: u32 = 1024;
const MAX_DOORBELLS: u32 = 512;
const MAX_RING_DEPTH: u32 = 1 << 16;

/// Slots hold the largest frame, rounded up to whole cache lines.
pub const SLOT_BYTES: usize = (SLOT_LENGTH_PREFIX_BYTES + MAX_CARRIED_FRAME_BYTES)
    .div_ceil(ALIGNMENT_BYTES)
    * ALIGNMENT_BYTES;

#[repr(C)]
struct SegmentHeader {
    magic: u64,
    version: u32,
    doorbell_count: u32,
    ring_count: u32,
    ring_depth: u32,
    slot_bytes: u64,
}

/// Which doorbell the consumer of a ring sleeps on.
#[repr(C)]
#[derive(Clone, Copy)]
struct RingDescriptor {
    consumer_doorbell: u32,
}

/// What a segment holds: how many endpoints (doorbells), and for each ring
/// which endpoint consumes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentPlan {
    pub doorbell_count: u32,
    pub ring_consumers: Vec<u32>,
    pub ring_depth: u32,
}

impl SegmentPlan {
    /// A star: endpoint 0 is the hub (the switch), endpoints `1..=spokes`
    /// the nodes. Ring `2i` carries spoke `i+1` → hub, ring `2i+1` hub →
    /// spoke `i+1`; see [`Segment::spoke_port`] and [`Segment::hub_port`].
    pub fn star(spokes: u32, ring_depth: u32) -> SegmentPlan {
        let ring_consumers = (1..=spokes).flat_map(|spoke| [0, spoke]).collect();
        SegmentPlan {
            doorbell_count: spokes + 1,
            ring_consumers,
            ring_depth,
        }
    }

    /// A star whose every ring is consumed by endpoint 0: one thread
    /// drives the hub and all the spokes (the embedded rack's fabric
    /// thread) and sleeps on one doorbell.
    pub fn star_one_waiter(spokes: u32, ring_depth: u32) -> SegmentPlan {
        SegmentPlan {
            doorbell_count: 1,
            ring_consumers: vec![0; 2 * spokes as usize],
            ring_depth,
        }
    }

    fn validate(&self) -> Result<(), CarrierError> {
        let fail = |message: String| Err(CarrierError::Segment(message));
        if !self.ring_depth.is_power_of_two() || self.ring_depth > MAX_RING_DEPTH {
            return fail(format!(
                "ring depth {} must be a power of two up to {MAX_RING_DEPTH}",
                self.ring_depth
            ));
        }
        if self.doorbell_count == 0 || self.doorbell_count > MAX_DOORBELLS {
            return fail(format!(
                "{} doorbells (1..={MAX_DOORBELLS})",
                self.doorbell_count
            ));
        }
        if self.ring_consumers.len() > MAX_RINGS as usize {
            return fail(format!(
                "{} rings (at most {MAX_RINGS})",
                self.ring_consumers.len()
            ));
        }
        if let Some(bad) = self
            .ring_consumers
            .iter()
            .find(|c| **c >= self.doorbell_count)
        {
            return fail(format!("a ring's consumer {bad} has no doorbell"));
        }
        Ok(())
    }
}

struct Layout {
    doorbells_offset: usize,
    descriptors_offset: usize,
    rings_offset: usize,
    ring_stride: usize,
    total_bytes: usize,
}

fn round_up(value: usize) -> usize {
    value.div_ceil(ALIGNMENT_BYTES) * ALIGNMENT_BYTES
}

impl Layout {
    fn of(doorbell_count: u32, ring_count: u32, ring_depth: u32) -> Layout {
        let doorbells_offset = round_up(std::mem::size_of::<SegmentHeader>());
        let descriptors_offset =
            round_up(doorbells_offset + doorbell_count as usize * std::mem::size_of::<Doorbell>());
        let rings_offset = round_up(
            descriptors_offset + ring_count as usize * std::mem::size_of::<RingDescriptor>(),
        );
        let ring_stride =
            round_up(std::mem::size_of::<RingHeader>()) + ring_depth as usize * SLOT_BYTES;
        Layout {
            doorbells_offset,
            descriptors_offset,
            rings_offset,
            ring_stride,
            total_bytes: rings_offset + ring_count as usize * ring_stride,
        }
    }
}

/// The mapping and which ring ends this process has handed out.
struct Mapping {
    map: MmapMut,
    /// Kept open so children can inherit it (memfd segments only).
    fd: Option<OwnedFd>,
    /// Bit `2r` is ring `r`'s producer, bit `2r+1` its consumer; each end
    /// may be taken once per process, which keeps the ring single-producer
    /// single-consumer on this side.
    taken: Mutex<Vec<bool>>,
}

/// A mapped segment. Cheap to clone; the mapping lives while any clone or
/// port does.
#[derive(Clone)]
pub struct Segment {
    mapping: Arc<Mapping>,
    /// Each ring's consumer doorbell, as validated.
    consumers: Arc<Vec<u32>>,
    doorbell_count: u32,
    ring_count: u32,
    ring_depth: u32,
}

impl Segment {
    /// An anonymous mapping: rings between threads of this process.
    pub fn anonymous(plan: &SegmentPlan) -> Result<Segment, CarrierError> {
        plan.validate()?;
        let layout = Layout::of(
            plan.doorbell_count,
            plan.ring_consumers.len() as u32,
            plan.ring_depth,
        );
        let map = MmapMut::map_anon(layout.total_bytes)
            .map_err(|error| CarrierError::io("mmap anonymous segment", error))?;
        Segment::initialise(map, None, plan)
    }

    /// A memfd mapping that child processes inherit: see
    /// [`Segment::inheritable_fd`] and [`Segment::attach`].
    pub fn shared(name: &str, plan: &SegmentPlan) -> Result<Segment, CarrierError> {
        plan.validate()?;
        let layout = Layout::of(
            plan.doorbell_count,
            plan.ring_consumers.len() as u32,
            plan.ring_depth,
        );
        let flags = rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING;
        let fd = rustix::fs::memfd_create(name, flags)
            .map_err(|error| CarrierError::io("memfd_create", error))?;
        rustix::fs::ftruncate(&fd, layout.total_bytes as u64)
            .map_err(|error| CarrierError::io("ftruncate memfd", error))?;
        // A peer process that shrank the segment would make every other
        // mapping of it fault: fix its size for good.
        let seals = rustix::fs::SealFlags::SHRINK
            | rustix::fs::SealFlags::GROW
            | rustix::fs::SealFlags::SEAL;
        rustix::fs::fcntl_add_seals(&fd, seals)
            .map_err(|error| CarrierError::io("seal memfd", error))?;
        let file = std::fs::File::from(fd);
        // SAFETY: the memfd is ours, sized above, and only ever accessed
        // through the ring protocol.
        let map = unsafe { MmapMut::map_mut(&file) }
            .map_err(|error| CarrierError::io("mmap memfd", error))?;
        Segment::initialise(map, Some(OwnedFd::from(file)), plan)
    }

    /// Maps a segment created by another process (an inherited
    /// descriptor) and checks its header and every ring's doorbell.
    pub fn attach(fd: OwnedFd) -> Result<Segment, CarrierError> {
        let fd_number = fd.as_raw_fd();
        // Sealed against resizing, or the peer that made it could shrink it
        // under this mapping and turn the next ring access into SIGBUS.
        let required = rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::GROW;
        let sealed = rustix::fs::fcntl_get_seals(&fd).is_ok_and(|seals| seals.contains(required));
        if !sealed {
            return Err(CarrierError::Segment(format!(
                "descriptor {fd_number} is not sealed against resizing"
            )));
        }
        let file = std::fs::File::from(fd);
        let length = file
            .metadata()
            .map_err(|error| CarrierError::io("stat inherited segment", error))?
            .len() as usize;
        if length < std::mem::size_of::<SegmentHeader>() {
            return Err(CarrierError::Segment(format!(
                "descriptor {fd_number} is too small to be a segment"
            )));
        }
        // SAFETY: as above; the header is validated before any other use.
        let map = unsafe { MmapMut::map_mut(&file) }
            .map_err(|error| CarrierError::io("mmap inherited segment", error))?;
        // One copy of the header, checked and then used: the fields live in
        // memory other processes can write, and a second read after the
        // check could size the rings past the mapping.
        // SAFETY: the mapping is at least a header long and page aligned,
        // and every bit pattern is a valid `SegmentHeader` (plain integers).
        let header = unsafe { std::ptr::read_volatile(map.as_ptr() as *const SegmentHeader) };
        let valid = header.magic == MAGIC
            && header.version == LAYOUT_VERSION
            && header.slot_bytes == SLOT_BYTES as u64
            && header.doorbell_count <= MAX_DOORBELLS
            && header.ring_count <= MAX_RINGS
            && header.ring_depth.is_power_of_two()
            && header.ring_depth <= MAX_RING_DEPTH;
        if !valid {
            return Err(CarrierError::Segment(format!(
                "descriptor {fd_number} is not a Remora segment of this version"
            )));
        }
        let layout = Layout::of(header.doorbell_count, header.ring_count, header.ring_depth);
        if layout.total_bytes > length {
            return Err(CarrierError::Segment(
                "segment is shorter than its header says".into(),
            ));
        }
        let (doorbell_count, ring_count, ring_depth) =
            (header.doorbell_count, header.ring_count, header.ring_depth);
        let segment = Segment::wrap(
            map,
            Some(OwnedFd::from(file)),
            doorbell_count,
            ring_count,
            ring_depth,
        );
        for ring in 0..ring_count {
            if segment.consumer_of(ring) >= doorbell_count {
                return Err(CarrierError::Segment(format!(
                    "ring {ring} names a missing doorbell"
                )));
            }
        }
        Ok(segment)
    }

    fn initialise(
        mut map: MmapMut,
        fd: Option<OwnedFd>,
        plan: &SegmentPlan,
    ) -> Result<Segment, CarrierError> {
        let ring_count = plan.ring_consumers.len() as u32;
        let layout = Layout::of(plan.doorbell_count, ring_count, plan.ring_depth);
        let base = map.as_mut_ptr();
        // SAFETY: the mapping is `layout.total_bytes` long, zeroed, and
        // every offset below is within it and suitably aligned.
        unsafe {
            (base as *mut SegmentHeader).write(SegmentHeader {
                magic: MAGIC,
                version: LAYOUT_VERSION,
                doorbell_count: plan.doorbell_count,
                ring_count,
                ring_depth: plan.ring_depth,
                slot_bytes: SLOT_BYTES as u64,
            });
            for index in 0..plan.doorbell_count as usize {
                let at = base.add(layout.doorbells_offset) as *mut Doorbell;
                at.add(index).write(Doorbell::new());
            }
            for (index, consumer) in plan.ring_consumers.iter().enumerate() {
                let at = base.add(layout.descriptors_offset) as *mut RingDescriptor;
                at.add(index).write(RingDescriptor {
                    consumer_doorbell: *consumer,
                });
                let ring = base.add(layout.rings_offset + index * layout.ring_stride);
                (ring as *mut RingHeader).write(RingHeader::new());
            }
        }
        Ok(Segment::wrap(
            map,
            fd,
            plan.doorbell_count,
            ring_count,
            plan.ring_depth,
        ))
    }

    fn wrap(
        map: MmapMut,
        fd: Option<OwnedFd>,
        doorbell_count: u32,
        ring_count: u32,
        ring_depth: u32,
    ) -> Segment {
        // Each ring's consumer is read once, here: a peer process may write
        // the shared copy later, and what was validated must not change.
        let descriptors_offset =
            Layout::of(doorbell_count, ring_count, ring_depth).descriptors_offset;
        let consumers = (0..ring_count as usize)
            .map(|ring| {
                // SAFETY: the caller checked the mapping holds the layout.
                unsafe {
                    let at = map.as_ptr().add(descriptors_offset) as *const RingDescriptor;
                    (*at.add(ring)).consumer_doorbell
                }
            })
            .collect();
        Segment {
            mapping: Arc::new(Mapping {
                map,
                fd,
                taken: Mutex::new(vec![false; 2 * ring_count as usize]),
            }),
            consumers: Arc::new(consumers),
            doorbell_count,
            ring_count,
            ring_depth,
        }
    }

    fn layout(&self) -> Layout {
        Layout::of(self.doorbell_count, self.ring_count, self.ring_depth)
    }

    fn base(&self) -> *mut u8 {
        self.mapping.map.as_ptr() as *mut u8
    }

    /// The doorbell that ring `ring`'s consumer sleeps on.
    fn consumer_of(&self, ring: u32) -> u32 {
        self.consumers[ring as usize]
    }

    /// The doorbell of endpoint `index`.
    pub fn doorbell(&self, index: u32) -> DoorbellRef {
        assert!(index < self.doorbell_count, "no doorbell {index}");
        // SAFETY: in bounds; doorbells were initialised before any handle
        // was made, and the Arc keeps the mapping alive.
        let pointer = unsafe {
            (self.base().add(self.layout().doorbells_offset) as *const Doorbell).add(index as usize)
        };
        // SAFETY: `pointer` is an initialised doorbell inside the
        // mapping, which the handle keeps alive.
        unsafe { DoorbellRef::new(Arc::clone(&self.mapping) as Arc<dyn Send + Sync>, pointer) }
    }

    /// The memfd behind a shared segment, to hand to a child process
    /// (which must clear close-on-exec on its own copy; see the rack's
    /// launcher).
    pub fn shared_fd(&self) -> Result<BorrowedFd<'_>, CarrierError> {
        self.mapping
            .fd
            .as_ref()
            .map(|fd| fd.as_fd())
            .ok_or_else(|| CarrierError::Segment("an anonymous segment cannot be shared".into()))
    }

    fn take(&self, bit: usize) -> Result<(), CarrierError> {
        let mut taken = self
            .mapping
            .taken
            .lock()
            .expect("segment bookkeeping poisoned");
        if taken[bit] {
            return Err(CarrierError::Segment(format!(
                "ring {} {} end is already in use in this process",
                bit / 2,
                if bit.is_multiple_of(2) {
                    "producer"
                } else {
                    "consumer"
                }
            )));
        }
        taken[bit] = true;
        Ok(())
    }

    /// Frees a ring end [`Segment::take`] took for a port never made.
    fn give_back(&self, bit: usize) {
        let mut taken = self
            .mapping
            .taken
            .lock()
            .expect("segment bookkeeping poisoned");
        debug_assert!(taken[bit], "a ring end given back untaken");
        taken[bit] = false;
    }

    fn ring_parts(&self, ring: u32) -> (&'static RingHeader, RawSlots) {
        assert!(ring < self.ring_count, "no ring {ring}");
        let layout = self.layout();
        // SAFETY: in bounds by the layout. The 'static lifetime is confined
        // to RingPort, which holds the mapping's Arc for as long as it
        // keeps these references.
        unsafe {
            let at = self
                .base()
                .add(layout.rings_offset + ring as usize * layout.ring_stride);
            let header = &*(at as *const RingHeader);
            let slots = RawSlots::new(
                at.add(round_up(std::mem::size_of::<RingHeader>())),
                SLOT_BYTES,
                self.ring_depth as usize,
            );
            (header, slots)
        }
    }

    /// A port that sends on `send_ring` and receives on `receive_ring`; it
    /// sleeps on the doorbell of the receive ring's consumer.
    pub fn port(&self, send_ring: u32, receive_ring: u32) -> Result<RingPort, CarrierError> {
        if let Some(missing) = [send_ring, receive_ring]
            .into_iter()
            .find(|ring| *ring >= self.ring_count)
        {
            return Err(CarrierError::Segment(format!(
                "the segment has {} rings; there is no ring {missing}",
                self.ring_count
            )));
        }
        self.take(2 * send_ring as usize)?;
        if let Err(error) = self.take(2 * receive_ring as usize + 1) {
            // Refused whole: the send end is free again for a later port.
            self.give_back(2 * send_ring as usize);
            return Err(error);
        }
        let (send_header, send_slots) = self.ring_parts(send_ring);
        let (receive_header, receive_slots) = self.ring_parts(receive_ring);
        // SAFETY: `take` made these the only producer and consumer of their
        // rings in this process; the plan gives each end to one endpoint.
        let (producer, consumer) = unsafe {
            (
                Producer::new(send_header, send_slots),
                Consumer::new(receive_header, receive_slots),
            )
        };
        Ok(RingPort {
            producer,
            consumer,
            peer_doorbell: self.doorbell(self.consumer_of(send_ring)),
            own_doorbell: self.doorbell(self.consumer_of(receive_ring)),
            _mapping: Arc::clone(&self.mapping),
        })
    }

    /// Spoke `spoke` (1-based) of a [`SegmentPlan::star`]: a node's port.
    pub fn spoke_port(&self, spoke: u32) -> Result<RingPort, CarrierError> {
        check_spoke(spoke)?;
        self.port(2 * (spoke - 1), 2 * (spoke - 1) + 1)
    }

    /// The hub's port towards spoke `spoke` of a [`SegmentPlan::star`].
    pub fn hub_port(&self, spoke: u32) -> Result<RingPort, CarrierError> {
        check_spoke(spoke)?;
        self.port(2 * (spoke - 1) + 1, 2 * (spoke - 1))
    }
}

fn check_spoke(spoke: u32) -> Result<(), CarrierError> {
    if spoke == 0 || spoke > MAX_RINGS / 2 {
        return Err(CarrierError::Segment(format!(
            "spokes are numbered from 1; there is no spoke {spoke}"
        )));
    }
    Ok(())
}

/// One endpoint's port on a pair of rings.
pub struct RingPort {
    // Fields drop in order: the ring ends before the mapping they point into.
    producer: Producer<'static, RawSlots>,
    consumer: Consumer<'static, RawSlots>,
    peer_doorbell: DoorbellRef,
    own_doorbell: DoorbellRef,
    _mapping: Arc<Mapping>,
}

impl Port for RingPort {
    fn receive(
        &mut self,
        max_frames: usize,
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, CarrierError> {
        self.consumer
            .consume(max_frames, sink)
            .map_err(|corrupt| CarrierError::Segment(corrupt.to_string()))
    }

    fn send(&mut self, frame: &[u8]) -> Result<SendStatus, CarrierError> {
        check_frame_length(frame, MAX_CARRIED_FRAME_BYTES)?;
        if self.producer.push(frame) {
            Ok(SendStatus::Queued)
        } else {
            Ok(SendStatus::DroppedNoRoom)
        }
    }

    fn flush(&mut self) -> Result<(), CarrierError> {
        if self.producer.publish() {
            self.peer_doorbell.ring();
        }
        Ok(())
    }

    fn has_room(&mut self) -> bool {
        self.producer.has_room()
    }

    fn has_frames(&mut self) -> bool {
        self.consumer.has_frames()
    }

    fn wait_source(&self) -> WaitSource {
        WaitSource::Doorbell(self.own_doorbell.clone())
    }
}
