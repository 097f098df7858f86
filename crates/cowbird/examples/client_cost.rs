//! The client library's own cost per request, with no engine: issue a
//! batch of reads, mark them complete as an engine would, collect them.
//! `cargo run --release -p remora-cowbird --example client_cost`.

use remora_cowbird::client::Client;
use remora_cowbird::layout::{RingSizes, READ_PROGRESS_AT};
use remora_rnic::HostMemory;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn main() -> Result<(), String> {
    let sizes = RingSizes::DEFAULT;
    let block = HostMemory::new(sizes.block_bytes() as usize);
    let mut client = Client::new(block.clone(), sizes, vec![1 << 20]).map_err(|e| e.to_string())?;
    let group = client.poll_create().map_err(|e| e.to_string())?;
    let mut responses = Vec::with_capacity(128);
    let mut bytes = [0u8; 64];
    let (mut issue, mut complete) = (Duration::ZERO, Duration::ZERO);
    let mut sequence = 0u64;
    let rounds = 20_000u64;
    for round in 0..rounds {
        let started = Instant::now();
        for index in 0..100u64 {
            let id = client
                .async_read(0, ((round * 100 + index) % 16_000) * 64, 64)
                .map_err(|e| e.to_string())?;
            client.poll_add(group, id).map_err(|e| e.to_string())?;
        }
        issue += started.elapsed();
        sequence += 100;
        block
            .store_u64(READ_PROGRESS_AT as usize, sequence, Ordering::Release)
            .map_err(|e| e.to_string())?;
        let started = Instant::now();
        responses.clear();
        client
            .poll_wait(group, &mut responses, usize::MAX, Duration::ZERO)
            .map_err(|e| e.to_string())?;
        for completion in &responses {
            client
                .response(completion, &mut bytes)
                .map_err(|e| e.to_string())?;
        }
        complete += started.elapsed();
        assert_eq!(responses.len(), 100);
    }
    let requests = (rounds * 100) as f64;
    println!(
        "issue {:.0} ns/request, completion {:.0} ns/request",
        issue.as_nanos() as f64 / requests,
        complete.as_nanos() as f64 / requests
    );
    Ok(())
}
