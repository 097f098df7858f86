fn main() {
    remora_verbs_exports::emit_link_args("librdmacm.so.1", "version.map");
}
