//! The verbs drop-in's configuration: any text as `REMORA_VERBS` or as a
//! `REMORA_VERBS_CONFIG` file is a typed error or a checked configuration,
//! never a panic.
#![no_main]

use ibverbs::VerbsConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = VerbsConfig::from_spec(text) {
        let _ = config.validated();
    }
    if let Ok(config) = VerbsConfig::from_toml(text) {
        let _ = config.validated();
    }
});
