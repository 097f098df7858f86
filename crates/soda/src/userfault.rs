//! The userfaultfd calls SODA needs, over `rustix` ioctls and the kernel's
//! own structures from `linux-raw-sys`: register a range for missing-page
//! and write-protect faults, read fault events, install a chunk
//! (`UFFDIO_COPY`), change write protection, wake waiters and poison pages.
//!
//! This module and `mapping` are the crate's only unsafe code.

use linux_raw_sys::general::{
    uffdio_api, uffdio_copy, uffdio_poison, uffdio_range, uffdio_register, uffdio_writeprotect,
    UFFDIO_COPY_MODE_WP, UFFDIO_REGISTER_MODE_MISSING, UFFDIO_REGISTER_MODE_WP, UFFD_API,
    UFFD_EVENT_PAGEFAULT, UFFD_FEATURE_PAGEFAULT_FLAG_WP, UFFD_FEATURE_POISON,
    UFFD_PAGEFAULT_FLAG_WP, UFFD_PAGEFAULT_FLAG_WRITE,
};
use rustix::event::{poll, PollFd, PollFlags};
use rustix::fd::{AsFd, OwnedFd};
use rustix::io::Errno;
use rustix::ioctl::{ioctl, opcode, Opcode, Updater};
use std::time::Duration;

const GROUP: u8 = 0xAA;
pub(crate) const API: Opcode = opcode::read_write::<uffdio_api>(GROUP, 0x3F);
pub(crate) const REGISTER: Opcode = opcode::read_write::<uffdio_register>(GROUP, 0x00);
pub(crate) const UNREGISTER: Opcode = opcode::read::<uffdio_range>(GROUP, 0x01);
pub(crate) const WAKE: Opcode = opcode::read::<uffdio_range>(GROUP, 0x02);
pub(crate) const COPY: Opcode = opcode::read_write::<uffdio_copy>(GROUP, 0x03);
pub(crate) const WRITE_PROTECT: Opcode = opcode::read_write::<uffdio_writeprotect>(GROUP, 0x06);
pub(crate) const POISON: Opcode = opcode::read_write::<uffdio_poison>(GROUP, 0x08);

/// Test builds only: the next this many `UFFDIO_COPY` calls fail with
/// ENOMEM, as under a memory cgroup at its limit (which a test cannot
/// bring about without meeting the OOM killer).
#[cfg(test)]
pub(crate) static INJECTED_SHORTAGES: std::sync::atomic::AtomicU32 =
    std::sync::atomic::AtomicU32::new(0);

/// Test builds only: the next `UFFDIO_COPY` installs its first page and
/// then fails with ENOMEM, as a copy cut short by a shortage does.
#[cfg(test)]
pub(crate) static INJECTED_PARTIAL_COPY: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Bytes of one `struct uffd_msg`.
const MESSAGE_BYTES: usize = 32;

/// One page fault the kernel reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub address: usize,
    /// A write to a missing page (a read otherwise).
    pub write: bool,
    /// A write to a present but write-protected page.
    pub write_protected: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum UserfaultError {
    #[error("userfaultfd is not available ({0}); it needs Linux 5.7 or later and root or vm.unprivileged_userfaultfd=1")]
    Unavailable(Errno),
    #[error(
        "the kernel lacks userfaultfd feature {0} (write-protect faults need 5.7, poison 6.6)"
    )]
    MissingFeature(&'static str),
    #[error("{call}: {errno}")]
    Call { call: &'static str, errno: Errno },
}

fn call_error(call: &'static str) -> impl Fn(Errno) -> UserfaultError {
    move |errno| UserfaultError::Call { call, errno }
}

fn range(start: usize, length: usize) -> uffdio_range {
    uffdio_range {
        start: start as u64,
        len: length as u64,
    }
}

/// What installing a chunk did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    Copied,
    /// Some page was already there (another handler got there first).
    AlreadyPresent,
}

pub struct Userfault {
    fd: OwnedFd,
}

impl Userfault {
    /// Opens a userfaultfd with write-protect faults (for dirty tracking),
    /// on a kernel that also has poison (for objects whose data is lost).
    /// Without poison a fault on lost data could only be left unserved,
    /// and its thread would hang, so such a kernel is refused.
    pub fn open() -> Result<Userfault, UserfaultError> {
        let flags = rustix::mm::UserfaultfdFlags::CLOEXEC | rustix::mm::UserfaultfdFlags::NONBLOCK;
        // SAFETY: the descriptor handles faults only for ranges this process
        // registers on it, and every such range is served by this crate's
        // handlers until it is unregistered.
        let fd = unsafe { rustix::mm::userfaultfd(flags) }.map_err(UserfaultError::Unavailable)?;
        let mut api = uffdio_api {
            api: UFFD_API.into(),
            features: u64::from(UFFD_FEATURE_PAGEFAULT_FLAG_WP),
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes one uffdio_api, which `api` is.
        unsafe { ioctl(&fd, Updater::<API, uffdio_api>::new(&mut api)) }
            .map_err(|_| UserfaultError::MissingFeature("write-protect faults"))?;
        if !probe_poison() {
            return Err(UserfaultError::MissingFeature("poison"));
        }
        Ok(Userfault { fd })
    }

    /// Sends missing-page and write-protect faults in the range here.
    pub fn register(&self, start: usize, length: usize) -> Result<(), UserfaultError> {
        let mut register = uffdio_register {
            range: range(start, length),
            mode: u64::from(UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP),
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes one uffdio_register.
        unsafe {
            ioctl(
                &self.fd,
                Updater::<REGISTER, uffdio_register>::new(&mut register),
            )
        }
        .map_err(call_error("UFFDIO_REGISTER"))
    }

    pub fn unregister(&self, start: usize, length: usize) -> Result<(), UserfaultError> {
        let mut range = range(start, length);
        // SAFETY: UFFDIO_UNREGISTER reads one uffdio_range.
        unsafe {
            ioctl(
                &self.fd,
                Updater::<UNREGISTER, uffdio_range>::new(&mut range),
            )
        }
        .map_err(call_error("UFFDIO_UNREGISTER"))
    }

    /// Copies `data` into the registered range at `start` (page aligned)
    /// and wakes the threads waiting there. With `write_protected`, the
    /// first write to the pages faults again, which is how writes are seen.
    pub fn install(
        &self,
        start: usize,
        data: &[u8],
        write_protected: bool,
    ) -> Result<Installed, UserfaultError> {
        let page = crate::mapping::PAGE_BYTES;
        let mut done = 0;
        let mut present = false;
        // The kernel may copy a prefix and stop (EAGAIN), or find a page
        // already there (EEXIST, waking nobody): the rest is copied on.
        // Bounded: each turn copies or skips at least one page, or ends.
        while done < data.len() {
            match self.copy(start + done, &data[done..], write_protected) {
                Ok(()) => done = data.len(),
                Err((Errno::AGAIN, copied)) if copied > 0 => done += copied,
                Err((Errno::EXIST, _)) => {
                    present = true;
                    done += page;
                }
                Err((errno, _)) => {
                    return Err(UserfaultError::Call {
                        call: "UFFDIO_COPY",
                        errno,
                    })
                }
            }
        }
        if !present {
            return Ok(Installed::Copied);
        }
        // A page already there was neither woken nor given this install's
        // protection: both are done for the whole range. (Taken for a
        // full copy, a writer's fault was left protected and asleep.)
        self.write_protect(start, data.len(), write_protected)?;
        self.wake(start, data.len())?;
        Ok(Installed::AlreadyPresent)
    }

    /// One `UFFDIO_COPY` of `data` to `start`; on failure its errno and
    /// the bytes it copied first.
    fn copy(&self, start: usize, data: &[u8], write_protected: bool) -> Result<(), (Errno, usize)> {
        #[cfg(test)]
        if data.len() > crate::mapping::PAGE_BYTES
            && INJECTED_PARTIAL_COPY.swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            let page = crate::mapping::PAGE_BYTES;
            self.copy_now(start, &data[..page], write_protected)?;
            return Err((Errno::NOMEM, page));
        }
        #[cfg(test)]
        if INJECTED_SHORTAGES
            .fetch_update(
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
                |left| left.checked_sub(1),
            )
            .is_ok()
        {
            return Err((Errno::NOMEM, 0));
        }
        self.copy_now(start, data, write_protected)
    }

    /// The `UFFDIO_COPY` itself.
    fn copy_now(
        &self,
        start: usize,
        data: &[u8],
        write_protected: bool,
    ) -> Result<(), (Errno, usize)> {
        let mut copy = uffdio_copy {
            dst: start as u64,
            src: data.as_ptr() as u64,
            len: data.len() as u64,
            mode: if write_protected {
                u64::from(UFFDIO_COPY_MODE_WP)
            } else {
                0
            },
            copy: 0,
        };
        // SAFETY: UFFDIO_COPY reads `len` bytes at `src`, which `data`
        // holds for the call, and writes only into the registered range.
        unsafe { ioctl(&self.fd, Updater::<COPY, uffdio_copy>::new(&mut copy)) }
            .map_err(|errno| (errno, usize::try_from(copy.copy).unwrap_or(0)))
    }

    /// Turns write protection on or off; turning it off wakes writers.
    pub fn write_protect(
        &self,
        start: usize,
        length: usize,
        protect: bool,
    ) -> Result<(), UserfaultError> {
        let mut request = uffdio_writeprotect {
            range: range(start, length),
            // UFFDIO_WRITEPROTECT_MODE_WP is bit 0.
            mode: u64::from(protect),
        };
        // SAFETY: UFFDIO_WRITEPROTECT reads one uffdio_writeprotect.
        unsafe {
            ioctl(
                &self.fd,
                Updater::<WRITE_PROTECT, uffdio_writeprotect>::new(&mut request),
            )
        }
        .map_err(call_error("UFFDIO_WRITEPROTECT"))
    }

    /// Wakes threads waiting on faults in the range, to fault again.
    pub fn wake(&self, start: usize, length: usize) -> Result<(), UserfaultError> {
        let mut range = range(start, length);
        // SAFETY: UFFDIO_WAKE reads one uffdio_range.
        unsafe { ioctl(&self.fd, Updater::<WAKE, uffdio_range>::new(&mut range)) }
            .map_err(call_error("UFFDIO_WAKE"))
    }

    /// Marks missing pages so that touching them raises SIGBUS instead of
    /// a fault nobody can serve.
    pub fn poison(&self, start: usize, length: usize) -> Result<(), UserfaultError> {
        // Page by page: the call stops at the first page already there
        // (EEXIST), and the missing pages after it, with threads asleep on
        // them, were neither poisoned nor woken.
        let page = crate::mapping::PAGE_BYTES;
        for at in (start..start + length).step_by(page) {
            let mut request = uffdio_poison {
                range: range(at, page.min(start + length - at)),
                mode: 0,
                updated: 0,
            };
            // SAFETY: UFFDIO_POISON reads and writes one uffdio_poison.
            match unsafe {
                ioctl(
                    &self.fd,
                    Updater::<POISON, uffdio_poison>::new(&mut request),
                )
            } {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(errno) => {
                    return Err(UserfaultError::Call {
                        call: "UFFDIO_POISON",
                        errno,
                    })
                }
            }
        }
        // Poisoning wakes the threads on the pages it poisoned; those on a
        // page already there are woken here to find it.
        self.wake(start, length)
    }

    /// Waits up to `timeout` for a fault; `None` when none came (or
    /// another handler thread took it).
    pub fn next_fault(&self, timeout: Duration) -> Result<Option<Fault>, UserfaultError> {
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        let timeout = rustix::time::Timespec::try_from(timeout).ok();
        match poll(&mut fds, timeout.as_ref()) {
            Ok(0) | Err(Errno::INTR) => return Ok(None),
            Ok(_) => {}
            Err(errno) => {
                return Err(UserfaultError::Call {
                    call: "poll",
                    errno,
                })
            }
        }
        let mut message = [0u8; MESSAGE_BYTES];
        match rustix::io::read(self.fd.as_fd(), &mut message) {
            Ok(MESSAGE_BYTES) => Ok(parse_message(&message)),
            Ok(_) | Err(Errno::AGAIN) | Err(Errno::INTR) => Ok(None),
            Err(errno) => Err(UserfaultError::Call {
                call: "read",
                errno,
            }),
        }
    }
}

/// `struct uffd_msg`: event u8 at 0; for a page fault, flags u64 at 8 and
/// the address u64 at 16.
fn parse_message(message: &[u8; MESSAGE_BYTES]) -> Option<Fault> {
    if u32::from(message[0]) != UFFD_EVENT_PAGEFAULT {
        return None;
    }
    let flags = u64::from_ne_bytes(message[8..16].try_into().expect("8 bytes"));
    let address = u64::from_ne_bytes(message[16..24].try_into().expect("8 bytes"));
    Some(Fault {
        address: address as usize,
        write: flags & u64::from(UFFD_PAGEFAULT_FLAG_WRITE) != 0,
        write_protected: flags & u64::from(UFFD_PAGEFAULT_FLAG_WP) != 0,
    })
}

/// Poison needs its own feature bit, and a descriptor's features are set
/// once: ask on a throwaway descriptor.
fn probe_poison() -> bool {
    let flags = rustix::mm::UserfaultfdFlags::CLOEXEC;
    // SAFETY: nothing is ever registered on this descriptor.
    let Ok(fd) = (unsafe { rustix::mm::userfaultfd(flags) }) else {
        return false;
    };
    let mut api = uffdio_api {
        api: UFFD_API.into(),
        features: u64::from(UFFD_FEATURE_POISON),
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes one uffdio_api.
    unsafe { ioctl(&fd, Updater::<API, uffdio_api>::new(&mut api)) }.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::{Mapping, PAGE_BYTES};

    /// Reads `address` on another thread; whether it returned within 2 s
    /// (a page nobody serves blocks its reader for ever).
    fn read_in_time(address: usize) -> Option<u8> {
        let (done, result) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: the page lies in a live mapping the test keeps.
            let byte = unsafe { std::ptr::read_volatile(address as *const u8) };
            let _ = done.send(byte);
        });
        result.recv_timeout(Duration::from_secs(2)).ok()
    }

    /// A chunk installed over a page already there: the copy stopped at
    /// that page with EEXIST, taken for success, and the chunk's other
    /// pages stayed missing, their readers asleep for good.
    #[test]
    fn an_install_over_a_page_already_there_copies_the_rest() {
        let userfault = Userfault::open().unwrap();
        let mapping = Mapping::new(2 * PAGE_BYTES).unwrap();
        let start = mapping.address();
        userfault.register(start, 2 * PAGE_BYTES).unwrap();
        userfault.install(start, &[1u8; PAGE_BYTES], false).unwrap();
        let chunk = vec![7u8; 2 * PAGE_BYTES];
        let installed = userfault.install(start, &chunk, false).unwrap();
        assert_eq!(installed, Installed::AlreadyPresent);
        assert_eq!(read_in_time(start + PAGE_BYTES), Some(7), "the second page");
        assert_eq!(read_in_time(start), Some(1), "the first page kept");
        userfault.unregister(start, 2 * PAGE_BYTES).unwrap();
    }

    /// The opcodes computed here are the ones in the kernel headers.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn opcodes_match_the_kernel_headers() {
        use linux_raw_sys::ioctl as headers;
        assert_eq!(API, headers::UFFDIO_API as Opcode);
        assert_eq!(REGISTER, headers::UFFDIO_REGISTER as Opcode);
        assert_eq!(UNREGISTER, headers::UFFDIO_UNREGISTER as Opcode);
        assert_eq!(WAKE, headers::UFFDIO_WAKE as Opcode);
        assert_eq!(COPY, headers::UFFDIO_COPY as Opcode);
        assert_eq!(WRITE_PROTECT, headers::UFFDIO_WRITEPROTECT as Opcode);
        assert_eq!(
            MESSAGE_BYTES,
            std::mem::size_of::<linux_raw_sys::general::uffd_msg>()
        );
    }
}
