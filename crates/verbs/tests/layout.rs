//! The checked-in bindings (`src/abi/bindings.rs`) against rdma-core's
//! header as gcc reads it: every structure the drop-in builds or reads,
//! its size and each field's offset. Skipped loudly without the header or
//! gcc, and failing instead where `REMORA_REQUIRE_PERFTEST` is set.

mod common;

use ibverbs::abi::*;
use std::mem::{offset_of, size_of};
use std::process::Command;

/// `(C expression, Rust value)` pairs: `sizeof(struct x)` and
/// `offsetof(struct x, field)`.
macro_rules! layout {
    ($($structure:ident { $($field:ident),* $(,)? })*) => {{
        let mut entries: Vec<(String, usize)> = Vec::new();
        $(
            entries.push((format!("sizeof(struct {})", stringify!($structure)), size_of::<$structure>()));
            $(
                entries.push((
                    format!("offsetof(struct {}, {})", stringify!($structure), stringify!($field)),
                    offset_of!($structure, $field),
                ));
            )*
        )*
        entries
    }};
}

fn rust_layout() -> Vec<(String, usize)> {
    layout! {
        ibv_device { node_type, transport_type, name, dev_name, dev_path, ibdev_path }
        ibv_context_ops { poll_cq, req_notify_cq, post_srq_recv, post_send, post_recv }
        ibv_context { device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat }
        verbs_context { query_port, create_cq_ex, query_device_ex, create_qp_ex, sz, context }
        ibv_device_attr { fw_ver, node_guid, max_mr_size, max_qp, max_qp_wr, max_sge, max_cqe, max_qp_rd_atom, atomic_cap, max_srq_sge, max_pkeys, phys_port_cnt }
        ibv_device_attr_ex { orig_attr, comp_mask }
        ibv_port_attr { state, max_mtu, active_mtu, gid_tbl_len, max_msg_sz, pkey_tbl_len, lid, active_width, phys_state, link_layer, flags, port_cap_flags2 }
        ibv_gid_entry { gid, gid_index, port_num, gid_type, ndev_ifindex }
        ibv_pd { context, handle }
        ibv_mr { context, pd, addr, length, handle, lkey, rkey }
        ibv_comp_channel { context, fd, refcnt }
        ibv_cq { context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed, async_events_completed }
        ibv_srq { context, srq_context, pd, handle, events_completed }
        ibv_srq_init_attr { srq_context, attr }
        ibv_qp { context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type, mutex, cond, events_completed }
        ibv_qp_ex { qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp, wr_rdma_read, wr_rdma_write, wr_send, wr_set_sge, wr_set_inline_data, wr_start, wr_complete, wr_abort, wr_atomic_write }
        ibv_qp_cap { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data }
        ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all }
        ibv_qp_init_attr_ex { cap, qp_type, sq_sig_all, comp_mask, pd, create_flags, send_ops_flags }
        ibv_qp_attr { qp_state, path_mtu, qkey, rq_psn, sq_psn, dest_qp_num, qp_access_flags, cap, ah_attr, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, timeout, retry_cnt, rnr_retry, rate_limit }
        ibv_ah_attr { grh, dlid, sl, is_global, port_num }
        ibv_global_route { dgid, flow_label, sgid_index, hop_limit, traffic_class }
        ibv_sge { addr, length, lkey }
        ibv_send_wr { wr_id, next, sg_list, num_sge, opcode, send_flags, wr, qp_type }
        ibv_recv_wr { wr_id, next, sg_list, num_sge }
        ibv_wc { wr_id, status, opcode, vendor_err, byte_len, qp_num, src_qp, wc_flags, pkey_index, slid, sl, dlid_path_bits }
        ibv_ah { context, pd, handle }
        ibv_data_buf { addr, length }
    }
}

#[test]
fn the_bindings_match_rdma_cores_header() {
    let header_found = std::path::Path::new(common::RDMA_HEADER).exists();
    if !common::available(header_found, "libibverbs-dev", "REMORA_REQUIRE_PERFTEST") {
        return;
    }
    let expected = rust_layout();
    let mut source = String::from("#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void) {\n");
    for (expression, _) in &expected {
        source.push_str(&format!("    printf(\"%zu\\n\", (size_t){expression});\n"));
    }
    source.push_str("    return 0;\n}\n");
    let directory =
        std::env::temp_dir().join(format!("remora-verbs-layout-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let program = directory.join("layout");
    std::fs::write(directory.join("layout.c"), source).unwrap();
    let compiled = Command::new("gcc")
        .arg(directory.join("layout.c"))
        .arg("-o")
        .arg(&program)
        .output()
        .expect("gcc");
    assert!(
        compiled.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let output = Command::new(&program).output().unwrap();
    std::fs::remove_dir_all(&directory).ok();
    let printed = String::from_utf8(output.stdout).unwrap();
    let from_gcc: Vec<usize> = printed.lines().map(|line| line.parse().unwrap()).collect();
    assert_eq!(from_gcc.len(), expected.len());
    let mismatches: Vec<String> = expected
        .iter()
        .zip(&from_gcc)
        .filter(|((_, rust), gcc)| rust != *gcc)
        .map(|((expression, rust), gcc)| format!("{expression}: Rust {rust}, gcc {gcc}"))
        .collect();
    assert!(
        mismatches.is_empty(),
        "layouts differ:\n{}",
        mismatches.join("\n")
    );
}
