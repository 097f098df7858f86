//! The C ABI: rdma-core's `libibverbs.so.1`, served by a [`Node`].
//!
//! Every object a program receives is the C structure it expects, first
//! in a `#[repr(C)]` Rust object that holds the device's handle beside it,
//! so a pointer the program passes back is cast to its object. The casts
//! rely on the verbs contract: a program passes back only pointers this
//! library returned and has not yet destroyed. Pointers into the
//! program's own memory (work requests, attributes, inline data) are read
//! for the duration of the call only.
//!
//! From the bottom up:
//! - `device`: the device list and the `query_*` verbs;
//! - `work_request`: a program's work requests read into Remora's types;
//! - `resources`: PDs, MRs, CQs and completion channels, SRQs, AHs;
//! - `queue_pair`: QPs, posting, and the `ibv_qp_ex` request builder;
//! - `data_path`: `post_send`, `post_recv`, `poll_cq`;
//! - `context`: open and close, filling the operation tables;
//! - `exports`: the versioned symbol table.

mod async_events;
mod context;
mod data_path;
mod device;
mod exports;
mod queue_pair;
mod resources;
mod work_request;

use crate::config::VerbsConfig;
use crate::node::Node;
use remora_rnic::VerbsError;
use std::sync::{Arc, OnceLock};

/// The process's one device: its configuration, read once, and its node,
/// started by the first `ibv_open_device`.
struct Provider {
    config: Result<VerbsConfig, String>,
    node: OnceLock<Result<Arc<Node>, String>>,
}

fn provider() -> &'static Provider {
    static PROVIDER: OnceLock<Provider> = OnceLock::new();
    PROVIDER.get_or_init(|| Provider {
        config: VerbsConfig::from_environment().map_err(|error| error.to_string()),
        node: OnceLock::new(),
    })
}

/// Reports a configuration or start-up failure on one line of stderr,
/// once per process.
fn report_once(message: &str) {
    static REPORTED: OnceLock<()> = OnceLock::new();
    REPORTED.get_or_init(|| eprintln!("remora-verbs: {message}"));
}

fn set_errno(value: i32) {
    errno::set_errno(errno::Errno(value));
}

/// The errno a real provider returns for each refusal.
fn errno_of(error: &VerbsError) -> i32 {
    match error {
        VerbsError::QueueFull { .. }
        | VerbsError::TooManyObjects { .. }
        | VerbsError::AddressSpaceExhausted => libc::ENOMEM,
        VerbsError::RegionInUse | VerbsError::QueueInUse { .. } => libc::EBUSY,
        VerbsError::DeviceGone => libc::ENODEV,
        // A message longer than the device takes, inline data on a queue
        // pair created without room for it: rxe's EINVAL. No provider
        // returns EMSGSIZE from a post.
        VerbsError::MessageTooLong { .. } => libc::EINVAL,
        VerbsError::DatagramTooLarge { .. } => libc::EMSGSIZE,
        _ => libc::EINVAL,
    }
}
