//! Clover, a passive disaggregated key-value store (issue 5), after
//! "Clover" as summarised in the in-network write-conflict resolution
//! paper (`papers/003`): every key is a linked list of versions in
//! memory-node regions that only RNICs touch; a write RDMA-WRITEs a new
//! entry and then CASes the old tail's next pointer from null to it.
//!
//! Built so far: [`layout`], the bytes of an entry and of the next pointer
//! that chains versions. The client state machines, the metadata server
//! and the resolver switch program come next.

pub mod client;
pub mod layout;
