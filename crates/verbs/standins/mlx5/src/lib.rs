//! A stand-in for rdma-core's `libmlx5.so.1` (Mellanox direct verbs).
//! perftest links it; the real one imports rdma-core's private symbols and
//! will not load against Remora's libibverbs. Remora's device is not an
//! mlx5 device: every call reports EOPNOTSUPP, as rdma-core's own mlx5dv
//! calls do on a device of another vendor.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_int, c_void};

fn refuse() -> c_int {
    errno::set_errno(errno::Errno(libc::EOPNOTSUPP));
    libc::EOPNOTSUPP
}

fn refuse_pointer() -> *mut c_void {
    refuse();
    std::ptr::null_mut()
}

remora_verbs_exports::export! {
    "MLX5_1.0" fn mlx5dv_query_device(context: *mut c_void, attributes: *mut c_void) -> c_int as remora_mlx5dv_query_device { refuse() }
    "MLX5_1.2" fn mlx5dv_init_obj(object: *mut c_void, types: u64) -> c_int as remora_mlx5dv_init_obj { refuse() }
    "MLX5_1.3" fn mlx5dv_create_qp(context: *mut c_void, attributes: *mut c_void, mlx5_attributes: *mut c_void) -> *mut c_void as remora_mlx5dv_create_qp { refuse_pointer() }
    "MLX5_1.7" fn mlx5dv_open_device(device: *mut c_void, attributes: *mut c_void) -> *mut c_void as remora_mlx5dv_open_device { refuse_pointer() }
    "MLX5_1.7" fn mlx5dv_devx_general_cmd(context: *mut c_void, input: *const c_void, input_length: usize, output: *mut c_void, output_length: usize) -> c_int as remora_mlx5dv_devx_general_cmd { refuse() }
    "MLX5_1.8" fn mlx5dv_is_supported(device: *mut c_void) -> bool as remora_mlx5dv_is_supported { false }
    "MLX5_1.10" fn mlx5dv_create_mkey(attributes: *mut c_void) -> *mut c_void as remora_mlx5dv_create_mkey { refuse_pointer() }
    "MLX5_1.10" fn mlx5dv_destroy_mkey(mkey: *mut c_void) -> c_int as remora_mlx5dv_destroy_mkey { refuse() }
    "MLX5_1.10" fn mlx5dv_qp_ex_from_ibv_qp_ex(qp: *mut c_void) -> *mut c_void as remora_mlx5dv_qp_ex_from_ibv_qp_ex { refuse_pointer() }
    "MLX5_1.21" fn mlx5dv_crypto_login(context: *mut c_void, attributes: *mut c_void) -> c_int as remora_mlx5dv_crypto_login { refuse() }
    "MLX5_1.21" fn mlx5dv_dek_create(context: *mut c_void, attributes: *mut c_void) -> *mut c_void as remora_mlx5dv_dek_create { refuse_pointer() }
    "MLX5_1.21" fn mlx5dv_dek_destroy(key: *mut c_void) -> c_int as remora_mlx5dv_dek_destroy { refuse() }
}
