//! Services written in Thrift IDL, compiled by Apache Thrift's compiler,
//! run unchanged over Bifröst: the generated clients call the generated
//! processors through Bifröst's runtime, across a path that loses datagrams,
//! and every call runs once.

use remora_bifrost::services::{
    EchoSyncClient, EchoSyncHandler, EchoSyncProcessor, PingSyncClient, PingSyncHandler,
    PingSyncProcessor, TEchoSyncClient, TPingSyncClient,
};
use remora_bifrost::transport::{
    client_protocols, thrift_method_name, InProcessPath, ThriftService,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

struct Pinged(Arc<AtomicU64>);

impl PingSyncHandler for Pinged {
    fn handle_ping(&self) -> thrift::Result<()> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

struct Echoed(Arc<AtomicU64>);

impl EchoSyncHandler for Echoed {
    fn handle_echo(&self, data: Vec<u8>) -> thrift::Result<Vec<u8>> {
        self.0.fetch_add(1, Ordering::Relaxed);
        if data == b"fail" {
            return Err(thrift::Error::Application(thrift::ApplicationError::new(
                thrift::ApplicationErrorKind::InternalError,
                "asked to fail",
            )));
        }
        Ok(data.into_iter().rev().collect())
    }
}

#[test]
fn generated_clients_call_generated_processors_over_bifrost() {
    let runs = Arc::new(AtomicU64::new(0));
    let service = ThriftService::new(PingSyncProcessor::new(Pinged(Arc::clone(&runs))));
    // Every third datagram is lost, either way.
    let (input, output) = client_protocols(InProcessPath::new(Box::new(service), 3));
    let mut client = PingSyncClient::new(input, output);
    for _ in 0..100 {
        client.ping().unwrap();
    }
    assert_eq!(
        runs.load(Ordering::Relaxed),
        100,
        "each ping ran exactly once"
    );

    let echoes = Arc::new(AtomicU64::new(0));
    let service = ThriftService::new(EchoSyncProcessor::new(Echoed(Arc::clone(&echoes))));
    let (input, output) = client_protocols(InProcessPath::new(Box::new(service), 4));
    let mut client = EchoSyncClient::new(input, output);
    for size in [0usize, 1, 29, 1000, 3000] {
        let data: Vec<u8> = (0..size).map(|byte| byte as u8).collect();
        let reversed: Vec<u8> = data.iter().rev().copied().collect();
        assert_eq!(client.echo(data).unwrap(), reversed);
    }
    // A handler's error reaches the caller as Thrift's application error.
    assert!(matches!(
        client.echo(b"fail".to_vec()),
        Err(thrift::Error::Application(_))
    ));
    assert_eq!(echoes.load(Ordering::Relaxed), 6);
}

#[test]
fn method_names_come_from_the_thrift_message() {
    let mut message = 0x8001_0001u32.to_be_bytes().to_vec();
    message.extend_from_slice(&4u32.to_be_bytes());
    message.extend_from_slice(b"ping");
    assert_eq!(thrift_method_name(&message), Some("ping"));
    assert_eq!(thrift_method_name(&message[..9]), None);
    assert_eq!(thrift_method_name(b"\0\0\0\0"), None);
}

/// The same generated client and processor across the embedded rack: the
/// client's thread hands each call to an agent on the compute host; RPCs
/// cross the switch as datagrams to the server agent on another host,
/// straight or routed by the Gatekeeper in the switch.
#[test]
fn generated_clients_call_across_the_embedded_rack() {
    use remora_bifrost::transport::Routing;
    for routing in [Routing::Bypass, Routing::Gatekeeper] {
        echo_across_the_rack(routing);
    }
}

fn echo_across_the_rack(routing: remora_bifrost::transport::Routing) {
    use remora_bifrost::transport::ServiceRack;
    let echoes = Arc::new(AtomicU64::new(0));
    let service = ThriftService::new(EchoSyncProcessor::new(Echoed(Arc::clone(&echoes))));
    let ServiceRack { rack: _rack, path } =
        ServiceRack::start(Box::new(service), routing, &["echo"]).unwrap();
    let (input, output) = client_protocols(path);
    let mut client = EchoSyncClient::new(input, output);
    for round in 0..200u32 {
        let data = round.to_be_bytes().to_vec();
        let reversed: Vec<u8> = data.iter().rev().copied().collect();
        assert_eq!(client.echo(data).unwrap(), reversed);
    }
    assert_eq!(echoes.load(Ordering::Relaxed), 200);
}

/// A call's arguments are a peer's bytes. The thrift crate's reader
/// allocates a length as it reads it, so a negative one panicked with a
/// capacity overflow (on the fabric thread, stopping the whole embedded
/// rack) and a huge one asked for gigabytes. Such calls now fail as
/// malformed, and the service goes on answering.
#[test]
fn a_call_with_a_negative_or_huge_length_fails_without_a_panic() {
    use remora_bifrost::rpc::Service;
    let echoes = Arc::new(AtomicU64::new(0));
    let mut service = ThriftService::new(EchoSyncProcessor::new(Echoed(Arc::clone(&echoes))));
    let header = |name_length: i32| {
        let mut bytes = 0x8001_0001u32.to_be_bytes().to_vec();
        bytes.extend_from_slice(&name_length.to_be_bytes());
        bytes
    };
    let mut echo_with_data_length = header(4);
    echo_with_data_length.extend_from_slice(b"echo");
    echo_with_data_length.extend_from_slice(&1i32.to_be_bytes());
    // Field 1, a binary, whose length is given below.
    echo_with_data_length.extend_from_slice(&[11, 0, 1]);
    for call in [
        header(-1),
        header(i32::MAX),
        [&echo_with_data_length[..], &(-1i32).to_be_bytes()].concat(),
        [&echo_with_data_length[..], &i32::MAX.to_be_bytes()].concat(),
    ] {
        // A bad header fails the call; a bad argument is answered, as
        // Thrift answers it, with an exception message (type 3).
        match service.call(b"echo", Default::default(), &call) {
            Err(_) => {}
            Ok(answer) => assert_eq!(answer.body.get(..4), Some(&[0x80, 1, 0, 3][..])),
        }
    }
    assert_eq!(echoes.load(Ordering::Relaxed), 0);
    let (input, output) = client_protocols(InProcessPath::new(Box::new(service), 0));
    let mut client = EchoSyncClient::new(input, output);
    assert_eq!(client.echo(b"ab".to_vec()).unwrap(), b"ba");
}
