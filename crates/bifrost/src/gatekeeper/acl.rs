//! The Gatekeeper's access control list over global memory (the thesis's
//! §4.1 and §6.4): one range-match entry per allocation, keyed on its
//! memory node and offsets, holding which node may do what to it.
//!
//! Control and lease:
//! - `alloc` gives the requester control: every operation;
//! - a CALL lends the argument to the callee, to read, and takes the
//!   caller's write away while the lease lasts;
//! - a REPLY ends the lease (the callee's access goes) and, once no lease
//!   on the pointer is left, gives its owner back what it had; and it
//!   hands control of a returned pointer from the callee to the caller;
//! - `free` deletes every rule of the pointer;
//! - anything no rule allows is refused.
//!
//! Leases are counted per pointer: the first lends on the owner's behalf
//! (its rights are kept to give back), later ones (more calls with the
//! same pointer, or a lessee passing it on) only add lessees, and the
//! owner's rights come back when the last ends. Where the thesis says the
//! REPLY gives the caller "any memory operation" on the arguments it
//! sent, it is the owner that gets back what it had: a middle service
//! that passes on a pointer leased to it must not come out of the nested
//! call in control of it.

use remora_switch::resources::TableResources;
use remora_switch::table::{RangeTable, TableError, TableShape};
use remora_wire::Ipv4Address;

/// What an access does to memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Read,
    Write,
}

/// What a node may do to an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rights {
    /// A lease: reads only.
    Read,
    /// Control: reads, writes, free, snapshot and restore.
    Control,
}

impl Rights {
    pub fn permits(self, operation: Operation) -> bool {
        match operation {
            Operation::Read => true,
            Operation::Write => self == Rights::Control,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AclError {
    #[error(transparent)]
    Table(#[from] TableError),
    #[error("the pointer at memory node {node}, offset {offset:#x}, has no rules")]
    NoRules { node: u8, offset: u64 },
    #[error("{requester:?} does not control memory node {node}'s allocation at {offset:#x}")]
    NotInControl {
        requester: Ipv4Address,
        node: u8,
        offset: u64,
    },
    #[error("offset {offset:#x} at memory node {node} is past any pool (56 bits)")]
    OffsetTooLarge { node: u8, offset: u64 },
    #[error("{requester:?} holds no rights on memory node {node}'s allocation at {offset:#x}")]
    NotHolder {
        requester: Ipv4Address,
        node: u8,
        offset: u64,
    },
    #[error(
        "the allocation at memory node {node}, offset {offset:#x}, has {capacity} grants already"
    )]
    GrantsFull {
        node: u8,
        offset: u64,
        capacity: usize,
    },
}

/// The ACL's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AclConfig {
    /// Allocations with rules.
    pub pointers: usize,
    /// Nodes with access to one allocation at once.
    pub grants_per_pointer: usize,
}

impl Default for AclConfig {
    fn default() -> AclConfig {
        AclConfig {
            pointers: 4096,
            grants_per_pointer: 8,
        }
    }
}

/// One allocation's rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grants {
    pub generation: u8,
    pub size_bytes: u64,
    /// Who may do what: at most `grants_per_pointer`.
    pub holders: Vec<(Ipv4Address, Rights)>,
    /// The leases open on it, if any.
    pub lease: Option<Lease>,
}

/// The leases open on one allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Who lent it first, and what it had then: given back when the last
    /// lease ends.
    pub owner: Ipv4Address,
    pub owner_rights: Rights,
    /// Each lessee and how many of its leases are open.
    pub lessees: Vec<(Ipv4Address, u32)>,
}

impl Grants {
    pub fn rights_of(&self, node: Ipv4Address) -> Option<Rights> {
        self.holders
            .iter()
            .find(|(holder, _)| *holder == node)
            .map(|(_, rights)| *rights)
    }

    fn set(&mut self, node: Ipv4Address, rights: Option<Rights>, capacity: usize) -> bool {
        self.holders.retain(|(holder, _)| *holder != node);
        if let Some(rights) = rights {
            if self.holders.len() >= capacity {
                return false;
            }
            self.holders.push((node, rights));
        }
        true
    }
}

/// Pool offsets fit 56 bits: the table's key is the memory node in the
/// top byte and the offset below.
const OFFSET_LIMIT: u64 = 1 << 56;

/// The table's key, if the offset fits: a larger one would alias another
/// node's (it comes from the wire, in a DSM message, so anything comes).
fn key(node: u8, offset: u64) -> Option<u64> {
    (offset < OFFSET_LIMIT).then_some(u64::from(node) << 56 | offset)
}

pub struct Acl {
    table: RangeTable<Grants>,
    grants_per_pointer: usize,
}

impl Acl {
    pub fn new(config: AclConfig) -> Acl {
        Acl {
            table: RangeTable::new(TableShape {
                name: "gatekeeper_acl",
                stage: 1,
                key_bits: 64,
                // Eight holders of an address and a rights bit, a size and
                // a generation.
                action_data_bits: (config.grants_per_pointer * 33 + 72) as u16,
                capacity: config.pointers,
            }),
            grants_per_pointer: config.grants_per_pointer,
        }
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    pub fn resources(&self) -> TableResources {
        self.table.resources()
    }

    /// Whether an allocation could take one more entry.
    pub fn has_room(&self) -> bool {
        self.table.len() < self.table.resources().capacity
    }

    /// Whether `source` may do `operation` to `length` bytes at `offset` of
    /// memory node `node`: all of them inside one allocation it holds
    /// rights on.
    pub fn permits(
        &self,
        node: u8,
        offset: u64,
        length: u64,
        operation: Operation,
        source: Ipv4Address,
    ) -> bool {
        key(node, offset)
            .and_then(|start| self.table.lookup_span(start, length))
            .filter(|(_, _)| offset.saturating_add(length) <= OFFSET_LIMIT)
            .and_then(|(_, grants)| grants.rights_of(source))
            .is_some_and(|rights| rights.permits(operation))
    }

    /// The rules of the allocation that holds `offset`.
    pub fn grants(&self, node: u8, offset: u64) -> Option<&Grants> {
        let start = key(node, offset)?;
        self.table.lookup_span(start, 0).map(|(_, grants)| grants)
    }

    fn grants_mut(&mut self, node: u8, offset: u64) -> Result<&mut Grants, AclError> {
        key(node, offset)
            .and_then(|start| self.table.lookup_span_mut(start, 0))
            .map(|(_, grants)| grants)
            .ok_or(AclError::NoRules { node, offset })
    }

    /// An allocation was made for `owner`, which controls it.
    pub fn allocate(
        &mut self,
        node: u8,
        offset: u64,
        generation: u8,
        size_bytes: u64,
        owner: Ipv4Address,
    ) -> Result<(), AclError> {
        let too_large = AclError::OffsetTooLarge { node, offset };
        // The end stays below the limit too, so no key overflows.
        let end_offset = offset
            .checked_add(size_bytes.max(1))
            .filter(|end| *end < OFFSET_LIMIT)
            .ok_or(too_large.clone())?;
        let (start, end) = (
            key(node, offset).ok_or(too_large.clone())?,
            key(node, end_offset).ok_or(too_large)?,
        );
        // A stale entry (a free whose rules outlived it) gives way.
        self.table.remove(start);
        let grants = Grants {
            generation,
            size_bytes,
            holders: vec![(owner, Rights::Control)],
            lease: None,
        };
        Ok(self.table.insert(start, end, grants)?)
    }

    /// Whether `requester` controls the allocation at `offset` with this
    /// generation (and so may free, snapshot or restore it).
    pub fn controls(&self, node: u8, offset: u64, generation: u8, requester: Ipv4Address) -> bool {
        let Some(wanted) = key(node, offset) else {
            return false;
        };
        self.table
            .lookup_span(wanted, 0)
            .is_some_and(|(start, grants)| {
                start == wanted
                    && grants.generation == generation
                    && grants.rights_of(requester) == Some(Rights::Control)
            })
    }

    /// `free`: every rule of the allocation goes.
    pub fn free(&mut self, node: u8, offset: u64) -> Option<Grants> {
        self.table.remove(key(node, offset)?)
    }

    /// A CALL lends the allocation holding `offset` to `callee` to read.
    /// The first lease takes the lender's write away and keeps its rights
    /// to give back; a lender that holds no rights lends nothing.
    pub fn lend(
        &mut self,
        node: u8,
        offset: u64,
        caller: Ipv4Address,
        callee: Ipv4Address,
    ) -> Result<(), AclError> {
        let capacity = self.grants_per_pointer;
        let grants = self.grants_mut(node, offset)?;
        let rights = grants.rights_of(caller).ok_or(AclError::NotHolder {
            requester: caller,
            node,
            offset,
        })?;
        let full = AclError::GrantsFull {
            node,
            offset,
            capacity,
        };
        let callee_rights = grants.rights_of(callee).max(Some(Rights::Read));
        if !grants.set(callee, callee_rights, capacity) {
            return Err(full);
        }
        let lease = grants.lease.get_or_insert(Lease {
            owner: caller,
            owner_rights: rights,
            lessees: Vec::new(),
        });
        match lease
            .lessees
            .iter_mut()
            .find(|(lessee, _)| *lessee == callee)
        {
            Some((_, count)) => *count += 1,
            None => lease.lessees.push((callee, 1)),
        }
        if lease.owner == caller {
            grants.set(caller, Some(Rights::Read), capacity);
        }
        Ok(())
    }

    /// A REPLY ends one of `callee`'s leases on the allocation holding
    /// `offset`: with its last, its access goes; with the allocation's
    /// last, the owner gets back what it had.
    pub fn end_lease(&mut self, node: u8, offset: u64, callee: Ipv4Address) {
        let capacity = self.grants_per_pointer;
        let Ok(grants) = self.grants_mut(node, offset) else {
            return;
        };
        let Some(lease) = grants.lease.as_mut() else {
            return;
        };
        let Some(at) = lease
            .lessees
            .iter()
            .position(|(lessee, _)| *lessee == callee)
        else {
            return;
        };
        lease.lessees[at].1 -= 1;
        let callee_done = lease.lessees[at].1 == 0;
        if callee_done {
            lease.lessees.remove(at);
        }
        let (owner, owner_rights, all_done) =
            (lease.owner, lease.owner_rights, lease.lessees.is_empty());
        if callee_done && callee != owner {
            grants.set(callee, None, capacity);
        }
        if all_done {
            grants.lease = None;
            let restored = grants.set(owner, Some(owner_rights), capacity);
            debug_assert!(restored, "the owner's entry was there to restore");
        }
    }

    /// A REPLY returns a pointer: control moves from the callee to the
    /// caller.
    pub fn transfer(
        &mut self,
        node: u8,
        offset: u64,
        callee: Ipv4Address,
        caller: Ipv4Address,
    ) -> Result<(), AclError> {
        let capacity = self.grants_per_pointer;
        let grants = self.grants_mut(node, offset)?;
        if grants.rights_of(callee) != Some(Rights::Control) {
            return Err(AclError::NotInControl {
                requester: callee,
                node,
                offset,
            });
        }
        grants.set(callee, None, capacity);
        if !grants.set(caller, Some(Rights::Control), capacity) {
            return Err(AclError::GrantsFull {
                node,
                offset,
                capacity,
            });
        }
        Ok(())
    }

    /// A failed node's rights, and its places in leases (as their owner or
    /// a lessee), pass to its replacement. Returns the allocations whose
    /// rules changed. Rights alone once passed: the replacement's reply
    /// then ended no lease (the lessee list named the failed node), so the
    /// owner kept only Read for good; and a lease owned by the failed node
    /// gave its Control back to that dead address.
    pub fn hand_over(&mut self, failed: Ipv4Address, replacement: Ipv4Address) -> usize {
        let mut changed = 0;
        for grants in self.table.values_mut() {
            let mut touched = false;
            if let Some(rights) = grants.rights_of(failed) {
                let best = grants.rights_of(replacement).max(Some(rights));
                grants.holders.retain(|(holder, _)| *holder != failed);
                grants.holders.retain(|(holder, _)| *holder != replacement);
                grants
                    .holders
                    .extend(best.map(|rights| (replacement, rights)));
                touched = true;
            }
            if let Some(lease) = grants.lease.as_mut() {
                touched |= lease.hand_over(failed, replacement);
            }
            changed += usize::from(touched);
        }
        changed
    }
}

impl Lease {
    /// Puts `replacement` wherever `failed` stands; whether it stood
    /// anywhere. A replacement already a lessee keeps one entry, with
    /// both counts.
    fn hand_over(&mut self, failed: Ipv4Address, replacement: Ipv4Address) -> bool {
        let mut touched = false;
        if self.owner == failed {
            self.owner = replacement;
            touched = true;
        }
        if let Some(at) = self
            .lessees
            .iter()
            .position(|(lessee, _)| *lessee == failed)
        {
            let (_, count) = self.lessees.remove(at);
            match self
                .lessees
                .iter_mut()
                .find(|(lessee, _)| *lessee == replacement)
            {
                Some((_, existing)) => *existing += count,
                None => self.lessees.push((replacement, count)),
            }
            touched = true;
        }
        touched
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Ipv4Address = Ipv4Address([10, 0, 0, 1]);
    const B: Ipv4Address = Ipv4Address([10, 0, 0, 2]);
    const C: Ipv4Address = Ipv4Address([10, 0, 0, 3]);

    /// Recovery handed a failed node's rights to its replacement but left
    /// the lease records naming the failed node: the replacement's reply
    /// ended nothing, so the owner kept only Read for good; a failed owner
    /// got its Control back at a dead address. Leases follow now.
    #[test]
    fn leases_follow_a_failed_lessee_or_owner_to_its_replacement() {
        const B2: Ipv4Address = Ipv4Address([10, 0, 0, 12]);
        const A2: Ipv4Address = Ipv4Address([10, 0, 0, 11]);
        let mut acl = Acl::new(AclConfig::default());
        acl.allocate(0, 0, 0, 64, A).unwrap();
        acl.lend(0, 0, A, B).unwrap();
        assert_eq!(acl.hand_over(B, B2), 1);
        acl.end_lease(0, 0, B2);
        assert!(
            acl.permits(0, 0, 8, Operation::Write, A),
            "the owner writes again"
        );
        assert!(
            !acl.permits(0, 0, 8, Operation::Read, B2),
            "the lease is over"
        );
        assert!(acl.grants(0, 0).unwrap().lease.is_none());
        // The owner fails with a lease out: its replacement gets Control
        // back when the lease ends.
        acl.lend(0, 0, A, B).unwrap();
        assert_eq!(acl.hand_over(A, A2), 1);
        acl.end_lease(0, 0, B);
        assert!(
            acl.permits(0, 0, 8, Operation::Write, A2),
            "the replacement controls it"
        );
        assert!(acl.grants(0, 0).unwrap().rights_of(A).is_none());
    }

    #[test]
    fn control_and_lease_follow_a_call_and_its_reply() {
        let mut acl = Acl::new(AclConfig::default());
        acl.allocate(0, 4096, 0, 1024, A).expect("room");
        assert!(acl.permits(0, 4096, 1024, Operation::Write, A));
        assert!(!acl.permits(0, 4096, 8, Operation::Read, B), "default deny");
        assert!(
            !acl.permits(0, 4096, 1025, Operation::Read, A),
            "past the end"
        );
        acl.lend(0, 4096, A, B).expect("rules");
        assert!(acl.permits(0, 4100, 8, Operation::Read, B));
        assert!(!acl.permits(0, 4100, 8, Operation::Write, B));
        assert!(!acl.permits(0, 4100, 8, Operation::Write, A), "leased");
        assert!(acl.permits(0, 4100, 8, Operation::Read, A));
        // B passes it on to C, and keeps only its lease afterwards.
        acl.lend(0, 4096, B, C).expect("rules");
        acl.end_lease(0, 4096, C);
        assert!(!acl.permits(0, 4096, 8, Operation::Read, C));
        assert!(!acl.permits(0, 4096, 8, Operation::Write, B));
        assert!(acl.permits(0, 4096, 8, Operation::Read, B));
        assert!(
            !acl.permits(0, 4096, 8, Operation::Write, A),
            "B's lease is open"
        );
        acl.end_lease(0, 4096, B);
        assert!(matches!(
            acl.lend(0, 4096, C, B),
            Err(AclError::NotHolder { .. })
        ));
        assert!(!acl.permits(0, 4096, 8, Operation::Read, B));
        assert!(acl.permits(0, 4096, 8, Operation::Write, A));
        assert!(acl.controls(0, 4096, 0, A));
        assert!(!acl.controls(0, 4096, 1, A), "another generation");
    }

    #[test]
    fn a_returned_pointer_changes_hands_and_free_deletes_every_rule() {
        let mut acl = Acl::new(AclConfig::default());
        acl.allocate(2, 0, 3, 64, B).expect("room");
        acl.transfer(2, 0, B, A).expect("B controls it");
        assert!(acl.permits(2, 0, 64, Operation::Write, A));
        assert!(!acl.permits(2, 0, 1, Operation::Read, B));
        assert!(matches!(
            acl.transfer(2, 0, B, C),
            Err(AclError::NotInControl { .. })
        ));
        assert!(acl.free(2, 0).is_some());
        assert!(!acl.permits(2, 0, 1, Operation::Read, A));
        assert!(acl.is_empty());
    }

    /// Found by review: two leases open on one pointer (two calls with
    /// it) ended as a stack, so the first reply gave the owner control
    /// while the second lease was open and the second left it with a read
    /// for good. Leases are counted: the owner's rights come back with the
    /// last.
    #[test]
    fn two_leases_on_one_pointer_end_in_any_order_and_the_owner_gets_its_rights_back() {
        let mut acl = Acl::new(AclConfig::default());
        acl.allocate(0, 0, 0, 64, A).expect("room");
        acl.lend(0, 0, A, B).expect("first call");
        acl.lend(0, 0, A, B).expect("second call, same callee");
        acl.lend(0, 0, A, C).expect("third call, another callee");
        acl.end_lease(0, 0, B);
        assert!(
            acl.permits(0, 0, 8, Operation::Read, B),
            "B's second lease is open"
        );
        assert!(
            !acl.permits(0, 0, 8, Operation::Write, A),
            "leases are open"
        );
        acl.end_lease(0, 0, C);
        assert!(!acl.permits(0, 0, 8, Operation::Read, C));
        assert!(!acl.permits(0, 0, 8, Operation::Write, A));
        acl.end_lease(0, 0, B);
        assert!(!acl.permits(0, 0, 8, Operation::Read, B));
        assert!(
            acl.permits(0, 0, 8, Operation::Write, A),
            "the owner's control is back"
        );
        // A lease ended twice (a late duplicate reply) changes nothing.
        acl.end_lease(0, 0, B);
        assert!(acl.permits(0, 0, 8, Operation::Write, A));
    }

    /// Found by the `bifrost_acl` fuzz target: a DSM message's offset
    /// past 56 bits made a key that aliased another node's allocation (a
    /// debug assertion caught it; a release build would have looked up,
    /// or freed, the other node's rules).
    #[test]
    fn an_offset_past_56_bits_names_no_rules_of_another_node() {
        let mut acl = Acl::new(AclConfig::default());
        acl.allocate(1, 0x40, 0, 64, A).expect("room");
        let aliasing = (1 << 56) | 0x40;
        assert!(!acl.permits(0, aliasing, 0, Operation::Read, A));
        assert!(!acl.controls(0, aliasing, 0, A));
        assert!(acl.free(0, aliasing).is_none());
        assert!(acl.grants(0, aliasing).is_none());
        assert!(matches!(
            acl.allocate(0, aliasing, 0, 8, A),
            Err(AclError::OffsetTooLarge { .. })
        ));
        assert!(matches!(
            acl.allocate(0, OFFSET_LIMIT - 4, 0, 8, A),
            Err(AclError::OffsetTooLarge { .. })
        ));
        assert!(acl.permits(1, 0x40, 64, Operation::Write, A), "untouched");
    }

    #[test]
    fn full_tables_and_full_grants_are_typed_errors() {
        let mut acl = Acl::new(AclConfig {
            pointers: 1,
            grants_per_pointer: 2,
        });
        acl.allocate(0, 0, 0, 8, A).expect("room");
        assert!(matches!(
            acl.allocate(0, 64, 0, 8, A),
            Err(AclError::Table(TableError::Full { .. }))
        ));
        acl.lend(0, 0, A, B).expect("a second holder fits");
        assert!(matches!(
            acl.lend(0, 0, A, C),
            Err(AclError::GrantsFull { .. })
        ));
        assert_eq!(acl.hand_over(B, C), 1);
        assert!(acl.permits(0, 0, 8, Operation::Read, C));
        assert!(!acl.permits(0, 0, 8, Operation::Read, B));
    }
}
