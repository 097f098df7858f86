//! A local file as the device, opened with `O_DIRECT`: the paper's SSD
//! baseline, on this machine's virtual disk. Requests run on a pool of
//! I/O threads, up to [`MAX_IN_FLIGHT`] per queue, so the store overlaps
//! them as it does the one-sided device's batches; a comparison against a
//! synchronous `pread` would flatter far memory.
//!
//! Direct I/O needs aligned buffers, offsets and lengths. Reads are
//! widened to the alignment and the wanted bytes cut out; writes (whole
//! log pages) must be aligned already.

use super::{check_range, Completed, Device, DeviceError, DeviceQueue, Finished};
use memmap2::MmapMut;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Reads and writes one queue may have outstanding: the one-sided
/// device's batch of 100.
pub const MAX_IN_FLIGHT: usize = 100;
/// Direct I/O alignment: the page size, which every block device here accepts.
pub const ALIGNMENT_BYTES: u64 = 4096;
/// The longest request a worker's aligned buffer holds.
const MAX_REQUEST_BYTES: usize = 1 << 20;

enum Work {
    Read { length: usize },
    Write { data: Vec<u8> },
}

struct Job {
    offset: u64,
    work: Work,
    token: u64,
    reply: Sender<Reply>,
}

struct Reply {
    token: u64,
    result: Result<Option<Vec<u8>>, DeviceError>,
}

pub struct FileDevice {
    path: PathBuf,
    capacity_bytes: u64,
    jobs: Mutex<Option<Sender<Job>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl FileDevice {
    /// Creates (or truncates) the file at `path`, sized `capacity_bytes`
    /// (rounded up to the alignment), with `threads` I/O threads.
    /// `direct: false` drops `O_DIRECT`, for file systems without it.
    pub fn create(
        path: &Path,
        capacity_bytes: u64,
        threads: usize,
        direct: bool,
    ) -> Result<FileDevice, DeviceError> {
        let capacity_bytes = capacity_bytes.div_ceil(ALIGNMENT_BYTES) * ALIGNMENT_BYTES;
        let file = open(path, direct)?;
        file.set_len(capacity_bytes).map_err(io_error(path))?;
        let file = Arc::new(file);
        let (jobs, queue) = channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        let workers = (0..threads.max(1))
            .map(|number| spawn_worker(number, file.clone(), queue.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(FileDevice {
            path: path.to_path_buf(),
            capacity_bytes,
            jobs: Mutex::new(Some(jobs)),
            workers: Mutex::new(workers),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> DeviceError + '_ {
    move |error| DeviceError::Io(format!("{}: {error}", path.display()))
}

fn open(path: &Path, direct: bool) -> Result<File, DeviceError> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(true);
    if direct {
        options.custom_flags(libc::O_DIRECT);
    }
    options.open(path).map_err(|error| {
        let hint = if direct && error.raw_os_error() == Some(libc::EINVAL) {
            " (this file system refuses O_DIRECT; put the file on a disk, not tmpfs)"
        } else {
            ""
        };
        DeviceError::Io(format!("{}: {error}{hint}", path.display()))
    })
}

fn spawn_worker(
    number: usize,
    file: Arc<File>,
    queue: Arc<Mutex<Receiver<Job>>>,
) -> Result<JoinHandle<()>, DeviceError> {
    let buffer = MmapMut::map_anon(MAX_REQUEST_BYTES + ALIGNMENT_BYTES as usize)
        .map_err(|error| DeviceError::Io(format!("aligned buffer: {error}")))?;
    std::thread::Builder::new()
        .name(format!("kv-file-io-{number}"))
        .spawn(move || serve(&file, &queue, buffer))
        .map_err(|error| DeviceError::Io(format!("I/O thread: {error}")))
}

/// A worker: takes jobs until every sender is gone.
fn serve(file: &File, queue: &Mutex<Receiver<Job>>, mut buffer: MmapMut) {
    loop {
        let job = {
            let queue = queue.lock().unwrap_or_else(|e| e.into_inner());
            queue.recv()
        };
        let Ok(job) = job else { return };
        let result = match job.work {
            Work::Read { length } => read_aligned(file, &mut buffer, job.offset, length).map(Some),
            Work::Write { data } => {
                write_aligned(file, &mut buffer, job.offset, &data).map(|()| None)
            }
        };
        // A queue dropped with requests in flight no longer listens.
        let _ = job.reply.send(Reply {
            token: job.token,
            result,
        });
    }
}

fn read_aligned(
    file: &File,
    buffer: &mut [u8],
    offset: u64,
    length: usize,
) -> Result<Vec<u8>, DeviceError> {
    let start = offset / ALIGNMENT_BYTES * ALIGNMENT_BYTES;
    let end = (offset + length as u64).div_ceil(ALIGNMENT_BYTES) * ALIGNMENT_BYTES;
    let span = (end - start) as usize;
    file.read_exact_at(&mut buffer[..span], start)
        .map_err(|error| DeviceError::Io(format!("read of {span} bytes at {start}: {error}")))?;
    let skip = (offset - start) as usize;
    Ok(buffer[skip..skip + length].to_vec())
}

fn write_aligned(
    file: &File,
    buffer: &mut [u8],
    offset: u64,
    data: &[u8],
) -> Result<(), DeviceError> {
    buffer[..data.len()].copy_from_slice(data);
    file.write_all_at(&buffer[..data.len()], offset)
        .map_err(|error| {
            DeviceError::Io(format!(
                "write of {} bytes at {offset}: {error}",
                data.len()
            ))
        })
}

impl Device for FileDevice {
    fn name(&self) -> &str {
        "file"
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn max_request_bytes(&self) -> u64 {
        MAX_REQUEST_BYTES as u64
    }

    fn open_queue(&self) -> Result<Box<dyn DeviceQueue>, DeviceError> {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let jobs = jobs.clone().ok_or(DeviceError::Closed)?;
        let (reply, replies) = channel();
        Ok(Box::new(FileQueue {
            jobs,
            reply,
            replies,
            capacity_bytes: self.capacity_bytes,
            issued: 0,
            finished: Finished::default(),
            failed: Default::default(),
        }))
    }
}

impl Drop for FileDevice {
    fn drop(&mut self) {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|e| e.into_inner()));
        for worker in workers {
            let _ = worker.join();
        }
    }
}

struct FileQueue {
    jobs: Sender<Job>,
    reply: Sender<Reply>,
    replies: Receiver<Reply>,
    capacity_bytes: u64,
    /// Sent to the workers and not yet back.
    issued: usize,
    finished: Finished,
    /// Requests that failed, each to be reported once by name.
    failed: std::collections::VecDeque<DeviceError>,
}

impl FileQueue {
    fn submit(&mut self, offset: u64, work: Work, token: u64) -> Result<(), DeviceError> {
        // Only requests at the workers count: finished ones are bytes held
        // for the next poll, and waiting cannot move them (counted, the
        // loop spun for good once 100 waited uncollected, as a server's
        // round of deferred GETs over several connections could make).
        // Bounded: each turn takes at least one reply.
        while self.issued >= MAX_IN_FLIGHT {
            self.receive(true)?;
        }
        let reply = self.reply.clone();
        let job = Job {
            offset,
            work,
            token,
            reply,
        };
        self.jobs.send(job).map_err(|_| DeviceError::Closed)?;
        self.issued += 1;
        Ok(())
    }

    /// Moves replies into `finished` (and failures into `failed`, for
    /// `poll` to report under their own tokens: returned from a `submit`,
    /// an earlier request's failure passed for the new one's, and the
    /// earlier one was never completed); `wait` blocks for at least one.
    fn receive(&mut self, wait: bool) -> Result<(), DeviceError> {
        if wait && self.issued > 0 {
            let reply = self.replies.recv().map_err(|_| DeviceError::Closed)?;
            self.keep(reply);
        }
        while let Ok(reply) = self.replies.try_recv() {
            self.keep(reply);
        }
        Ok(())
    }

    fn keep(&mut self, reply: Reply) {
        self.issued -= 1;
        match reply.result {
            Ok(Some(bytes)) => self.finished.push_read(reply.token, &bytes),
            Ok(None) => self.finished.push_write(reply.token),
            // Dropped with its token, the request's owner waited for it
            // for good; it is reported by name (`RequestFailed`).
            Err(failure) => self.failed.push_back(DeviceError::RequestFailed {
                token: reply.token,
                reason: failure.to_string(),
            }),
        }
    }
}

impl DeviceQueue for FileQueue {
    fn read(&mut self, offset: u64, length: usize, token: u64) -> Result<(), DeviceError> {
        check_range(offset, length as u64, self.capacity_bytes)?;
        // An unaligned read spans at most a block more than its length,
        // and the buffer holds a block more than the longest request.
        if length > MAX_REQUEST_BYTES {
            return Err(DeviceError::Io(format!(
                "a read of {length} bytes is longer than the I/O buffer"
            )));
        }
        self.submit(offset, Work::Read { length }, token)
    }

    fn write(&mut self, offset: u64, data: &[u8], token: u64) -> Result<(), DeviceError> {
        check_range(offset, data.len() as u64, self.capacity_bytes)?;
        let length = data.len() as u64;
        if !offset.is_multiple_of(ALIGNMENT_BYTES)
            || !length.is_multiple_of(ALIGNMENT_BYTES)
            || data.len() > MAX_REQUEST_BYTES
        {
            return Err(DeviceError::Unaligned {
                offset,
                length,
                alignment_bytes: ALIGNMENT_BYTES,
            });
        }
        let data = data.to_vec();
        self.submit(offset, Work::Write { data }, token)
    }

    fn poll(&mut self, done: &mut dyn FnMut(u64, Completed<'_>)) -> Result<usize, DeviceError> {
        self.receive(false)?;
        if let Some(failure) = self.failed.pop_front() {
            return Err(failure);
        }
        Ok(self.finished.drain(done))
    }

    fn in_flight(&self) -> usize {
        // Failures wait to be reported by a poll, as completions do.
        self.issued + self.finished.len() + self.failed.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poll_all(queue: &mut dyn DeviceQueue) -> Vec<(u64, Option<Vec<u8>>)> {
        let mut seen = Vec::new();
        while queue.in_flight() > 0 {
            queue
                .poll(&mut |token, bytes| seen.push((token, bytes.map(<[u8]>::to_vec))))
                .unwrap();
        }
        seen.sort_by_key(|(token, _)| *token);
        seen
    }

    /// Finished requests counted against the in-flight limit: with 100
    /// waiting uncollected, the 101st read spun for good in `submit`.
    #[test]
    fn more_reads_than_the_limit_issue_without_a_poll() {
        let directory = tempfile::tempdir_in("/var/tmp").unwrap();
        let device = FileDevice::create(&directory.path().join("log"), 64 * 1024, 2, true).unwrap();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut queue = device.open_queue().unwrap();
            for token in 0..(MAX_IN_FLIGHT as u64 + 20) {
                queue.read(4096, 512, token).unwrap();
            }
            let _ = done.send(poll_all(queue.as_mut()).len());
        });
        let seen = finished
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the reads were issued and completed");
        assert_eq!(seen, MAX_IN_FLIGHT + 20);
    }

    /// A request's failure is reported by a poll under its own token. A
    /// `submit` that had to wait for room returned an earlier request's
    /// failure as its own error, and the earlier request never completed.
    #[test]
    fn each_failed_read_is_reported_once_under_its_own_token() {
        let directory = tempfile::tempdir_in("/var/tmp").unwrap();
        let path = directory.path().join("log");
        let device = FileDevice::create(&path, 64 * 1024, 2, true).unwrap();
        let mut queue = device.open_queue().unwrap();
        // Cut short from outside the store: every read past its end fails.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        let reads = MAX_IN_FLIGHT as u64 + 20;
        for token in 0..reads {
            queue.read(4096, 512, token).unwrap();
        }
        let mut failed = std::collections::BTreeSet::new();
        while queue.in_flight() > 0 {
            match queue.poll(&mut |token, _| panic!("read {token} succeeded")) {
                Err(DeviceError::RequestFailed { token, .. }) => assert!(failed.insert(token)),
                Ok(_) => {}
                Err(other) => panic!("{other}"),
            }
        }
        assert_eq!(failed, (0..reads).collect());
    }

    #[test]
    fn an_aligned_page_written_directly_reads_back_at_any_offset() {
        let directory = tempfile::tempdir_in("/var/tmp").unwrap();
        let path = directory.path().join("log");
        let device = FileDevice::create(&path, 64 * 1024, 2, true).unwrap();
        let mut queue = device.open_queue().unwrap();
        let page: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        queue.write(4096, &page, 1).unwrap();
        assert_eq!(poll_all(queue.as_mut()), vec![(1, None)]);
        queue.read(4096 + 100, 300, 2).unwrap();
        let read = poll_all(queue.as_mut());
        assert_eq!(read, vec![(2, Some(page[100..400].to_vec()))]);
    }

    /// A whole 1 MiB page read back (compaction and recovery read whole
    /// pages) was refused as longer than the buffer, which holds a block
    /// more than that: a store of 1 MiB pages could not compact.
    #[test]
    fn the_longest_request_reads_back_at_an_unaligned_offset_too() {
        let directory = tempfile::tempdir_in("/var/tmp").unwrap();
        let device = FileDevice::create(&directory.path().join("log"), 4 << 20, 1, true).unwrap();
        let mut queue = device.open_queue().unwrap();
        let page: Vec<u8> = (0..MAX_REQUEST_BYTES as u32)
            .map(|i| (i % 253) as u8)
            .collect();
        queue.write(0, &page, 1).unwrap();
        queue.write(MAX_REQUEST_BYTES as u64, &page, 2).unwrap();
        poll_all(queue.as_mut());
        queue.read(0, MAX_REQUEST_BYTES, 3).unwrap();
        queue.read(100, MAX_REQUEST_BYTES, 4).unwrap();
        let read = poll_all(queue.as_mut());
        assert_eq!(read[0], (3, Some(page.clone())));
        let mut shifted = page[100..].to_vec();
        shifted.extend_from_slice(&page[..100]);
        assert_eq!(read[1], (4, Some(shifted)));
    }

    #[test]
    fn an_unaligned_write_is_refused_with_the_alignment() {
        let directory = tempfile::tempdir_in("/var/tmp").unwrap();
        let device = FileDevice::create(&directory.path().join("log"), 8192, 1, true).unwrap();
        let mut queue = device.open_queue().unwrap();
        assert!(matches!(
            queue.write(100, &[0; 10], 0),
            Err(DeviceError::Unaligned {
                alignment_bytes: 4096,
                ..
            })
        ));
    }
}
