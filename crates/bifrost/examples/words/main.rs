//! A user's own Bifröst service, end to end: `words.thrift` is its IDL,
//! `generated/words.rs` what Apache Thrift's compiler made of it
//! (`crates/bifrost/thrift/generate` regenerates it), and this file the
//! handler, the rack and a client.
//!
//! ```sh
//! cargo run --release -p remora-bifrost --example words
//! ```
//!
//! The service runs on a host of its own behind the Gatekeeper, with three
//! memory nodes. The client puts its text in global memory and passes the
//! pointer; the Gatekeeper lends it to the service for the call; `shout`
//! returns a new array of the service's, whose control the reply hands to
//! the client.

use remora_bifrost::by_reference::{
    application_error, from_idl, pass_by_reference, read_argument, return_array, to_idl,
};
use remora_bifrost::dsm::client::Dsm;
use remora_bifrost::dsm::rack::DsmRackConfig;
use remora_bifrost::dsm_service::DsmServiceRack;
use remora_bifrost::transport::{client_protocols_passing, Routing, ThriftService};
use std::sync::{Arc, OnceLock};

/// The generated code names the shared types `crate::bifrost`.
mod bifrost {
    pub use remora_bifrost::bifrost::*;
}

#[allow(
    clippy::all,
    dead_code,
    unused_variables,
    unused_mut,
    non_camel_case_types
)]
#[path = "generated/words.rs"]
mod words;

use words::{NoWords, TWordsSyncClient, WordsSyncClient, WordsSyncHandler, WordsSyncProcessor};

/// The handler: reads the text it is lent from global memory.
struct DsmWords {
    dsm: Arc<OnceLock<Dsm>>,
}

impl DsmWords {
    fn text(&self, pointer: &bifrost::GlobalPtr) -> thrift::Result<String> {
        let dsm = self
            .dsm
            .get()
            .ok_or_else(|| application_error("the DSM is not up yet".into()))?;
        let argument = from_idl(pointer)?;
        let bytes = read_argument(dsm, &argument)?;
        // The service may be asked again for the same allocation, after
        // its caller freed it and allocated anew: forget its size.
        dsm.forget(argument.allocation);
        String::from_utf8(bytes).map_err(|error| application_error(error.to_string()))
    }
}

impl WordsSyncHandler for DsmWords {
    fn handle_count(&self, text: bifrost::GlobalPtr) -> thrift::Result<i64> {
        Ok(self.text(&text)?.split_whitespace().count() as i64)
    }

    fn handle_shout(&self, text: bifrost::GlobalPtr) -> thrift::Result<bifrost::GlobalPtr> {
        let text = self.text(&text)?;
        if text.split_whitespace().next().is_none() {
            return Err(NoWords::new("nothing to shout".to_string()).into());
        }
        let dsm = self.dsm.get().expect("read above");
        return_array(dsm, text.to_uppercase().as_bytes())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rack = DsmServiceRack::start(
        DsmRackConfig::default(),
        Routing::Gatekeeper,
        &["count", "shout"],
        2,
        |dsm| {
            Box::new(ThriftService::new(WordsSyncProcessor::new(DsmWords {
                dsm,
            })))
        },
    )?;
    let dsm = &rack.dsm;
    let ((input, output), pointer) = client_protocols_passing(rack.path.clone());
    let mut client = WordsSyncClient::new(input, output);

    let text = "far memory without the RDMA NIC";
    let (allocation, arguments) = pass_by_reference(dsm, &[text.as_bytes()])?;
    pointer.pass(allocation.to_address());
    let words = client.count(to_idl(arguments[0]))?;
    println!("{text:?} holds {words} words");

    pointer.pass(allocation.to_address());
    let shouted = from_idl(&client.shout(to_idl(arguments[0]))?)?;
    let mut loud = vec![0u8; shouted.length];
    dsm.read(shouted.allocation, &mut loud)?;
    println!("shouted: {:?}", String::from_utf8_lossy(&loud));

    let (silence, empty) = pass_by_reference(dsm, &[b"   ".as_slice()])?;
    pointer.pass(silence.to_address());
    match client.shout(to_idl(empty[0])) {
        Err(thrift::Error::User(error)) => println!("shouting nothing: {error}"),
        other => return Err(format!("shouting nothing gave {other:?}").into()),
    }

    // The client controls all three arrays, the service's too.
    for ptr in [allocation, shouted.allocation, silence] {
        dsm.free(ptr)?;
    }
    if let Some(counters) = rack.gatekeeper_counters() {
        println!(
            "the Gatekeeper routed {} calls and allowed {} READs by the service under their leases",
            counters.calls_routed, counters.memory.reads_allowed
        );
    }
    Ok(())
}
