fn main() {
    remora_verbs_exports::emit_link_args("libibverbs.so.1", "version.map");
}
