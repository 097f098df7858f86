//! The device list, contexts, and what `query_*` tells of the device.

use super::async_events::AsyncEvents;
use super::{provider, report_once, set_errno};
use crate::abi::*;
use crate::node::Node;
use remora_rnic::{CompletionQueue, Lkey, SharedReceiveQueue, Verbs};
use remora_wire::{Ipv4Address, Qpn};
use std::ffi::{c_char, c_int};
use std::sync::{Arc, Mutex, OnceLock};

pub(super) const DEVICE_NAME: &str = "remora0";
/// Memory regions, queue pairs and so on, as `ibv_query_device` reports
/// them: the soft RNIC's own limits (`RnicConfig::new`).
const MAX_OBJECTS: c_int = 1024;
pub(super) const MAX_QUEUE_DEPTH: c_int = 16_384;
pub(super) const MAX_SCATTER_GATHER: c_int = remora_rnic::MAX_SCATTER_GATHER_ELEMENTS as c_int;
pub(super) const MAX_READ_ATOMIC: c_int = 16;
pub(super) const MAX_MESSAGE_BYTES: u32 = 1 << 24;
pub(super) const MAX_REGION_BYTES: u64 = 1 << 30;

/// A context: `verbs_context` first, so the `ibv_context` at its end is
/// where rdma-core's inline functions expect it.
#[repr(C)]
pub(super) struct ContextObject {
    pub verbs: verbs_context,
    pub node: Arc<Node>,
    /// Its asynchronous events, and the descriptor `async_fd` names.
    pub events: Arc<AsyncEvents>,
    /// What the program made on the device through this context and has
    /// not destroyed.
    owned: Mutex<Owned>,
}

/// What a context made on the device and the program has not destroyed:
/// closing the device takes it down, as the kernel does for a closed
/// context. Left up, a closed context's region still took a peer's WRITE
/// into memory the program had freed, and its queues held device slots
/// for the process's life. (Protection domains hold nothing on the device
/// a program can reach.)
#[derive(Default)]
pub(super) struct Owned {
    /// With each, the region of its inline staging, if it has one.
    pub queue_pairs: Vec<(Qpn, Option<Lkey>)>,
    pub regions: Vec<Lkey>,
    pub completion_queues: Vec<CompletionQueue>,
    pub shared_receive_queues: Vec<SharedReceiveQueue>,
}

impl ContextObject {
    pub(super) fn new(
        verbs: verbs_context,
        node: Arc<Node>,
        events: Arc<AsyncEvents>,
    ) -> ContextObject {
        ContextObject {
            verbs,
            node,
            events,
            owned: Mutex::new(Owned::default()),
        }
    }

    pub(super) fn owned(&self) -> std::sync::MutexGuard<'_, Owned> {
        self.owned
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes down what the program left: its queue pairs first (no more
    /// traffic, and no posted work names a region or a queue), then the
    /// queues and regions, so nothing on the device points into the
    /// program's memory after.
    pub(super) fn take_down_what_is_left(&self) {
        let owned = std::mem::take(&mut *self.owned());
        // Outside the device's lock, which `disarm` takes.
        for queue in &owned.completion_queues {
            self.node.disarm(*queue);
        }
        self.node.with_device(|rnic| {
            for (qpn, inline) in owned.queue_pairs {
                super::queue_pair::retire_with_staging(rnic, qpn, inline);
            }
            for queue in owned.shared_receive_queues {
                let _ = rnic.destroy_shared_receive_queue(queue);
            }
            for queue in owned.completion_queues {
                let _ = rnic.destroy_completion_queue(queue);
            }
            for lkey in owned.regions {
                let _ = rnic.deregister_memory(lkey);
            }
        });
    }
}

/// The context object behind an `ibv_context` this library created.
///
/// # Safety
/// `context` came from [`ibv_open_device`] and is not yet closed.
pub(super) unsafe fn context_object<'a>(context: *mut ibv_context) -> &'a ContextObject {
    let offset = std::mem::offset_of!(verbs_context, context);
    // SAFETY: the caller's promise; the ibv_context is the last field of
    // the verbs_context that opens a ContextObject.
    unsafe { &*context.cast::<u8>().sub(offset).cast::<ContextObject>() }
}

/// The node behind a context.
///
/// # Safety
/// As [`context_object`].
pub(super) unsafe fn node_of<'a>(context: *mut ibv_context) -> &'a Arc<Node> {
    // SAFETY: the caller's promise.
    unsafe { &context_object(context).node }
}

fn copy_name(into: &mut [c_char], text: &str) {
    for (slot, byte) in into.iter_mut().zip(text.bytes()) {
        *slot = byte as c_char;
    }
}

struct DevicePointer(*mut ibv_device);
// SAFETY: the device is written once, before it is shared, then only read.
unsafe impl Send for DevicePointer {}
// SAFETY: as above.
unsafe impl Sync for DevicePointer {}

pub(super) fn device() -> *mut ibv_device {
    static DEVICE: OnceLock<DevicePointer> = OnceLock::new();
    DEVICE
        .get_or_init(|| {
            let mut device = ibv_device {
                node_type: IBV_NODE_CA,
                transport_type: IBV_TRANSPORT_IB,
                ..Default::default()
            };
            copy_name(&mut device.name, DEVICE_NAME);
            copy_name(&mut device.dev_name, "uverbs0");
            copy_name(&mut device.dev_path, "/sys/class/infiniband_verbs/uverbs0");
            copy_name(&mut device.ibdev_path, "/sys/class/infiniband/remora0");
            DevicePointer(Box::into_raw(Box::new(device)))
        })
        .0
}

/// The device list: one Remora device, or none (with errno) when the
/// configuration is bad.
pub(super) unsafe fn get_device_list(count: *mut c_int) -> *mut *mut ibv_device {
    let found = match &provider().config {
        Ok(_) => 1,
        Err(message) => {
            report_once(message);
            set_errno(libc::EINVAL);
            if !count.is_null() {
                // SAFETY: a non-null out-parameter of the caller.
                unsafe { *count = 0 };
            }
            return std::ptr::null_mut();
        }
    };
    if !count.is_null() {
        // SAFETY: as above.
        unsafe { *count = found };
    }
    let list: Box<[*mut ibv_device; 2]> = Box::new([device(), std::ptr::null_mut()]);
    Box::into_raw(list).cast()
}

pub(super) unsafe fn free_device_list(list: *mut *mut ibv_device) {
    if !list.is_null() {
        // SAFETY: lists come from get_device_list, a boxed pair.
        drop(unsafe { Box::from_raw(list.cast::<[*mut ibv_device; 2]>()) });
    }
}

pub(super) fn device_name(device_pointer: *mut ibv_device) -> *const c_char {
    if device_pointer != device() {
        set_errno(libc::ENODEV);
        return std::ptr::null();
    }
    c"remora0".as_ptr()
}

/// The node GUID, from the node's address (big-endian, as rdma-core).
pub(super) fn guid_of(address: Ipv4Address) -> u64 {
    let [a, b, c, d] = address.0;
    u64::from_be_bytes([0x02, 0x52, 0x4d, 0x52, a, b, c, d]).to_be()
}

/// The GUID `ibv_devices` lists, before any open: from the started
/// node's address, or else the one the configuration gives (it was 0
/// until the device was opened; found by reading). A shared-memory node
/// learns its address from the rendezvous, so until it starts its GUID
/// is 0.
pub(super) fn device_guid(device_pointer: *mut ibv_device) -> u64 {
    let _ = device_pointer;
    let provider = provider();
    let address = match provider.node.get() {
        Some(Ok(node)) => Some(node.address()),
        _ => provider
            .config
            .as_ref()
            .ok()
            .and_then(|config| config.address_before_start()),
    };
    address.map_or(0, guid_of)
}

pub(super) fn node() -> Result<Arc<Node>, String> {
    let provider = provider();
    let config = provider.config.as_ref().map_err(Clone::clone)?;
    provider
        .node
        .get_or_init(|| Node::start(config).map_err(|error| error.to_string()))
        .clone()
}

fn device_attributes(address: Ipv4Address) -> ibv_device_attr {
    let mut attributes = ibv_device_attr {
        node_guid: guid_of(address),
        sys_image_guid: guid_of(address),
        max_mr_size: MAX_REGION_BYTES,
        page_size_cap: 4096,
        max_qp: MAX_OBJECTS,
        max_qp_wr: MAX_QUEUE_DEPTH,
        max_sge: MAX_SCATTER_GATHER,
        max_sge_rd: MAX_SCATTER_GATHER,
        max_cq: MAX_OBJECTS,
        max_cqe: MAX_QUEUE_DEPTH,
        max_mr: MAX_OBJECTS,
        max_pd: c_int::MAX,
        max_qp_rd_atom: MAX_READ_ATOMIC,
        max_res_rd_atom: MAX_READ_ATOMIC * MAX_OBJECTS,
        max_qp_init_rd_atom: MAX_READ_ATOMIC,
        atomic_cap: IBV_ATOMIC_HCA,
        max_ah: MAX_OBJECTS,
        max_srq: MAX_OBJECTS,
        max_srq_wr: MAX_QUEUE_DEPTH,
        max_srq_sge: MAX_SCATTER_GATHER,
        max_pkeys: 1,
        local_ca_ack_delay: 0,
        phys_port_cnt: 1,
        ..Default::default()
    };
    copy_name(
        &mut attributes.fw_ver,
        concat!("remora-", env!("CARGO_PKG_VERSION")),
    );
    attributes
}

pub(super) unsafe fn query_device(context: *mut ibv_context, into: *mut ibv_device_attr) -> c_int {
    if context.is_null() || into.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live context and an out-parameter of the caller.
    unsafe { *into = device_attributes(node_of(context).address()) };
    0
}

pub(super) unsafe extern "C" fn query_device_extended(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    into: *mut ibv_device_attr_ex,
    size_bytes: usize,
) -> c_int {
    // SAFETY: a non-null input is the caller's.
    if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
        return libc::EINVAL;
    }
    if into.is_null() || size_bytes < std::mem::size_of::<ibv_device_attr>() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's buffer holds `size_bytes`: all of it is zeroed,
    // as rdma-core does (a caller built with a newer, longer struct read
    // its tail as stack garbage), and the attributes this library knows
    // written over the start.
    unsafe {
        std::ptr::write_bytes(into.cast::<u8>(), 0, size_bytes);
        (*into).orig_attr = device_attributes(node_of(context).address());
    }
    0
}

fn port_attributes() -> ibv_port_attr {
    ibv_port_attr {
        state: IBV_PORT_ACTIVE,
        max_mtu: IBV_MTU_4096,
        active_mtu: IBV_MTU_4096,
        gid_tbl_len: 1,
        max_msg_sz: MAX_MESSAGE_BYTES,
        pkey_tbl_len: 1,
        active_width: 1,
        active_speed: 1,
        phys_state: 5,
        link_layer: IBV_LINK_LAYER_ETHERNET as u8,
        ..Default::default()
    }
}

/// `ibv_query_port` as exported: rdma-core's inline wrapper prefers the
/// extended operation below, and older binaries call this one.
pub(super) unsafe fn query_port(
    context: *mut ibv_context,
    port: u8,
    into: *mut ibv_port_attr,
) -> c_int {
    if context.is_null() || into.is_null() || port != 1 {
        return libc::EINVAL;
    }
    // SAFETY: the exported symbol's argument is the legacy struct, a
    // prefix of ibv_port_attr without the last fields; write that prefix.
    unsafe {
        let length = std::mem::offset_of!(ibv_port_attr, flags);
        let attributes = port_attributes();
        std::ptr::copy_nonoverlapping(
            (&raw const attributes).cast::<u8>(),
            into.cast::<u8>(),
            length,
        );
    }
    0
}

pub(super) unsafe extern "C" fn query_port_extended(
    context: *mut ibv_context,
    port: u8,
    into: *mut ibv_port_attr,
    size_bytes: usize,
) -> c_int {
    if context.is_null() || into.is_null() || port != 1 {
        return libc::EINVAL;
    }
    let length = size_bytes.min(std::mem::size_of::<ibv_port_attr>());
    let attributes = port_attributes();
    // SAFETY: the caller's buffer holds `size_bytes`: zeroed whole, as
    // rdma-core's `__lib_query_port` does for a longer caller's struct,
    // then the part this library knows copied in.
    unsafe {
        std::ptr::write_bytes(into.cast::<u8>(), 0, size_bytes);
        std::ptr::copy_nonoverlapping(
            (&raw const attributes).cast::<u8>(),
            into.cast::<u8>(),
            length,
        )
    };
    0
}

/// The RoCEv2 GID of an IPv4 address: `::ffff:a.b.c.d`.
pub fn gid_of(address: Ipv4Address) -> ibv_gid {
    let mut raw = [0u8; 16];
    raw[10] = 0xff;
    raw[11] = 0xff;
    raw[12..].copy_from_slice(&address.0);
    ibv_gid { raw }
}

/// The IPv4 address inside an IPv4-mapped GID.
pub fn address_of(gid: &ibv_gid) -> Option<Ipv4Address> {
    // SAFETY: every bit pattern is a valid byte array.
    let raw = unsafe { gid.raw };
    let mapped = raw[..10].iter().all(|byte| *byte == 0) && raw[10] == 0xff && raw[11] == 0xff;
    mapped.then(|| Ipv4Address([raw[12], raw[13], raw[14], raw[15]]))
}

pub(super) unsafe fn query_gid(
    context: *mut ibv_context,
    port: u8,
    index: c_int,
    into: *mut ibv_gid,
) -> c_int {
    if context.is_null() || into.is_null() || port != 1 || index != 0 {
        return -1;
    }
    // SAFETY: a live context and the caller's out-parameter.
    unsafe { *into = gid_of(node_of(context).address()) };
    0
}

pub(super) unsafe fn query_gid_extended(
    context: *mut ibv_context,
    port: u32,
    index: u32,
    into: *mut ibv_gid_entry,
    flags: u32,
    size_bytes: usize,
) -> c_int {
    if context.is_null() || into.is_null() || flags != 0 {
        return libc::EINVAL;
    }
    if port != 1 || index != 0 {
        return libc::ENODATA;
    }
    if size_bytes < std::mem::size_of::<ibv_gid_entry>() {
        return libc::EINVAL;
    }
    let entry = ibv_gid_entry {
        // SAFETY: a live context.
        gid: gid_of(unsafe { node_of(context) }.address()),
        gid_index: 0,
        port_num: 1,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: 0,
    };
    // SAFETY: the caller's out-parameter.
    unsafe { *into = entry };
    0
}

/// rdma-core's private `ibv_query_gid_type`, which perftest calls: 1 is
/// `IBV_GID_TYPE_SYSFS_ROCE_V2`.
pub(super) unsafe fn query_gid_type(
    context: *mut ibv_context,
    port: u8,
    index: u32,
    into: *mut u32,
) -> c_int {
    if context.is_null() || into.is_null() || port != 1 || index != 0 {
        return -1;
    }
    // SAFETY: the caller's out-parameter.
    unsafe { *into = 1 };
    0
}

pub(super) unsafe fn query_pkey(
    context: *mut ibv_context,
    port: u8,
    index: c_int,
    into: *mut u16,
) -> c_int {
    if context.is_null() || into.is_null() || port != 1 || index != 0 {
        return -1;
    }
    // SAFETY: the caller's out-parameter; the default P_Key, big-endian.
    unsafe { *into = 0xffffu16.to_be() };
    0
}
