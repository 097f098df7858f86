//! The two-sided baseline of the probe benchmark: the compute node SENDs
//! a request (pool offset, length) and the memory node's CPU answers with
//! a SEND of the record. [`RpcServer`] is that server, sans-IO over the
//! memory node's NIC.
//!
//! Slot `i` pairs receive buffer `i` with reply buffer `i`; a receive is
//! reposted only once its reply has been sent, so a reply buffer is never
//! rewritten while the NIC may still read it.

use remora_rnic::{
    CompletionOpcode, CompletionQueue, CompletionStatus, MemoryRegion, QueuePair, ReceiveRequest,
    SendOperation, SendRequest, Verbs, VerbsError,
};
use remora_wire::VirtAddr;

/// A request: the pool offset (8 bytes) and the length (4 bytes), LE.
pub const REQUEST_BYTES: u32 = 12;

pub fn encode_request(offset: u64, length: u32) -> [u8; REQUEST_BYTES as usize] {
    let mut bytes = [0u8; REQUEST_BYTES as usize];
    bytes[..8].copy_from_slice(&offset.to_le_bytes());
    bytes[8..].copy_from_slice(&length.to_le_bytes());
    bytes
}

#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    #[error("a verb completed with {0:?}")]
    Completion(CompletionStatus),
    #[error("the RPC baseline's server does not survive a restart of its node")]
    NotRestartable,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RpcStats {
    pub requests: u64,
    /// Requests refused: malformed, or outside the pool (answered empty).
    pub refused: u64,
}

pub struct RpcServer {
    queue_pair: QueuePair,
    completion_queue: CompletionQueue,
    /// Receive buffers then reply buffers, `slots` of `slot_bytes` each.
    buffers: MemoryRegion,
    slots: u64,
    slot_bytes: u32,
    pool: MemoryRegion,
    stats: RpcStats,
    /// One reused buffer for the record a reply carries: the baseline
    /// allocated and zeroed one per request, which the engines it is
    /// measured against do not (found by reading).
    record: Vec<u8>,
}

/// Completions one turn takes.
const COMPLETIONS_PER_TURN: usize = 256;

impl RpcServer {
    /// A server on `queue_pair`, with `buffers` holding `2 × slots` slots
    /// of `slot_bytes`; posts every receive.
    pub fn new(
        rnic: &mut dyn Verbs,
        queue_pair: QueuePair,
        completion_queue: CompletionQueue,
        buffers: MemoryRegion,
        slots: u64,
        slot_bytes: u32,
        pool: MemoryRegion,
    ) -> Result<RpcServer, RpcError> {
        assert!(buffers.length_bytes >= 2 * slots * u64::from(slot_bytes));
        assert!(slot_bytes >= REQUEST_BYTES);
        let server = RpcServer {
            queue_pair,
            completion_queue,
            buffers,
            slots,
            slot_bytes,
            pool,
            stats: RpcStats::default(),
            record: Vec::new(),
        };
        for slot in 0..slots {
            server.post_receive(rnic, slot)?;
        }
        Ok(server)
    }

    pub fn stats(&self) -> RpcStats {
        self.stats
    }

    fn receive_at(&self, slot: u64) -> u64 {
        slot * u64::from(self.slot_bytes)
    }

    fn reply_at(&self, slot: u64) -> u64 {
        (self.slots + slot) * u64::from(self.slot_bytes)
    }

    fn post_receive(&self, rnic: &mut dyn Verbs, slot: u64) -> Result<(), RpcError> {
        let local = self.buffers.slice(self.receive_at(slot), self.slot_bytes);
        rnic.post_receive(self.queue_pair, ReceiveRequest::new(slot, &[local])?)?;
        Ok(())
    }

    /// Answers requests that arrived; reposts receives whose replies left.
    pub fn turn(&mut self, rnic: &mut dyn Verbs) -> Result<bool, RpcError> {
        let mut moved = false;
        for _ in 0..COMPLETIONS_PER_TURN {
            let Some(completion) = rnic.poll_completion(self.completion_queue)? else {
                break;
            };
            moved = true;
            if completion.status != CompletionStatus::Success {
                return Err(RpcError::Completion(completion.status));
            }
            let slot = completion.work_request_id;
            match completion.opcode {
                CompletionOpcode::Receive => self.answer(rnic, slot, completion.byte_len)?,
                _ => self.post_receive(rnic, slot)?,
            }
        }
        Ok(moved)
    }

    /// Reads the request in receive slot `slot` and SENDs the record, or
    /// an empty reply for a request it cannot serve.
    fn answer(&mut self, rnic: &mut dyn Verbs, slot: u64, received: u32) -> Result<(), RpcError> {
        self.stats.requests += 1;
        let mut request = [0u8; REQUEST_BYTES as usize];
        let at = VirtAddr(self.buffers.address.0 + self.receive_at(slot));
        rnic.read_local(self.buffers.lkey, at, &mut request)?;
        let offset = u64::from_le_bytes(request[..8].try_into().expect("8 bytes"));
        let length = u32::from_le_bytes(request[8..].try_into().expect("4 bytes"));
        let fits = offset
            .checked_add(u64::from(length))
            .is_some_and(|end| end <= self.pool.length_bytes);
        let length = match received == REQUEST_BYTES && fits && length <= self.slot_bytes {
            true => length,
            false => {
                self.stats.refused += 1;
                0
            }
        };
        if length > 0 {
            let mut record = std::mem::take(&mut self.record);
            record.resize(length as usize, 0);
            let from = VirtAddr(self.pool.address.0 + offset);
            let to = VirtAddr(self.buffers.address.0 + self.reply_at(slot));
            let copied = rnic
                .read_local(self.pool.lkey, from, &mut record)
                .and_then(|()| rnic.write_local(self.buffers.lkey, to, &record));
            self.record = record;
            copied?;
        }
        let local = self.buffers.slice(self.reply_at(slot), length);
        let elements: &[_] = if length == 0 { &[] } else { &[local] };
        let reply = SendRequest::new(slot, SendOperation::Send { immediate: None }, elements)?;
        rnic.post_send(self.queue_pair, reply)?;
        Ok(())
    }
}

impl remora_host::Agent for RpcServer {
    fn name(&self) -> &'static str {
        "cowbird-rpc-server"
    }

    fn poll(
        &mut self,
        _now: remora_base::Timestamp,
        nic: &mut dyn Verbs,
    ) -> Result<remora_host::Progress, remora_host::AgentError> {
        self.turn(nic)
            .map(remora_host::Progress::from_moved)
            .map_err(|error| remora_host::AgentError::system("cowbird-rpc-server", error))
    }

    fn poll_timeout(&self) -> Option<remora_base::Timestamp> {
        None
    }

    fn crash(&mut self) {}

    fn restart(
        &mut self,
        _now: remora_base::Timestamp,
        _nic: &mut dyn Verbs,
    ) -> Result<(), remora_host::AgentError> {
        Err(remora_host::AgentError::system(
            "cowbird-rpc-server",
            RpcError::NotRestartable,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_rnic::back_to_back::BackToBack;
    use remora_rnic::{AccessFlags, DataPath, QueuePairBuilder};

    /// A client on the left, the server on the right: a good request gets
    /// its record, a request past the pool gets an empty reply.
    #[test]
    fn requests_are_answered_and_bad_ones_refused_with_an_empty_reply() {
        let mut fabric = BackToBack::new(3);
        let (left, right) = (&mut fabric.left, &mut fabric.right);
        let left_pd = left.alloc_protection_domain().unwrap();
        let local = left
            .register_memory(left_pd, 4096, AccessFlags::ALL)
            .unwrap();
        let left_cq = left.create_completion_queue(16).unwrap();
        let right_pd = right.alloc_protection_domain().unwrap();
        let pool = right
            .register_memory(right_pd, 1024, AccessFlags::ALL)
            .unwrap();
        right
            .write_local(pool.lkey, VirtAddr(pool.address.0 + 64), &[9u8; 32])
            .unwrap();
        let buffers = right
            .register_memory(right_pd, 4 * 64, AccessFlags::ALL)
            .unwrap();
        let right_cq = right.create_completion_queue(16).unwrap();
        let (client, server_qp) = fabric
            .connect(
                &QueuePairBuilder::new(left_pd, left_cq, left_cq),
                &QueuePairBuilder::new(right_pd, right_cq, right_cq),
            )
            .unwrap();
        let mut server =
            RpcServer::new(&mut fabric.right, server_qp, right_cq, buffers, 2, 64, pool).unwrap();
        for (index, (offset, expected)) in [(64u64, 32u32), (1000, 0)].into_iter().enumerate() {
            let at = index as u64 * 128;
            fabric
                .left
                .write_local(
                    local.lkey,
                    VirtAddr(local.address.0 + at),
                    &encode_request(offset, 32),
                )
                .unwrap();
            let receive = ReceiveRequest::new(1, &[local.slice(at + 64, 64)]).unwrap();
            fabric.left.post_receive(client, receive).unwrap();
            let send = SendRequest::new(
                2,
                SendOperation::Send { immediate: None },
                &[local.slice(at, REQUEST_BYTES)],
            )
            .unwrap();
            fabric.left.post_send(client, send).unwrap();
            for _ in 0..4 {
                fabric.run(100);
                server.turn(&mut fabric.right).unwrap();
            }
            let mut received = None;
            while let Some(completion) = fabric.left.poll_completion(left_cq).unwrap() {
                if completion.opcode == CompletionOpcode::Receive {
                    received = Some(completion.byte_len);
                }
            }
            assert_eq!(received, Some(expected));
        }
        let mut record = [0u8; 32];
        fabric
            .left
            .read_local(local.lkey, VirtAddr(local.address.0 + 64), &mut record)
            .unwrap();
        assert_eq!(record, [9u8; 32]);
        assert_eq!(
            server.stats(),
            RpcStats {
                requests: 2,
                refused: 1
            }
        );
    }
}
