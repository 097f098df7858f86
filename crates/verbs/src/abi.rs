//! rdma-core 44's public structures and constants, generated from
//! `infiniband/verbs.h` by bindgen (`abi/generate`) and checked against the
//! header by `tests/layout.rs`, which compiles the same offsets with gcc.

#![allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc,
    clippy::useless_transmute,
    clippy::too_many_arguments,
    clippy::ptr_offset_with_cast
)]

include!("abi/bindings.rs");

/// `__VERBS_ABI_IS_EXTENDED`: an `ibv_context` whose `abi_compat` holds
/// this sits at the end of a `verbs_context`.
pub const VERBS_ABI_IS_EXTENDED: usize = usize::MAX;
