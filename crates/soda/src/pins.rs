//! The compute node's record of the DPU's static cache: which objects are
//! pinned there, at what offset, and whether written since they were
//! pinned; and a gate that holds an object's transfers while it moves into
//! or out of the cache.
//!
//! Why the gate: a pin loads the object from the memory node, and an unpin
//! flushes the DPU's copy back. A write-back that lands on the memory node
//! after the load read that piece is missing from the static copy; a fetch
//! from the memory node during a flush reads bytes the flush has not yet
//! replaced, and a write-back during it can be overwritten by the flush.
//! So a move waits for the object's transfers under way to end, and the
//! object's new transfers wait for the move to end.

use crate::store::ObjectId;
use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// Where the static cache stands on one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Pinned at `offset` in the static cache; `dirty` once written there
    /// (the memory node's copy is then stale until the unpin's flush).
    Pinned { offset: u64, dirty: bool },
    /// Being loaded or flushed; `dirty` as it was before the move.
    Moving { dirty: bool },
}

impl Standing {
    pub fn dirty(self) -> bool {
        match self {
            Standing::Pinned { dirty, .. } | Standing::Moving { dirty } => dirty,
        }
    }
}

/// The gate did not open before the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("object {0:?} stayed in the middle of a move into or out of the static cache")]
pub struct StillMoving(pub ObjectId);

#[derive(Default)]
struct Table {
    standings: HashMap<ObjectId, Standing>,
    /// Transfers under way, by object, whatever their path.
    transfers: HashMap<ObjectId, usize>,
}

#[derive(Default)]
pub struct PinTable {
    table: Mutex<Table>,
    /// Signalled when a move ends or a transfer ends.
    changed: Condvar,
}

/// One transfer admitted through the gate; it ends when dropped.
pub struct Passage<'a> {
    pins: &'a PinTable,
    object: ObjectId,
    /// The static cache's offset, if the object is pinned.
    pub static_offset: Option<u64>,
}

impl Drop for Passage<'_> {
    fn drop(&mut self) {
        let mut table = self.pins.lock();
        let count = table
            .transfers
            .get_mut(&self.object)
            .expect("an admitted transfer is counted");
        *count -= 1;
        if *count == 0 {
            table.transfers.remove(&self.object);
        }
        drop(table);
        self.pins.changed.notify_all();
    }
}

impl PinTable {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().expect("pin table lock")
    }

    /// Waits, at most until `deadline`, while `blocked` holds of the table.
    fn wait_while<'a>(
        &'a self,
        mut table: MutexGuard<'a, Table>,
        object: ObjectId,
        deadline: Instant,
        blocked: impl Fn(&Table) -> bool,
    ) -> Result<MutexGuard<'a, Table>, StillMoving> {
        // Bounded by the deadline.
        while blocked(&table) {
            let left = deadline
                .checked_duration_since(Instant::now())
                .ok_or(StillMoving(object))?;
            table = self
                .changed
                .wait_timeout(table, left)
                .expect("pin table lock")
                .0;
        }
        Ok(table)
    }

    fn moving(table: &Table, object: ObjectId) -> bool {
        matches!(table.standings.get(&object), Some(Standing::Moving { .. }))
    }

    /// Admits one transfer of `object` once no move is under way; a write
    /// to a pinned object marks it dirty.
    pub fn enter(
        &self,
        object: ObjectId,
        writes: bool,
        deadline: Instant,
    ) -> Result<Passage<'_>, StillMoving> {
        self.enter_deciding(object, move || writes, deadline)
    }

    /// [`PinTable::enter`], with whether the transfer dirties a pinned
    /// object decided once it is admitted (`dirties`, called under the
    /// table's lock): what held when the transfer began may not hold
    /// after a wait of up to the deadline (the static copy's DPU may
    /// have died meanwhile).
    pub fn enter_deciding(
        &self,
        object: ObjectId,
        dirties: impl FnOnce() -> bool,
        deadline: Instant,
    ) -> Result<Passage<'_>, StillMoving> {
        let table = self.lock();
        let mut table =
            self.wait_while(table, object, deadline, |table| Self::moving(table, object))?;
        let static_offset = match table.standings.get_mut(&object) {
            Some(Standing::Pinned { offset, dirty }) => {
                *dirty |= dirties();
                Some(*offset)
            }
            _ => None,
        };
        *table.transfers.entry(object).or_insert(0) += 1;
        Ok(Passage {
            pins: self,
            object,
            static_offset,
        })
    }

    /// Starts a move of `object`: waits for another move of it to end and
    /// for its transfers under way to drain. Returns its standing before.
    pub fn begin_move(
        &self,
        object: ObjectId,
        deadline: Instant,
    ) -> Result<Option<Standing>, StillMoving> {
        let table = self.lock();
        let mut table =
            self.wait_while(table, object, deadline, |table| Self::moving(table, object))?;
        let before = table.standings.get(&object).copied();
        let dirty = before.is_some_and(Standing::dirty);
        table.standings.insert(object, Standing::Moving { dirty });
        // New transfers wait from here on; those under way finish first.
        let waited = self.wait_while(table, object, deadline, |table| {
            table.transfers.contains_key(&object)
        });
        if waited.is_err() {
            self.end_move(object, before);
        }
        waited.map(|_| before)
    }

    /// Ends a move of `object`, leaving it as `after` (`None`: not in the
    /// static cache). An object released meanwhile stays released.
    pub fn end_move(&self, object: ObjectId, after: Option<Standing>) {
        let mut table = self.lock();
        if Self::moving(&table, object) {
            match after {
                Some(standing) => table.standings.insert(object, standing),
                None => table.standings.remove(&object),
            };
        }
        drop(table);
        self.changed.notify_all();
    }

    /// Forgets `object`, as when it is released.
    pub fn forget(&self, object: ObjectId) {
        self.lock().standings.remove(&object);
        self.changed.notify_all();
    }

    /// The objects whose static copy holds writes the memory node lacks.
    pub fn dirty_objects(&self) -> Vec<ObjectId> {
        self.lock()
            .standings
            .iter()
            .filter(|(_, standing)| standing.dirty())
            .map(|(object, _)| *object)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    #[test]
    fn a_move_waits_for_transfers_under_way_and_holds_new_ones() {
        let pins = Arc::new(PinTable::default());
        let object = ObjectId(3);
        let passage = pins.enter(object, true, soon()).unwrap();
        assert_eq!(passage.static_offset, None);
        let mover = {
            let pins = Arc::clone(&pins);
            std::thread::spawn(move || {
                let before = pins.begin_move(object, soon()).unwrap();
                let pinned = Standing::Pinned {
                    offset: 4096,
                    dirty: false,
                };
                pins.end_move(object, Some(pinned));
                before
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!mover.is_finished(), "the move waits for the transfer");
        drop(passage);
        assert_eq!(mover.join().unwrap(), None);
        let after = pins.enter(object, true, soon()).unwrap();
        assert_eq!(after.static_offset, Some(4096));
        drop(after);
        assert_eq!(pins.dirty_objects(), vec![object], "the write marked it");
    }

    /// A write waiting out a pin's load decided at its start whether it
    /// would dirty the static copy: the copy's DPU died during the wait,
    /// the write went to the memory node, and the clean object was
    /// marked dirty, which the crash's settling took for a write the
    /// DPU held, and lost the object. It is decided once admitted.
    #[test]
    fn whether_a_write_dirties_is_decided_once_it_is_admitted() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let pins = Arc::new(PinTable::default());
        let object = ObjectId(4);
        let copy_alive = Arc::new(AtomicBool::new(true));
        pins.begin_move(object, soon()).unwrap();
        let writer = {
            let (pins, copy_alive) = (Arc::clone(&pins), Arc::clone(&copy_alive));
            std::thread::spawn(move || {
                let dirties = || copy_alive.load(Ordering::SeqCst);
                let passage = pins.enter_deciding(object, dirties, soon()).unwrap();
                passage.static_offset
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!writer.is_finished(), "the write waits for the load");
        copy_alive.store(false, Ordering::SeqCst);
        let clean = Standing::Pinned {
            offset: 0,
            dirty: false,
        };
        pins.end_move(object, Some(clean));
        assert_eq!(writer.join().unwrap(), Some(0));
        assert!(pins.dirty_objects().is_empty(), "still clean");
    }

    #[test]
    fn a_transfer_during_a_move_waits_for_its_end_or_the_deadline() {
        let pins = PinTable::default();
        let object = ObjectId(5);
        pins.begin_move(object, soon()).unwrap();
        let shortly = Instant::now() + Duration::from_millis(20);
        assert_eq!(
            pins.enter(object, false, shortly).err(),
            Some(StillMoving(object))
        );
        assert!(
            pins.enter(ObjectId(6), false, shortly).is_ok(),
            "others pass"
        );
        pins.end_move(object, None);
        assert!(pins.enter(object, false, shortly).is_ok());
    }

    #[test]
    fn a_move_that_times_out_leaves_the_object_as_it_was() {
        let pins = PinTable::default();
        let object = ObjectId(7);
        let pinned = Standing::Pinned {
            offset: 0,
            dirty: true,
        };
        pins.begin_move(object, soon()).unwrap();
        pins.end_move(object, Some(pinned));
        let _passage = pins.enter(object, false, soon()).unwrap();
        let shortly = Instant::now() + Duration::from_millis(20);
        assert_eq!(pins.begin_move(object, shortly), Err(StillMoving(object)));
        assert_eq!(pins.lock().standings.get(&object), Some(&pinned));
    }
}
