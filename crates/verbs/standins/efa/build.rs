fn main() {
    remora_verbs_exports::emit_link_args("libefa.so.1", "version.map");
}
