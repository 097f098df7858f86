//! Registered memory: the host memory a NIC may touch, with keys, bounds and
//! access rights checked on every access.
//!
//! The regions live inside the device, as host memory pinned for DMA would.
//! Keys carry a 24-bit index and an 8-bit variant, as a ConnectX's memory
//! keys do. A slot answers to every index that is its own modulo
//! `max_regions`, and each registration in it takes the next variant, then
//! the next of its indexes, so a key from a deregistered region names
//! nothing, and reaches a later region only after 256 × (2^24 /
//! `max_regions`) registrations in its slot (4 million at the default
//! 1024 regions). A freed slot is reused only once every slot has been
//! used, least recently freed first, which spreads reuse over the free
//! slots; with one slot free, every registration lands in it, and 256
//! registrations reached the first key again when a slot had one index.
//! Remote keys are salted per device so that one device's lkeys are not
//! its rkeys.

use crate::host_memory::{ExternalMemory, HostMemory};
use crate::verbs::VerbsError;
use crate::verbs::{AccessFlags, Lkey, MemoryRegion, ProtectionDomain, ScatterGatherList};
use remora_base::copy_bytes;
use remora_wire::{Rkey, VirtAddr};
use std::ops::Range;

/// Gap between regions, so an overrun of one never lands in the next.
const GUARD_BYTES: u64 = 4096;
const FIRST_ADDRESS: u64 = 0x1000_0000;
/// Key indexes: a key's upper 24 bits.
const KEY_INDEXES: u32 = 1 << 24;

#[derive(Debug)]
struct Region {
    protection_domain: ProtectionDomain,
    handle: MemoryRegion,
    bytes: Backing,
}

/// Where a region's bytes live: inside the device (host memory only the
/// NIC and `read_local`/`write_local` touch), in [`HostMemory`] the
/// application shares with the NIC, or in memory outside Rust's heap that
/// an [`ExternalMemory`] reaches (a C program's own pages).
enum Backing {
    Device(Vec<u8>),
    Host(HostMemory),
    External(Box<dyn ExternalMemory>),
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backing::Device(bytes) => write!(formatter, "Device({} bytes)", bytes.len()),
            Backing::Host(memory) => memory.fmt(formatter),
            Backing::External(memory) => write!(formatter, "External({} bytes)", memory.len()),
        }
    }
}

impl Backing {
    fn read(&self, range: Range<usize>, into: &mut [u8]) {
        match self {
            Backing::Device(bytes) => copy_bytes(into, &bytes[range]),
            Backing::Host(memory) => memory
                .read(range.start, into)
                .expect("range checked against the region"),
            Backing::External(memory) => memory.read(range.start, into),
        }
    }

    fn write(&mut self, range: Range<usize>, from: &[u8]) {
        match self {
            Backing::Device(bytes) => copy_bytes(&mut bytes[range], from),
            Backing::Host(memory) => memory
                .write(range.start, from)
                .expect("range checked against the region"),
            Backing::External(memory) => memory.write(range.start, from),
        }
    }

    /// Applies `update` to the aligned word at `offset` atomically (host
    /// memory has other writers) and returns the original.
    fn update_word(&mut self, offset: usize, update: impl Fn(u64) -> u64) -> u64 {
        match self {
            Backing::Device(bytes) => {
                let target = &mut bytes[offset..offset + 8];
                let original = u64::from_le_bytes((&*target).try_into().expect("a word"));
                target.copy_from_slice(&update(original).to_le_bytes());
                original
            }
            Backing::External(memory) => memory.update_word(offset, &update),
            Backing::Host(memory) => {
                let mut current = memory
                    .load_u64(offset, std::sync::atomic::Ordering::Acquire)
                    .expect("aligned and checked");
                // Bounded by the other writers' progress: each failed
                // exchange means one of them changed the word.
                loop {
                    let updated = update(current);
                    let seen = memory
                        .compare_swap_u64(
                            offset,
                            current,
                            updated,
                            std::sync::atomic::Ordering::AcqRel,
                        )
                        .expect("aligned and checked");
                    if seen == current {
                        return current;
                    }
                    current = seen;
                }
            }
        }
    }
}

/// Why a remote access was refused. Each maps to a NAK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RemoteAccessFault {
    UnknownKey,
    WrongProtectionDomain,
    OutOfBounds,
    NotPermitted,
}

#[derive(Debug)]
pub(crate) struct MemoryTable {
    slots: Vec<Option<Region>>,
    /// Registrations made in each slot: its key's variant and index.
    registrations: Vec<u32>,
    /// Freed slots, least recently freed first.
    freed: std::collections::VecDeque<usize>,
    rkey_salt: u32,
    next_address: u64,
    max_regions: usize,
    max_region_bytes: u64,
}

/// The most memory regions a device may have: each slot needs at least two
/// of the keys' [`KEY_INDEXES`], so a re-registered slot gets a key its
/// last region never had.
pub(crate) const MAX_REGIONS_LIMIT: usize = (1 << 23) - 1;

impl MemoryTable {
    pub(crate) fn new(max_regions: usize, max_region_bytes: u64, rkey_salt: u32) -> MemoryTable {
        assert!(max_regions > 0 && max_regions <= MAX_REGIONS_LIMIT);
        MemoryTable {
            slots: Vec::with_capacity(max_regions),
            registrations: Vec::with_capacity(max_regions),
            freed: std::collections::VecDeque::with_capacity(max_regions),
            rkey_salt,
            next_address: FIRST_ADDRESS,
            max_regions,
            max_region_bytes,
        }
    }

    /// A region is 1 byte to the device's limit long.
    fn check_length(&self, length_bytes: u64) -> Result<(), VerbsError> {
        if length_bytes == 0 || length_bytes > self.max_region_bytes {
            return Err(VerbsError::InvalidRegionLength(length_bytes));
        }
        Ok(())
    }

    pub(crate) fn register(
        &mut self,
        protection_domain: ProtectionDomain,
        length_bytes: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        self.check_length(length_bytes)?;
        let slot = self.free_slot()?;
        let bytes = Backing::Device(vec![
            0u8;
            usize::try_from(length_bytes)
                .expect("bounded by max_region_bytes")
        ]);
        self.insert(slot, protection_domain, length_bytes, access, bytes)
    }

    /// Registers host memory the application keeps its own handle on.
    pub(crate) fn register_host(
        &mut self,
        protection_domain: ProtectionDomain,
        memory: HostMemory,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        let length_bytes = memory.len() as u64;
        self.check_length(length_bytes)?;
        let slot = self.free_slot()?;
        self.insert(
            slot,
            protection_domain,
            length_bytes,
            access,
            Backing::Host(memory),
        )
    }

    /// Registers memory outside Rust's heap at the address its owner
    /// names (`ibv_reg_mr`'s `addr`, or `iova`): remote peers address it
    /// by that address, as they would a real RNIC's registration.
    pub(crate) fn register_external(
        &mut self,
        protection_domain: ProtectionDomain,
        memory: Box<dyn ExternalMemory>,
        address: VirtAddr,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        let length_bytes = memory.len() as u64;
        self.check_length(length_bytes)?;
        if address.0.checked_add(length_bytes).is_none() {
            return Err(VerbsError::RemoteRangeOverflow {
                address,
                length_bytes,
            });
        }
        let slot = self.free_slot()?;
        let bytes = Backing::External(memory);
        self.insert_at(
            slot,
            protection_domain,
            address,
            length_bytes,
            access,
            bytes,
        )
    }

    fn insert(
        &mut self,
        slot: usize,
        protection_domain: ProtectionDomain,
        length_bytes: u64,
        access: AccessFlags,
        bytes: Backing,
    ) -> Result<MemoryRegion, VerbsError> {
        let address = self.next_address;
        let end = address
            .checked_add(length_bytes)
            .and_then(|end| end.checked_add(GUARD_BYTES))
            .ok_or(VerbsError::AddressSpaceExhausted)?;
        self.next_address = end.next_multiple_of(GUARD_BYTES);
        let address = VirtAddr(address);
        self.insert_at(
            slot,
            protection_domain,
            address,
            length_bytes,
            access,
            bytes,
        )
    }

    fn insert_at(
        &mut self,
        slot: usize,
        protection_domain: ProtectionDomain,
        address: VirtAddr,
        length_bytes: u64,
        access: AccessFlags,
        bytes: Backing,
    ) -> Result<MemoryRegion, VerbsError> {
        self.registrations[slot] = self.registrations[slot].wrapping_add(1);
        let key = self.key_of(slot, self.registrations[slot]);
        let handle = MemoryRegion {
            lkey: Lkey(key),
            rkey: Rkey(key ^ self.rkey_salt),
            address,
            length_bytes,
            access,
        };
        self.slots[slot] = Some(Region {
            protection_domain,
            handle,
            bytes,
        });
        Ok(handle)
    }

    /// A new slot while the table may grow, else the least recently
    /// freed: a slot's generation, and so its keys, then recur as late as
    /// they can.
    fn free_slot(&mut self) -> Result<usize, VerbsError> {
        if self.slots.len() < self.max_regions {
            self.slots.push(None);
            self.registrations.push(0);
            return Ok(self.slots.len() - 1);
        }
        self.freed.pop_front().ok_or(VerbsError::TooManyObjects {
            kind: "memory regions",
            max: self.max_regions,
        })
    }

    pub(crate) fn deregister(&mut self, lkey: Lkey) -> Result<(), VerbsError> {
        let slot = self
            .slot_of_lkey(lkey)
            .ok_or(VerbsError::UnknownLocalKey(lkey))?;
        self.slots[slot] = None;
        self.freed.push_back(slot);
        debug_assert!(self.freed.len() <= self.max_regions);
        Ok(())
    }

    /// Indexes each slot has: index `1 + slot + max_regions × n` for every
    /// `n` below this (index 0 is no key's).
    fn indexes_per_slot(&self) -> u32 {
        (KEY_INDEXES - 1) / self.max_regions as u32
    }

    /// The key of the `registration`th region in `slot`: the variant
    /// turns fastest, then the slot's index.
    fn key_of(&self, slot: usize, registration: u32) -> u32 {
        let variant = registration & 0xff;
        let turn = (registration >> 8) % self.indexes_per_slot();
        let index = 1 + slot as u32 + self.max_regions as u32 * turn;
        debug_assert!(index < KEY_INDEXES);
        (index << 8) | variant
    }

    fn slot_of_key(&self, key: u32) -> Option<usize> {
        let index = usize::try_from(key >> 8).ok()?.checked_sub(1)?;
        let slot = index % self.max_regions;
        let region = self.slots.get(slot)?.as_ref()?;
        (region.handle.lkey.0 == key).then_some(slot)
    }

    fn slot_of_lkey(&self, lkey: Lkey) -> Option<usize> {
        self.slot_of_key(lkey.0)
    }

    fn region_by_lkey(&self, lkey: Lkey) -> Result<&Region, VerbsError> {
        let slot = self
            .slot_of_lkey(lkey)
            .ok_or(VerbsError::UnknownLocalKey(lkey))?;
        Ok(self.slots[slot].as_ref().expect("slot_of_key checked"))
    }

    fn region_by_lkey_mut(&mut self, lkey: Lkey) -> Result<&mut Region, VerbsError> {
        let slot = self
            .slot_of_lkey(lkey)
            .ok_or(VerbsError::UnknownLocalKey(lkey))?;
        Ok(self.slots[slot].as_mut().expect("slot_of_key checked"))
    }

    pub(crate) fn handle(&self, lkey: Lkey) -> Result<MemoryRegion, VerbsError> {
        Ok(self.region_by_lkey(lkey)?.handle)
    }

    /// Validates a list of local buffers against a protection domain.
    pub(crate) fn check_local_list(
        &self,
        protection_domain: ProtectionDomain,
        list: &ScatterGatherList,
        needs_write: bool,
    ) -> Result<(), VerbsError> {
        // An empty element names no memory, and is never gathered into or
        // scattered from: as mlx5 skips it, its key is not looked at (a
        // zero-length SEND from {0, 0, 0} is common, and was refused).
        let named = list
            .as_slice()
            .iter()
            .filter(|element| element.length_bytes > 0);
        for element in named {
            let region = self.region_by_lkey(element.lkey)?;
            if region.protection_domain != protection_domain {
                return Err(VerbsError::WrongProtectionDomain);
            }
            if needs_write && !region.handle.access.contains(AccessFlags::LOCAL_WRITE) {
                return Err(VerbsError::LocalWriteNotPermitted);
            }
            local_range(region, element.address, u64::from(element.length_bytes))?;
        }
        Ok(())
    }

    pub(crate) fn read_local(
        &self,
        lkey: Lkey,
        address: VirtAddr,
        into: &mut [u8],
    ) -> Result<(), VerbsError> {
        let region = self.region_by_lkey(lkey)?;
        let range = local_range(region, address, into.len() as u64)?;
        region.bytes.read(range, into);
        Ok(())
    }

    pub(crate) fn write_local(
        &mut self,
        lkey: Lkey,
        address: VirtAddr,
        from: &[u8],
    ) -> Result<(), VerbsError> {
        let region = self.region_by_lkey_mut(lkey)?;
        let range = local_range(region, address, from.len() as u64)?;
        region.bytes.write(range, from);
        Ok(())
    }

    /// Copies `into.len()` bytes starting `offset` bytes into the message a
    /// list describes. Fails if a region vanished since the post.
    pub(crate) fn gather(
        &self,
        list: &ScatterGatherList,
        offset_bytes: u64,
        into: &mut [u8],
    ) -> Result<(), VerbsError> {
        let mut remaining = into;
        for (element, skip) in elements_from(list, offset_bytes) {
            if remaining.is_empty() {
                break;
            }
            let take = remaining.len().min((element.length_bytes as usize) - skip);
            let region = self.region_by_lkey(element.lkey)?;
            let start = VirtAddr(element.address.0 + skip as u64);
            let range = local_range(region, start, take as u64)?;
            let (head, tail) = remaining.split_at_mut(take);
            region.bytes.read(range, head);
            remaining = tail;
        }
        if !remaining.is_empty() {
            return Err(VerbsError::LocalAccessOutOfBounds {
                address: VirtAddr(offset_bytes),
                length_bytes: remaining.len() as u64,
            });
        }
        Ok(())
    }

    /// Writes `from` starting `offset` bytes into the message a list
    /// describes. Fails if it would overrun the list or a region vanished.
    pub(crate) fn scatter(
        &mut self,
        list: &ScatterGatherList,
        offset_bytes: u64,
        from: &[u8],
    ) -> Result<(), VerbsError> {
        let mut remaining = from;
        for (element, skip) in elements_from(list, offset_bytes) {
            if remaining.is_empty() {
                break;
            }
            let take = remaining.len().min((element.length_bytes as usize) - skip);
            let region = self.region_by_lkey_mut(element.lkey)?;
            if !region.handle.access.contains(AccessFlags::LOCAL_WRITE) {
                return Err(VerbsError::LocalWriteNotPermitted);
            }
            let start = VirtAddr(element.address.0 + skip as u64);
            let range = local_range(region, start, take as u64)?;
            region.bytes.write(range, &remaining[..take]);
            remaining = &remaining[take..];
        }
        if !remaining.is_empty() {
            return Err(VerbsError::LocalAccessOutOfBounds {
                address: VirtAddr(offset_bytes),
                length_bytes: remaining.len() as u64,
            });
        }
        Ok(())
    }

    /// Checks a remote access and returns the byte range it covers.
    pub(crate) fn check_remote(
        &self,
        protection_domain: ProtectionDomain,
        rkey: Rkey,
        address: VirtAddr,
        length_bytes: u64,
        needed: AccessFlags,
    ) -> Result<(usize, Range<usize>), RemoteAccessFault> {
        let slot = self
            .slot_of_key(rkey.0 ^ self.rkey_salt)
            .ok_or(RemoteAccessFault::UnknownKey)?;
        let region = self.slots[slot].as_ref().expect("slot_of_key checked");
        if region.protection_domain != protection_domain {
            return Err(RemoteAccessFault::WrongProtectionDomain);
        }
        if !region.handle.access.contains(needed) {
            return Err(RemoteAccessFault::NotPermitted);
        }
        let range = local_range(region, address, length_bytes)
            .map_err(|_| RemoteAccessFault::OutOfBounds)?;
        Ok((slot, range))
    }

    /// Reads a range of a slot that `check_remote` approved.
    pub(crate) fn slot_read(&self, slot: usize, range: Range<usize>, into: &mut [u8]) {
        self.slots[slot]
            .as_ref()
            .expect("checked slot")
            .bytes
            .read(range, into);
    }

    /// Writes a range of a slot that `check_remote` approved.
    pub(crate) fn slot_write(&mut self, slot: usize, range: Range<usize>, from: &[u8]) {
        self.slots[slot]
            .as_mut()
            .expect("checked slot")
            .bytes
            .write(range, from);
    }

    /// Atomically updates the aligned word `check_remote` approved at the
    /// start of `range`; returns the original.
    pub(crate) fn slot_update_word(
        &mut self,
        slot: usize,
        range: Range<usize>,
        update: impl Fn(u64) -> u64,
    ) -> u64 {
        assert_eq!(range.len(), 8);
        self.slots[slot]
            .as_mut()
            .expect("checked slot")
            .bytes
            .update_word(range.start, update)
    }
}

/// Elements of a list from a message offset on, each with the bytes to skip
/// at its start. Bounded by the list length.
fn elements_from(
    list: &ScatterGatherList,
    offset_bytes: u64,
) -> impl Iterator<Item = (crate::verbs::ScatterGatherElement, usize)> + '_ {
    let mut skip_left = offset_bytes;
    list.as_slice().iter().filter_map(move |element| {
        let length = u64::from(element.length_bytes);
        if skip_left >= length {
            skip_left -= length;
            return None;
        }
        let skip = skip_left as usize;
        skip_left = 0;
        Some((*element, skip))
    })
}

fn local_range(
    region: &Region,
    address: VirtAddr,
    length_bytes: u64,
) -> Result<Range<usize>, VerbsError> {
    let out_of_bounds = VerbsError::LocalAccessOutOfBounds {
        address,
        length_bytes,
    };
    let start = address
        .0
        .checked_sub(region.handle.address.0)
        .ok_or(out_of_bounds.clone())?;
    let end = start
        .checked_add(length_bytes)
        .ok_or(out_of_bounds.clone())?;
    if end > region.handle.length_bytes {
        return Err(out_of_bounds);
    }
    Ok(start as usize..end as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> (MemoryTable, MemoryRegion) {
        let mut table = MemoryTable::new(4, 1 << 20, 0x5a5a_0000);
        let region = table
            .register(ProtectionDomain(0), 4096, AccessFlags::ALL)
            .unwrap();
        (table, region)
    }

    /// The first free slot was always reused, so its 8-bit generation
    /// wrapped after 256 registrations, and the 257th region answered to
    /// the 1st one's rkey.
    #[test]
    fn a_deregistered_key_names_nothing_for_many_registrations() {
        let (mut table, first) = table();
        let pd = ProtectionDomain(0);
        table.deregister(first.lkey).unwrap();
        let mut keys = std::collections::HashSet::from([first.rkey]);
        for _ in 0..4 * 256 - 1 {
            let region = table.register(pd, 4096, AccessFlags::ALL).unwrap();
            assert!(keys.insert(region.rkey), "{:?} came back", region.rkey);
            let stale =
                table.check_remote(pd, first.rkey, region.address, 8, AccessFlags::REMOTE_READ);
            assert!(stale.is_err(), "the first rkey reached a later region");
            table.deregister(region.lkey).unwrap();
        }
    }

    /// With one slot free, every registration reused it, and its 8-bit
    /// variant brought the first region's rkey back after 256
    /// registrations: a peer holding it reached the region registered
    /// then.
    #[test]
    fn a_deregistered_key_names_nothing_when_one_slot_is_reused() {
        let mut table = MemoryTable::new(2, 1 << 20, 0x5a5a_0000);
        let pd = ProtectionDomain(0);
        let _kept = table.register(pd, 4096, AccessFlags::ALL).unwrap();
        let first = table.register(pd, 4096, AccessFlags::ALL).unwrap();
        table.deregister(first.lkey).unwrap();
        let mut keys = std::collections::HashSet::from([first.rkey]);
        for _ in 0..64 * 256 {
            let region = table.register(pd, 4096, AccessFlags::ALL).unwrap();
            assert!(keys.insert(region.rkey), "{:?} came back", region.rkey);
            let stale =
                table.check_remote(pd, first.rkey, region.address, 8, AccessFlags::REMOTE_READ);
            assert!(stale.is_err(), "the first rkey reached a later region");
            assert_eq!(table.handle(region.lkey).unwrap(), region);
            table.deregister(region.lkey).unwrap();
        }
    }

    /// At the largest table, each slot has two indexes, and every key
    /// still finds its own slot.
    #[test]
    fn keys_of_the_largest_table_name_their_slots() {
        let max_regions = (1 << 23) - 1;
        let table = MemoryTable::new(max_regions, 1 << 20, 0);
        assert_eq!(table.indexes_per_slot(), 2);
        for slot in [0, 1, max_regions / 2, max_regions - 1] {
            for registration in [1, 255, 256, 511, 512, u32::MAX] {
                let key = table.key_of(slot, registration);
                let index = (key >> 8) as usize;
                assert!(index >= 1 && index < KEY_INDEXES as usize);
                assert_eq!((index - 1) % max_regions, slot);
            }
        }
    }

    #[test]
    fn remote_checks_cover_key_bounds_domain_and_rights() {
        let (mut table, region) = table();
        let read_only = table
            .register(ProtectionDomain(0), 64, AccessFlags::REMOTE_READ)
            .unwrap();
        let pd = ProtectionDomain(0);
        assert!(table
            .check_remote(
                pd,
                region.rkey,
                region.address,
                4096,
                AccessFlags::REMOTE_WRITE
            )
            .is_ok());
        assert_eq!(
            table.check_remote(
                pd,
                region.rkey,
                region.address,
                4097,
                AccessFlags::REMOTE_READ
            ),
            Err(RemoteAccessFault::OutOfBounds)
        );
        assert_eq!(
            table.check_remote(
                pd,
                Rkey(region.lkey.0),
                region.address,
                8,
                AccessFlags::REMOTE_READ
            ),
            Err(RemoteAccessFault::UnknownKey),
            "an lkey is not an rkey"
        );
        assert_eq!(
            table.check_remote(
                ProtectionDomain(1),
                region.rkey,
                region.address,
                8,
                AccessFlags::REMOTE_READ
            ),
            Err(RemoteAccessFault::WrongProtectionDomain)
        );
        assert_eq!(
            table.check_remote(
                pd,
                read_only.rkey,
                read_only.address,
                8,
                AccessFlags::REMOTE_WRITE
            ),
            Err(RemoteAccessFault::NotPermitted)
        );
        let below = VirtAddr(region.address.0 - 1);
        assert_eq!(
            table.check_remote(pd, region.rkey, below, 1, AccessFlags::REMOTE_READ),
            Err(RemoteAccessFault::OutOfBounds)
        );
    }

    #[test]
    fn a_stale_key_never_reaches_a_new_region_in_the_same_slot() {
        let (mut table, region) = table();
        table.deregister(region.lkey).unwrap();
        let again = table
            .register(ProtectionDomain(0), 4096, AccessFlags::ALL)
            .unwrap();
        assert_ne!(again.lkey, region.lkey);
        assert_eq!(
            table.read_local(region.lkey, region.address, &mut [0u8; 1]),
            Err(VerbsError::UnknownLocalKey(region.lkey))
        );
    }

    #[test]
    fn gather_and_scatter_walk_a_list_across_elements() {
        let (mut table, region) = table();
        let list = ScatterGatherList::new(&[region.slice(0, 3), region.slice(100, 5)]).unwrap();
        table.scatter(&list, 1, &[1, 2, 3, 4]).unwrap();
        let mut bytes = [0u8; 8];
        table.gather(&list, 0, &mut bytes).unwrap();
        assert_eq!(bytes, [0, 1, 2, 3, 4, 0, 0, 0]);
        assert!(
            table.scatter(&list, 5, &[9; 4]).is_err(),
            "overruns the list"
        );
    }

    #[test]
    fn regions_are_separated_by_a_guard_gap() {
        let (mut table, region) = table();
        let next = table
            .register(ProtectionDomain(0), 16, AccessFlags::ALL)
            .unwrap();
        assert!(next.address.0 >= region.address.0 + region.length_bytes + GUARD_BYTES);
    }
}
