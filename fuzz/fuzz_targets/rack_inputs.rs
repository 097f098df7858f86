//! What the rack reads from outside: rack files and control-channel
//! messages. Neither may panic; bad input is a typed error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use remora_rack::control::{Reply, Request};
use remora_rack::RackConfig;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    match selector % 3 {
        0 => {
            if let Ok(text) = std::str::from_utf8(rest) {
                if let Ok(rack) = RackConfig::parse(text) {
                    assert!(!rack.nodes.is_empty());
                }
            }
        }
        1 => {
            if let Ok(Request::Connect { endpoint, .. }) = serde_json::from_slice::<Request>(rest) {
                let _ = remora_rnic::QueuePairEndpoint::try_from(endpoint);
            }
        }
        _ => {
            let _ = serde_json::from_slice::<Reply>(rest);
        }
    }
});
