//! Versioned C symbols from Rust, as rdma-core's libraries export them.
//!
//! A program linked against rdma-core asks for `ibv_reg_mr@IBVERBS_1.1`,
//! not for `ibv_reg_mr`: the dynamic loader refuses a library that does not
//! define that version. rustc hands the linker its own (unversioned)
//! export list, so a second version script cannot version Rust's symbols.
//! Instead each function is defined under a private name and given its
//! public, versioned name with the assembler's `.symver` directive, in the
//! same crate (the directive must sit beside the definition). The version
//! nodes themselves come from the library's version script (its
//! `build.rs` passes it with [`emit_link_args`]).
//!
//! ```ignore
//! remora_verbs_exports::export! {
//!     "RDMACM_1.0" fn rdma_create_event_channel() -> *mut c_void => remora_rdma_create_event_channel;
//! }
//! ```

#![forbid(unsafe_code)]

/// Defines `extern "C"` functions under a private name and binds each to
/// `public@@VERSION`. The body is an expression over the arguments.
#[macro_export]
macro_rules! export {
    ($(
        $version:literal fn $public:ident ( $($argument:ident : $type:ty),* $(,)? ) $(-> $return:ty)?
            as $private:ident $body:block
    )*) => {
        $(
            #[no_mangle]
            #[allow(unused_variables, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $private($($argument: $type),*) $(-> $return)? $body
            ::std::arch::global_asm!(concat!(
                ".symver ", stringify!($private), ", ", stringify!($public), "@@", $version
            ));
        )*
    };
}

/// Called from a library's `build.rs`: gives its cdylib the `soname`
/// programs were linked against and the version nodes of the crate's
/// `version_script` file.
pub fn emit_link_args(soname: &str, version_script: &str) {
    let directory = std::env::var("CARGO_MANIFEST_DIR").expect("run by cargo");
    let script = format!("{directory}/{version_script}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={script}");
    println!("cargo:rerun-if-changed={script}");
}
