//! Ports over sockets that carry one frame per datagram, batched with
//! `sendmmsg`/`recvmmsg`:
//!
//! - the UDP tunnel: each node has its own address (127.0.0.N or a host
//!   address) and the whole Ethernet frame rides as the UDP payload;
//! - AF_PACKET on a named interface: true L2, for veths in network
//!   namespaces and for real NICs.
//!
//! On veth, TX checksum offload leaves the kernel's own packets with
//! unfinished checksums when an AF_PACKET socket reads them. Remora's
//! frames are complete when they leave a soft RNIC (IPv4 checksum set, UDP
//! checksum zero as RoCEv2 sends it, ICRC appended) and the kernel does not
//! touch frames written to a packet socket, so they need no fix-up. The
//! rack keeps kernel traffic off its veths (no addresses, IPv6 off, the
//! control channel on Unix sockets); any stray kernel frame is passed up
//! and counted as a drop by the parser above, not mistaken for RoCE.

use crate::wait::WaitSource;
use crate::{check_frame_length, CarrierError, Port, SendStatus, MAX_CARRIED_FRAME_BYTES};
use remora_base::extend_bytes;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Frames per `sendmmsg`/`recvmmsg` call.
pub const BATCH_FRAMES: usize = 32;
const SOCKET_BUFFER_BYTES: usize = 8 << 20;
/// Room for a frame larger than any RoCE frame, so an oversized one shows
/// up as truncated rather than silently cut.
const RECEIVE_BUFFER_BYTES: usize = MAX_CARRIED_FRAME_BYTES + 64;

/// Counts of what a datagram port had to throw away.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DatagramDrops {
    /// Received datagrams longer than any frame (truncated or not).
    pub truncated: u64,
    /// Frames the kernel refused (buffer full, peer not there yet or
    /// unreachable, a firewall, over the MTU, the interface down), and the
    /// frames queued behind a send that failed the port.
    pub send_refused: u64,
}

/// Options for an AF_PACKET port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketSocketOptions {
    pub interface: String,
    /// Receive frames for any MAC (needed on real NICs; harmless on veth).
    pub promiscuous: bool,
}

/// A port on a socket.
pub struct DatagramPort {
    fd: OwnedFd,
    outgoing: Vec<Vec<u8>>,
    outgoing_count: usize,
    incoming: Vec<Vec<u8>>,
    drops: DatagramDrops,
    segmentation: Segmentation,
}

/// Whether runs of equal-sized frames leave as one UDP GSO send
/// (`UDP_SEGMENT`): the kernel then walks its send path once per run, not
/// once per frame, and the peer still receives one datagram per frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segmentation {
    /// A UDP socket whose kernel has not refused it yet.
    Offered,
    /// Not UDP (AF_PACKET), or the kernel refused it once: `sendmmsg`.
    Off,
}

/// `UDP_SEGMENT` from `linux/udp.h` (Linux 4.18), which the libc crate
/// does not name.
const UDP_SEGMENT: libc::c_int = 103;
/// The kernel's most segments in one GSO send (`UDP_MAX_SEGMENTS`).
const MAX_SEGMENTS: usize = 64;
/// The most payload bytes one GSO send carries: what one IPv4 datagram
/// could, before the kernel cuts it.
const MAX_SEGMENTED_BYTES: usize = 65_507;

/// Two UDP sockets bound to `left` and `right` (port 0 lets the kernel
/// pick), each with the address it was given: what the other end sends
/// to. For a launcher that hands one socket to a child process.
pub fn bind_pair(
    left: SocketAddr,
    right: SocketAddr,
) -> Result<[(UdpSocket, SocketAddr); 2], CarrierError> {
    let bind = |address: SocketAddr| -> Result<(UdpSocket, SocketAddr), CarrierError> {
        let socket =
            UdpSocket::bind(address).map_err(|error| CarrierError::io("bind UDP tunnel", error))?;
        let bound = socket
            .local_addr()
            .map_err(|error| CarrierError::io("read a bound UDP address", error))?;
        Ok((socket, bound))
    };
    Ok([bind(left)?, bind(right)?])
}

impl DatagramPort {
    /// The UDP tunnel: bound to `local`, connected to `peer`.
    pub fn udp(local: SocketAddr, peer: SocketAddr) -> Result<DatagramPort, CarrierError> {
        let socket =
            UdpSocket::bind(local).map_err(|error| CarrierError::io("bind UDP tunnel", error))?;
        DatagramPort::udp_on(socket, peer)
    }

    /// Two tunnel ends bound to `left` and `right` (port 0 lets the
    /// kernel pick) and connected to each other.
    pub fn udp_pair(
        left: SocketAddr,
        right: SocketAddr,
    ) -> Result<(DatagramPort, DatagramPort), CarrierError> {
        let [(left, left_address), (right, right_address)] = bind_pair(left, right)?;
        Ok((
            DatagramPort::udp_on(left, right_address)?,
            DatagramPort::udp_on(right, left_address)?,
        ))
    }

    /// The UDP tunnel on an already bound socket (say, one bound to port 0
    /// so the kernel picked a free port), connected to `peer`.
    pub fn udp_on(socket: UdpSocket, peer: SocketAddr) -> Result<DatagramPort, CarrierError> {
        socket
            .connect(peer)
            .map_err(|error| CarrierError::io("connect UDP tunnel", error))?;
        socket
            .set_nonblocking(true)
            .map_err(|error| CarrierError::io("set UDP tunnel non-blocking", error))?;
        let mut port = DatagramPort::from_fd(OwnedFd::from(socket))?;
        port.segmentation = Segmentation::Offered;
        Ok(port)
    }

    /// Sends every run of equal-sized frames with `sendmmsg` instead of
    /// UDP GSO: for comparisons, and for kernels that mis-handle it.
    pub fn without_segmentation(mut self) -> DatagramPort {
        self.segmentation = Segmentation::Off;
        self
    }

    pub fn segmentation(&self) -> Segmentation {
        self.segmentation
    }

    /// AF_PACKET on an interface. Needs CAP_NET_RAW.
    pub fn packet(options: &PacketSocketOptions) -> Result<DatagramPort, CarrierError> {
        let name = std::ffi::CString::new(options.interface.as_str()).map_err(|_| {
            CarrierError::Segment(format!(
                "interface name {:?} contains NUL",
                options.interface
            ))
        })?;
        // SAFETY: plain libc calls with valid arguments; results checked.
        unsafe {
            let index = libc::if_nametoindex(name.as_ptr());
            if index == 0 {
                return Err(CarrierError::io(
                    "find interface",
                    std::io::Error::last_os_error(),
                ));
            }
            let protocol = (libc::ETH_P_ALL as u16).to_be();
            // Protocol 0 until the bind names the interface (as libpcap
            // does): opened with ETH_P_ALL, the socket took every
            // interface's frames in the moment before the bind, and the
            // switch then handled eth0's as if they came from this port.
            let raw = libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            );
            if raw < 0 {
                return Err(CarrierError::io(
                    "open AF_PACKET socket (needs CAP_NET_RAW)",
                    std::io::Error::last_os_error(),
                ));
            }
            let fd = OwnedFd::from_raw_fd(raw);
            let mut address: libc::sockaddr_ll = std::mem::zeroed();
            address.sll_family = libc::AF_PACKET as u16;
            address.sll_protocol = protocol;
            address.sll_ifindex = index as i32;
            let bound = libc::bind(
                raw,
                &address as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            if bound < 0 {
                return Err(CarrierError::io(
                    "bind AF_PACKET socket",
                    std::io::Error::last_os_error(),
                ));
            }
            // Do not hand our own transmissions back to us.
            set_option(raw, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &1i32)?;
            if options.promiscuous {
                let mut membership: libc::packet_mreq = std::mem::zeroed();
                membership.mr_ifindex = index as i32;
                membership.mr_type = libc::PACKET_MR_PROMISC as u16;
                set_option(
                    raw,
                    libc::SOL_PACKET,
                    libc::PACKET_ADD_MEMBERSHIP,
                    &membership,
                )?;
            }
            DatagramPort::from_fd(fd)
        }
    }

    fn from_fd(fd: OwnedFd) -> Result<DatagramPort, CarrierError> {
        let size = SOCKET_BUFFER_BYTES as i32;
        // Best effort: larger buffers absorb bursts; the defaults still work.
        let _ = set_option(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, &size);
        let _ = set_option(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, &size);
        Ok(DatagramPort {
            fd,
            outgoing: (0..BATCH_FRAMES)
                .map(|_| Vec::with_capacity(MAX_CARRIED_FRAME_BYTES))
                .collect(),
            outgoing_count: 0,
            incoming: (0..BATCH_FRAMES)
                .map(|_| vec![0u8; RECEIVE_BUFFER_BYTES])
                .collect(),
            drops: DatagramDrops::default(),
            segmentation: Segmentation::Off,
        })
    }

    pub fn drops(&self) -> DatagramDrops {
        self.drops
    }

    pub fn local_address(&self) -> Option<SocketAddr> {
        // SAFETY: a borrowed view of our own fd, not closed here.
        let socket =
            std::mem::ManuallyDrop::new(unsafe { UdpSocket::from_raw_fd(self.fd.as_raw_fd()) });
        socket.local_addr().ok()
    }
}

impl DatagramPort {
    /// How many frames from `start` on one GSO send can carry: frames of
    /// the first one's size, the last of them possibly shorter, within the
    /// kernel's limits. 1 when segmentation is off.
    fn segment_run(&self, start: usize) -> usize {
        if self.segmentation == Segmentation::Off {
            return 1;
        }
        let pending = &self.outgoing[start..self.outgoing_count];
        let segment_bytes = pending[0].len();
        let mut total_bytes = segment_bytes;
        let mut run = 1;
        for frame in &pending[1..] {
            let length = frame.len();
            // An empty frame makes no segment: in a run, it vanished
            // while the send counted it sent.
            if run == MAX_SEGMENTS
                || length == 0
                || length > segment_bytes
                || total_bytes + length > MAX_SEGMENTED_BYTES
            {
                break;
            }
            run += 1;
            total_bytes += length;
            if length < segment_bytes {
                break;
            }
        }
        run
    }

    /// One `sendmmsg` of frames `start..end`; returns how many left or
    /// were dropped (at least one).
    fn send_each(&mut self, start: usize, end: usize) -> Result<usize, CarrierError> {
        // SAFETY: all zero bits are a valid iovec (null, length zero).
        let mut iovecs: [libc::iovec; BATCH_FRAMES] = unsafe { std::mem::zeroed() };
        let pending = &mut self.outgoing[start..end];
        let count = pending.len();
        let mut headers = message_headers(pending, |buffer| buffer.len(), &mut iovecs);
        // SAFETY: headers point at `count` live buffers of their length.
        let result = unsafe {
            libc::sendmmsg(
                self.fd.as_raw_fd(),
                headers.as_mut_ptr(),
                count as u32,
                libc::MSG_DONTWAIT,
            )
        };
        if result > 0 {
            return Ok(result as usize);
        }
        let error = std::io::Error::last_os_error();
        if result == 0 || loses_only_a_frame(&error) {
            // Like a full switch queue: drop the frame that failed, count
            // it, let RC recover, and try the rest.
            self.drops.send_refused += 1;
            return Ok(1);
        }
        Err(CarrierError::io("sendmmsg", error))
    }

    /// One GSO `sendmsg` of the `run` frames from `start`: one iovec per
    /// frame, cut by the kernel at the first frame's size. A kernel that
    /// refuses the option turns segmentation off and the frames go by
    /// `sendmmsg` instead.
    fn send_segmented(&mut self, start: usize, run: usize) -> Result<usize, CarrierError> {
        debug_assert!((2..=MAX_SEGMENTS.min(BATCH_FRAMES)).contains(&run));
        let segment_bytes = self.outgoing[start].len() as u16;
        // SAFETY: all zero bits are a valid iovec (null, length zero).
        let mut iovecs: [libc::iovec; BATCH_FRAMES] = unsafe { std::mem::zeroed() };
        for (iovec, frame) in iovecs
            .iter_mut()
            .zip(&mut self.outgoing[start..start + run])
        {
            *iovec = libc::iovec {
                iov_base: frame.as_mut_ptr() as *mut libc::c_void,
                iov_len: frame.len(),
            };
        }
        // A cmsghdr and a u16, aligned as the kernel reads it.
        let mut control = [0u64; 4];
        // SAFETY: all zero bits are a valid msghdr (null name, no iovecs).
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        message.msg_iov = iovecs.as_mut_ptr();
        message.msg_iovlen = run;
        message.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        // SAFETY: CMSG_SPACE only computes a size.
        message.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as usize;
        // SAFETY: `control` holds CMSG_SPACE(2) bytes, so the first header
        // and its two data bytes lie inside it.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&message);
            (*header).cmsg_level = libc::SOL_UDP;
            (*header).cmsg_type = UDP_SEGMENT;
            (*header).cmsg_len = libc::CMSG_LEN(2) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(header) as *mut u16, segment_bytes);
        }
        // SAFETY: the message points at live iovecs and control bytes.
        let result = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &message, libc::MSG_DONTWAIT) };
        if result >= 0 {
            return Ok(run);
        }
        let error = std::io::Error::last_os_error();
        // Asked first: ENOPROTOOPT is also a pending ICMP report, which
        // costs only a frame, but taken for one here, a kernel that
        // refuses the option would lose a frame at every send. Taken for a
        // refusal, a report only turns segmentation off.
        if matches!(
            error.raw_os_error(),
            Some(libc::EINVAL | libc::EIO | libc::ENOPROTOOPT | libc::EOPNOTSUPP)
        ) {
            self.segmentation = Segmentation::Off;
            return self.send_each(start, start + run);
        }
        if loses_only_a_frame(&error) {
            self.drops.send_refused += 1;
            return Ok(1);
        }
        Err(CarrierError::io("sendmsg with UDP_SEGMENT", error))
    }
}

fn set_option<T>(fd: i32, level: i32, name: i32, value: &T) -> Result<(), CarrierError> {
    // SAFETY: `value` is a live T of the size passed.
    let result = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            value as *const T as *const libc::c_void,
            std::mem::size_of::<T>() as u32,
        )
    };
    if result < 0 {
        return Err(CarrierError::io(
            "setsockopt",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// One `mmsghdr` per buffer, each with one iovec, for either direction.
fn message_headers(
    buffers: &mut [Vec<u8>],
    lengths: impl Fn(&Vec<u8>) -> usize,
    iovecs: &mut [libc::iovec; BATCH_FRAMES],
) -> [libc::mmsghdr; BATCH_FRAMES] {
    // SAFETY: all-zero is a valid mmsghdr (null name and control).
    let mut headers: [libc::mmsghdr; BATCH_FRAMES] = unsafe { std::mem::zeroed() };
    for (index, buffer) in buffers.iter_mut().enumerate() {
        iovecs[index] = libc::iovec {
            iov_base: buffer.as_mut_ptr() as *mut libc::c_void,
            iov_len: lengths(buffer),
        };
    }
    for (index, header) in headers.iter_mut().enumerate().take(buffers.len()) {
        header.msg_hdr.msg_iov = &mut iovecs[index];
        header.msg_hdr.msg_iovlen = 1;
    }
    headers
}

/// Whether `error` costs a frame, not the port: the socket has no room or
/// nothing to give (`EAGAIN`, `EINTR`, `ENOBUFS`), the network said the
/// peer is not there (yet) or not reachable (`ECONNREFUSED`,
/// `EHOSTUNREACH`, `ENETUNREACH`, `EHOSTDOWN`: ICMP reports on a connected
/// socket, while a peer starts or a route flaps), a firewall dropped it on
/// the way out (`EPERM`), or the frame is over the link's MTU
/// (`EMSGSIZE`), the interface is down (`ENETDOWN`: AF_PACKET while a
/// link is down, and once pending after it went down), or a pending ICMP
/// report on a connected socket (`EPROTO` for a parameter problem,
/// `ENOPROTOOPT` for protocol unreachable, `ENONET` for a host isolated).
/// The frame is lost, as on a wire, and RC recovers; taken for the port's
/// failure, any of these ended a switch port for good.
fn loses_only_a_frame(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(
            libc::EAGAIN
                | libc::EINTR
                | libc::ENOBUFS
                | libc::ECONNREFUSED
                | libc::EHOSTUNREACH
                | libc::ENETUNREACH
                | libc::EHOSTDOWN
                | libc::EPERM
                | libc::EMSGSIZE
                | libc::ENETDOWN
                | libc::EPROTO
                | libc::ENOPROTOOPT
                | libc::ENONET
        )
    )
}

impl Port for DatagramPort {
    fn receive(
        &mut self,
        max_frames: usize,
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, CarrierError> {
        let wanted = max_frames.min(BATCH_FRAMES);
        if wanted == 0 {
            return Ok(0);
        }
        // SAFETY: an iovec is a pointer and a length, for which all zero
        // bits (a null pointer, length zero) are a valid value.
        let mut iovecs: [libc::iovec; BATCH_FRAMES] = unsafe { std::mem::zeroed() };
        let mut headers = message_headers(
            &mut self.incoming[..wanted],
            |buffer| buffer.len(),
            &mut iovecs,
        );
        // SAFETY: headers point at `wanted` live buffers of their stated length.
        let received = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                headers.as_mut_ptr(),
                wanted as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if received < 0 {
            let error = std::io::Error::last_os_error();
            if loses_only_a_frame(&error) {
                return Ok(0);
            }
            return Err(CarrierError::io("recvmmsg", error));
        }
        let mut delivered = 0;
        for (header, buffer) in headers.iter().zip(&self.incoming).take(received as usize) {
            if header.msg_hdr.msg_flags & libc::MSG_TRUNC != 0
                || header.msg_len as usize > MAX_CARRIED_FRAME_BYTES
            {
                self.drops.truncated += 1;
                continue;
            }
            sink(&buffer[..header.msg_len as usize]);
            delivered += 1;
        }
        Ok(delivered)
    }

    fn send(&mut self, frame: &[u8]) -> Result<SendStatus, CarrierError> {
        check_frame_length(frame, MAX_CARRIED_FRAME_BYTES)?;
        if self.outgoing_count == BATCH_FRAMES {
            self.flush()?;
        }
        let slot = &mut self.outgoing[self.outgoing_count];
        slot.clear();
        extend_bytes(slot, frame);
        self.outgoing_count += 1;
        Ok(SendStatus::Queued)
    }

    fn flush(&mut self) -> Result<(), CarrierError> {
        let mut sent = 0;
        // Each round sends or drops at least one frame, so the loop is
        // bounded by the batch size.
        while sent < self.outgoing_count {
            let run = self.segment_run(sent);
            let outcome = if run >= 2 {
                self.send_segmented(sent, run)
            } else {
                let mut end = sent + 1;
                while end < self.outgoing_count && self.segment_run(end) < 2 {
                    end += 1;
                }
                self.send_each(sent, end)
            };
            match outcome {
                Ok(count) => sent += count,
                Err(error) => {
                    // The frames left are lost with the port: counted.
                    self.drops.send_refused += (self.outgoing_count - sent) as u64;
                    self.outgoing_count = 0;
                    return Err(error);
                }
            }
        }
        self.outgoing_count = 0;
        Ok(())
    }

    fn has_room(&mut self) -> bool {
        true
    }

    fn has_frames(&mut self) -> bool {
        false
    }

    fn drops(&self) -> crate::PortDrops {
        crate::PortDrops {
            refused_by_kernel: self.drops.send_refused,
            truncated_on_receive: self.drops.truncated,
            ..crate::PortDrops::default()
        }
    }

    fn wait_source(&self) -> WaitSource {
        WaitSource::Fd(self.fd.as_raw_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ICMP "host unreachable" on a connected socket, a firewall's
    /// drop or an over-MTU frame took the port out of service for good
    /// (a switch port never came back); each now costs only its frame.
    #[test]
    fn network_refusals_cost_a_frame_and_real_faults_the_port() {
        for errno in [
            libc::EAGAIN,
            libc::ECONNREFUSED,
            libc::EHOSTUNREACH,
            libc::ENETUNREACH,
            libc::EHOSTDOWN,
            libc::EPERM,
            libc::EMSGSIZE,
        ] {
            let error = std::io::Error::from_raw_os_error(errno);
            assert!(loses_only_a_frame(&error), "{error}");
        }
        for errno in [libc::EBADF, libc::ENOTSOCK, libc::EFAULT] {
            let error = std::io::Error::from_raw_os_error(errno);
            assert!(!loses_only_a_frame(&error), "{error}");
        }
    }
}
