//! Switch programs.

pub mod l2l3;
pub mod overlay;

pub use l2l3::{L2L3Forwarding, LEARN_DIGEST};
pub use overlay::{Claim, Overlaid, Overlay};
