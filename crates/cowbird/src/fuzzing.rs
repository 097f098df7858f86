//! The harness of the `cowbird_engine` fuzz target, kept in the crate so
//! findings replay as tests: a hostile compute node writes arbitrary
//! bytes into its block (tail words and metadata entries), and the Spot
//! engine, over two real soft RNICs, must refuse or serve them without a
//! panic and without touching memory outside the pool and the block.

use crate::deploy::{deploy, CowbirdSpec};
use crate::layout::RingSizes;
use crate::spot::SpotConfig;
use remora_rnic::back_to_back::BackToBack;
use std::time::Duration;

const POOL_BYTES: u64 = 4096;
/// Engine turns per input: enough for several batches.
const TURNS: usize = 64;

/// Runs the engine against a block holding `bytes` (from offset 0).
/// Returns how many engine turns ran before it stopped or refused.
pub fn hostile_block(bytes: &[u8]) -> usize {
    let mut fabric = BackToBack::new(7);
    let sizes = RingSizes {
        metadata_entries: 8,
        request_data_bytes: 4096,
        response_data_bytes: 4096,
    };
    let spec = CowbirdSpec {
        threads: 1,
        sizes,
        pool_regions: vec![POOL_BYTES],
        spot: SpotConfig {
            batch_entries: 4,
            ..SpotConfig::DEFAULT
        },
        ack_timeout: Duration::from_micros(100),
        direct: None,
        rpc: None,
    };
    let mut deployment =
        deploy(spec, &mut fabric.left, &mut fabric.right).expect("a fixed deployment works");
    let block = deployment.clients[0].block();
    let length = bytes.len().min(block.len());
    block.write(0, &bytes[..length]).expect("within the block");
    for turn in 0..TURNS {
        let now = fabric.now;
        if deployment.engine.turn(now, &mut fabric.right).is_err() {
            return turn;
        }
        fabric.run(1_000);
        fabric.now = fabric.now.saturating_add(Duration::from_micros(5));
    }
    TURNS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Entry, Kind, ENTRY_BYTES, METADATA_RING_AT};

    #[test]
    fn an_empty_block_is_probed_quietly() {
        assert_eq!(hostile_block(&[]), TURNS);
    }

    #[test]
    fn a_tail_far_ahead_with_garbage_entries_is_refused() {
        let mut bytes = vec![0xa5u8; 512];
        bytes[0..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(hostile_block(&bytes) < TURNS);
    }

    #[test]
    fn an_entry_outside_the_pool_is_refused() {
        let mut bytes = vec![0u8; 512];
        bytes[0..8].copy_from_slice(&1u64.to_le_bytes());
        let entry = Entry {
            kind: Kind::Read,
            region: 0,
            length: 64,
            request_address: POOL_BYTES - 8,
            response_address: 1024,
            sequence: 1,
        };
        let mut raw = [0u8; ENTRY_BYTES as usize];
        entry.emit(&mut raw);
        let at = METADATA_RING_AT as usize;
        bytes[at..at + raw.len()].copy_from_slice(&raw);
        assert!(hostile_block(&bytes) < TURNS);
    }
}
