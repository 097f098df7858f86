//! Newtypes for numbers that share a machine type but must never be mixed.

use std::fmt;

const MASK_24_BITS: u32 = 0x00ff_ffff;

/// A 24-bit packet sequence number with wrapping serial-number arithmetic.
///
/// PSNs wrap at 2^24, so plain `<` is wrong near the wrap. Comparisons use
/// the signed distance in a 24-bit ring: `a` precedes `b` when `b` lies
/// within 2^23 ahead of `a`. There is deliberately no `Ord`, because that
/// relation is not transitive over the whole ring.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    pub const MAX: u32 = MASK_24_BITS;

    /// Keeps the low 24 bits, as the wire does.
    pub const fn new(value: u32) -> Psn {
        Psn(value & MASK_24_BITS)
    }

    pub const fn value(self) -> u32 {
        self.0
    }

    pub const fn add(self, count: u32) -> Psn {
        Psn::new(self.0.wrapping_add(count))
    }

    pub const fn sub(self, count: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(count))
    }

    /// Signed distance from `self` to `later`, in [-2^23, 2^23).
    pub const fn distance_to(self, later: Psn) -> i32 {
        let raw = later.0.wrapping_sub(self.0) & MASK_24_BITS;
        // Sign-extend bit 23.
        ((raw << 8) as i32) >> 8
    }

    pub const fn precedes(self, other: Psn) -> bool {
        self.distance_to(other) > 0
    }

    pub const fn precedes_or_equals(self, other: Psn) -> bool {
        self.distance_to(other) >= 0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "Psn({})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}", self.0)
    }
}

/// A 24-bit queue pair number.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Qpn(u32);

impl Qpn {
    pub const MAX: u32 = MASK_24_BITS;

    /// Returns `None` for values that do not fit 24 bits.
    pub const fn new(value: u32) -> Option<Qpn> {
        if value > MASK_24_BITS {
            None
        } else {
            Some(Qpn(value))
        }
    }

    pub(crate) const fn from_wire(value: u32) -> Qpn {
        Qpn(value & MASK_24_BITS)
    }

    pub const fn value(self) -> u32 {
        self.0
    }
}

impl fmt::Debug for Qpn {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "Qpn({:#x})", self.0)
    }
}

impl fmt::Display for Qpn {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{:#x}", self.0)
    }
}

/// A 24-bit message sequence number, carried in the AETH.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
pub struct Msn(u32);

impl Msn {
    pub const fn new(value: u32) -> Msn {
        Msn(value & MASK_24_BITS)
    }

    pub const fn value(self) -> u32 {
        self.0
    }

    pub const fn next(self) -> Msn {
        Msn::new(self.0.wrapping_add(1))
    }
}

/// Remote key: names a memory region to a remote peer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Rkey(pub u32);

impl fmt::Debug for Rkey {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "Rkey({:#010x})", self.0)
    }
}

/// Partition key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Pkey(pub u16);

impl Pkey {
    /// The default full-membership partition.
    pub const DEFAULT: Pkey = Pkey(0xffff);
    /// The top bit: a full member, not a limited one.
    const FULL_MEMBER: u16 = 0x8000;

    /// Whether a port holding this key takes a packet carrying `packet`
    /// (IBA's P_Key check): the same partition (the low 15 bits), and not
    /// two limited members.
    pub fn admits(self, packet: Pkey) -> bool {
        let same_partition = (self.0 ^ packet.0) & !Self::FULL_MEMBER == 0;
        let a_full_member = (self.0 | packet.0) & Self::FULL_MEMBER != 0;
        same_partition && a_full_member
    }
}

impl Default for Pkey {
    fn default() -> Pkey {
        Pkey::DEFAULT
    }
}

/// A virtual address in a peer's registered memory.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct VirtAddr(pub u64);

impl VirtAddr {
    pub const fn value(self) -> u64 {
        self.0
    }

    pub const fn checked_add(self, offset_bytes: u64) -> Option<VirtAddr> {
        match self.0.checked_add(offset_bytes) {
            Some(sum) => Some(VirtAddr(sum)),
            None => None,
        }
    }
}

impl fmt::Debug for VirtAddr {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "VirtAddr({:#x})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn psn_wraps_at_24_bits() {
        let last = Psn::new(Psn::MAX);
        assert_eq!(last.add(1), Psn::new(0));
        assert!(last.precedes(Psn::new(0)));
        assert!(!Psn::new(0).precedes(last));
        assert_eq!(Psn::new(0).sub(1), last);
        assert_eq!(last.distance_to(Psn::new(5)), 6);
        assert_eq!(Psn::new(5).distance_to(last), -6);
    }

    #[test]
    fn qpn_rejects_values_over_24_bits() {
        assert!(Qpn::new(0x0100_0000).is_none());
        assert_eq!(Qpn::new(0x00ff_ffff).map(Qpn::value), Some(0x00ff_ffff));
    }

    proptest! {
        #[test]
        fn psn_distance_is_antisymmetric(a in 0u32..=Psn::MAX, step in 1u32..(1 << 23)) {
            let start = Psn::new(a);
            let later = start.add(step);
            prop_assert_eq!(start.distance_to(later), step as i32);
            prop_assert_eq!(later.distance_to(start), -(step as i32));
            prop_assert!(start.precedes(later));
            prop_assert!(!later.precedes(start));
        }
    }
}
