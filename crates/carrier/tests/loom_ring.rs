//! The SPSC ring under `loom`, which explores every interleaving of the
//! producer and consumer (within its bounds) and sees every slot access,
//! so a missing acquire/release or a slot reused too early is a failure.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p remora-carrier --test loom_ring --release`
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use remora_carrier::ring::{Consumer, Producer, RingHeader, SlotStorage};

const SLOT_BYTES: usize = 12;

struct CellSlots(Arc<Vec<UnsafeCell<[u8; SLOT_BYTES]>>>);

// SAFETY: distinct indices are distinct cells; loom checks the accesses.
unsafe impl SlotStorage for CellSlots {
    fn slot_count(&self) -> usize {
        self.0.len()
    }

    fn slot_bytes(&self) -> usize {
        SLOT_BYTES
    }

    unsafe fn with_slot_mut<R>(&self, index: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
        // SAFETY: the cell's pointer is valid for the closure's call; the
        // ring protocol (which loom checks) gives this side the slot alone.
        self.0[index].with_mut(|slot| f(unsafe { &mut *slot }))
    }

    unsafe fn with_slot<R>(&self, index: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        // SAFETY: as above; the slot is published and not being written.
        self.0[index].with(|slot| f(unsafe { &*slot }))
    }
}

/// Sends `count` frames through a ring of `depth` slots, publishing in
/// batches of `batch`, and checks they arrive whole and in order.
fn check(depth: usize, count: u8, batch: u8) {
    loom::model(move || {
        let header: &'static RingHeader = Box::leak(Box::new(RingHeader::new()));
        let cells = Arc::new(
            (0..depth)
                .map(|_| UnsafeCell::new([0u8; SLOT_BYTES]))
                .collect::<Vec<_>>(),
        );
        let producer_cells = CellSlots(Arc::clone(&cells));
        let producer = loom::thread::spawn(move || {
            // SAFETY: the only producer of this ring.
            let mut producer = unsafe { Producer::new(header, producer_cells) };
            let mut next = 0u8;
            while next < count {
                let mut pushed = 0;
                while pushed < batch
                    && next < count
                    && producer.push(&[next; 3][..1 + usize::from(next % 3)])
                {
                    next += 1;
                    pushed += 1;
                }
                producer.publish();
                loom::thread::yield_now();
            }
        });
        // SAFETY: the only consumer of this ring.
        let mut consumer = unsafe { Consumer::new(header, CellSlots(cells)) };
        let mut expected = 0u8;
        while expected < count {
            consumer
                .consume(usize::MAX, &mut |frame| {
                    assert_eq!(frame, &[expected; 3][..1 + usize::from(expected % 3)]);
                    expected += 1;
                })
                .expect("ring intact");
            loom::thread::yield_now();
        }
        producer.join().unwrap();
    });
}

#[test]
fn frames_arrive_whole_and_in_order_through_a_ring_that_wraps() {
    check(2, 4, 1);
}

#[test]
fn batched_publishing_never_exposes_a_slot_early() {
    check(2, 4, 2);
}
