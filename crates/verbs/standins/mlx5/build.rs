fn main() {
    remora_verbs_exports::emit_link_args("libmlx5.so.1", "version.map");
}
