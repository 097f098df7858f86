//! How two unrelated processes share one ring segment: whichever binds the
//! rendezvous socket first creates the segment (a memfd) and hands its
//! descriptor to the other over the Unix socket (`SCM_RIGHTS`).
//!
//! The creator is the hub of a one-spoke star and takes the first node
//! address; the joiner is the spoke and takes the second. A socket file
//! left by a process that died is found (connecting is refused), removed
//! and bound again. The creator serves exactly one joiner, then removes
//! the socket file, so a third process gets a clear error, not a ring
//! someone else owns.

use remora_carrier::{CarrierError, RingPort, Segment, SegmentPlan};
use remora_wire::Ipv4Address;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Frames each ring holds.
const RING_DEPTH_FRAMES: u32 = 256;
/// The creator's and the joiner's node addresses (a private /24).
pub const CREATOR_ADDRESS: Ipv4Address = Ipv4Address([10, 77, 0, 1]);
pub const JOINER_ADDRESS: Ipv4Address = Ipv4Address([10, 77, 0, 2]);
/// How long a joiner waits for the creator's descriptor.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(10);
/// Bind attempts when a stale socket file is in the way.
const MAX_BIND_ATTEMPTS: usize = 3;

#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    #[error("rendezvous socket {path}: {operation}: {source}")]
    Socket {
        path: PathBuf,
        operation: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("rendezvous socket {0}: the creator sent no segment descriptor")]
    NoDescriptor(PathBuf),
    #[error("rendezvous socket {0}: could neither bind it nor reach a process on it")]
    Contended(PathBuf),
    #[error("shared segment: {0}")]
    Carrier(#[from] CarrierError),
}

/// This process's end of the shared segment (the port keeps the mapping).
pub struct Rendezvous {
    pub port: RingPort,
    pub address: Ipv4Address,
    pub peer: Ipv4Address,
}

impl Rendezvous {
    pub fn join_or_create(path: &Path) -> Result<Rendezvous, RendezvousError> {
        let socket_error = |operation, source| RendezvousError::Socket {
            path: path.to_path_buf(),
            operation,
            source,
        };
        // Deciding who creates is one step across processes: two that both
        // found a stale socket would otherwise each remove the other's new
        // one and create a segment of their own, and never meet.
        let deciding = DecisionLock::take(path).map_err(|error| socket_error("lock", error))?;
        for _ in 0..MAX_BIND_ATTEMPTS {
            match UnixListener::bind(path) {
                Ok(listener) => return Rendezvous::create(path, listener),
                Err(error) if error.kind() != std::io::ErrorKind::AddrInUse => {
                    return Err(socket_error("bind", error));
                }
                Err(_) => {}
            }
            match UnixStream::connect(path) {
                Ok(stream) => {
                    let joined = Rendezvous::join(path, stream)?;
                    // The pair has met: no one decides on this socket
                    // again, so its lock file goes too.
                    deciding
                        .remove()
                        .map_err(|error| socket_error("remove the lock", error))?;
                    return Ok(joined);
                }
                Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => {
                    // Its creator died: the file is stale.
                    std::fs::remove_file(path).map_err(|error| socket_error("remove", error))?;
                }
                Err(error) => return Err(socket_error("connect", error)),
            }
        }
        Err(RendezvousError::Contended(path.to_path_buf()))
    }

    fn create(path: &Path, listener: UnixListener) -> Result<Rendezvous, RendezvousError> {
        let segment = Segment::shared("remora-verbs", &SegmentPlan::star(1, RING_DEPTH_FRAMES))?;
        let port = segment.hub_port(1)?;
        let descriptor: OwnedFd = segment
            .shared_fd()?
            .try_clone_to_owned()
            .map_err(|source| RendezvousError::Socket {
                path: path.to_path_buf(),
                operation: "dup the segment",
                source,
            })?;
        let path_owned = path.to_path_buf();
        std::thread::Builder::new()
            .name("remora-verbs-rendezvous".into())
            .spawn(move || serve_one_joiner(&path_owned, &listener, &descriptor))
            .map_err(|source| RendezvousError::Socket {
                path: path.to_path_buf(),
                operation: "spawn the listener",
                source,
            })?;
        Ok(Rendezvous {
            port,
            address: CREATOR_ADDRESS,
            peer: JOINER_ADDRESS,
        })
    }

    fn join(path: &Path, stream: UnixStream) -> Result<Rendezvous, RendezvousError> {
        let socket_error = |operation, source| RendezvousError::Socket {
            path: path.to_path_buf(),
            operation,
            source,
        };
        stream
            .set_read_timeout(Some(HANDOVER_TIMEOUT))
            .map_err(|error| socket_error("set timeout", error))?;
        let descriptor = receive_descriptor(&stream)
            .map_err(|error| socket_error("receive the descriptor", error))?
            .ok_or_else(|| RendezvousError::NoDescriptor(path.to_path_buf()))?;
        let segment = Segment::attach(descriptor)?;
        let port = segment.spoke_port(1)?;
        Ok(Rendezvous {
            port,
            address: JOINER_ADDRESS,
            peer: CREATOR_ADDRESS,
        })
    }
}

/// An exclusive lock on a file beside the socket (`PATH.lock`), held while
/// a process binds, connects or removes a stale socket; released when it
/// drops. The joiner removes the file once the pair has met, so runs
/// leave no lock files behind.
struct DecisionLock {
    file: std::fs::File,
    path: PathBuf,
}

/// Attempts at locking a lock file that a finished pair removed meanwhile.
const MAX_LOCK_ATTEMPTS: usize = 8;

impl DecisionLock {
    fn take(socket: &Path) -> std::io::Result<DecisionLock> {
        let mut path = socket.as_os_str().to_owned();
        path.push(".lock");
        let path = PathBuf::from(path);
        for _ in 0..MAX_LOCK_ATTEMPTS {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)?;
            rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)?;
            // A lock file removed while this process waited for it locks
            // nothing another process can see: whoever opens the path now
            // gets a new file. The lock counts only on the file the path
            // still names.
            if is_same_file(&file, &path)? {
                return Ok(DecisionLock { file, path });
            }
        }
        Err(std::io::Error::other(format!(
            "{} was removed under each of {MAX_LOCK_ATTEMPTS} attempts to lock it",
            path.display()
        )))
    }

    /// Removes the lock file while still holding it.
    fn remove(self) -> std::io::Result<()> {
        std::fs::remove_file(&self.path)?;
        drop(self.file);
        Ok(())
    }
}

fn is_same_file(file: &std::fs::File, path: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let opened = file.metadata()?;
    match std::fs::metadata(path) {
        Ok(named) => Ok(opened.dev() == named.dev() && opened.ino() == named.ino()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(error),
    }
}

fn serve_one_joiner(path: &Path, listener: &UnixListener, descriptor: &OwnedFd) {
    if let Ok((stream, _)) = listener.accept() {
        if let Err(error) = send_descriptor(&stream, descriptor) {
            eprintln!("remora-verbs: rendezvous {}: {error}", path.display());
        }
    }
    // One joiner only; a later process must not attach to a ring in use.
    let _ = std::fs::remove_file(path);
}

fn send_descriptor(stream: &UnixStream, descriptor: &OwnedFd) -> std::io::Result<()> {
    let descriptors = [descriptor.as_fd()];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut ancillary = SendAncillaryBuffer::new(&mut space);
    ancillary.push(SendAncillaryMessage::ScmRights(&descriptors));
    rustix::net::sendmsg(
        stream,
        &[IoSlice::new(b"remora")],
        &mut ancillary,
        SendFlags::empty(),
    )?;
    Ok(())
}

fn receive_descriptor(stream: &UnixStream) -> std::io::Result<Option<OwnedFd>> {
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    let mut bytes = [0u8; 16];
    rustix::net::recvmsg(
        stream,
        &mut [IoSliceMut::new(&mut bytes)],
        &mut ancillary,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    for message in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(mut descriptors) = message {
            if let Some(descriptor) = descriptors.next() {
                return Ok(Some(descriptor));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two processes (threads here: flock locks are per open file) that
    /// both find a socket a crashed run left behind meet on one segment:
    /// one creates, the other joins.
    #[test]
    fn two_finding_a_stale_socket_at_once_meet() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("rendezvous.sock");
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists(), "a stale socket file");
        let (first, second) = std::thread::scope(|scope| {
            let first = scope.spawn(|| Rendezvous::join_or_create(&path));
            let second = scope.spawn(|| Rendezvous::join_or_create(&path));
            (first.join().unwrap(), second.join().unwrap())
        });
        let mut addresses = [first.unwrap().address, second.unwrap().address];
        addresses.sort();
        let mut expected = [CREATOR_ADDRESS, JOINER_ADDRESS];
        expected.sort();
        assert_eq!(addresses, expected);
    }

    /// Every pair that met left its `.lock` file behind (the benchmarks
    /// left one in /tmp per run). The joiner removes it once they meet.
    #[test]
    fn a_pair_that_met_leaves_no_lock_file() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("rendezvous.sock");
        let creator = Rendezvous::join_or_create(&path).unwrap();
        let joiner = Rendezvous::join_or_create(&path).unwrap();
        assert_eq!(
            (creator.address, joiner.address),
            (CREATOR_ADDRESS, JOINER_ADDRESS)
        );
        let left: Vec<_> = std::fs::read_dir(directory.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .filter(|name| name.to_string_lossy().ends_with(".lock"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
