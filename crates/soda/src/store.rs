//! Where an object's chunks live when they are not in the host buffer: a
//! [`ChunkStore`]. SODA's backends are stores: a memory node (direct, or
//! through the DPU), a local file (the SSD baseline), or this process's
//! own memory (for tests of the buffer alone).

use remora_base::copy_bytes;
use remora_rack::pool::Extents;
use rustix::fs::{Mode, OFlags};
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// An object's id, unique for the life of a [`crate::FarMemory`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub u32);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("object {0:?} is not in the store")]
    UnknownObject(ObjectId),
    #[error("object {object:?}: bytes {offset}..{end} are outside its {length} bytes")]
    OutOfRange {
        object: ObjectId,
        offset: u64,
        end: u64,
        length: u64,
    },
    #[error("the {store} store cannot take advice {advice:?}")]
    Unsupported { store: &'static str, advice: Advice },
    #[error("the store is full: {wanted} bytes wanted, {free} free")]
    Full { wanted: u64, free: u64 },
    /// This process's heap could not hold the object's first contents.
    #[error("{wanted} bytes of memory could not be allocated for an object's contents")]
    NoMemory { wanted: u64 },
    #[error("object {object:?}: its data was lost ({reason})")]
    Lost { object: ObjectId, reason: String },
    #[error("{path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The store panicked during a call: a bug in it, taken as a failure
    /// of that call.
    #[error("the store panicked during a {call}")]
    Panicked { call: &'static str },
    /// The remote side failed (a dead memory node, a failed RDMA
    /// operation); the source says which.
    #[error("remote store: {0}")]
    Remote(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// What an application tells the store about an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// Keep it in the DPU's static cache: every access hits there.
    Pin,
    /// Leave the static cache; the DPU's copy goes to the memory node.
    Unpin,
    /// Route it through the DPU's dynamic cache (read-mostly data).
    CacheDynamically,
}

pub trait ChunkStore: Send + Sync {
    /// A short name for reports ("file", "memserver", ...).
    fn name(&self) -> &'static str;
    /// Makes room for `bytes`, filled from `initial` (a file, loaded
    /// where the store keeps its data) or with zeros.
    fn reserve(
        &self,
        object: ObjectId,
        bytes: u64,
        initial: Option<&Path>,
    ) -> Result<(), StoreError>;
    fn fetch(&self, object: ObjectId, offset: u64, into: &mut [u8]) -> Result<(), StoreError>;
    fn write_back(&self, object: ObjectId, offset: u64, data: &[u8]) -> Result<(), StoreError>;
    fn release(&self, object: ObjectId) -> Result<(), StoreError>;
    /// Whether everything the store held for a released `object` is gone
    /// (a release may finish later, when a DPU confirms what it held), so
    /// its id may name a new object. A store that releases at once says
    /// yes.
    fn is_released(&self, object: ObjectId) -> bool {
        let _ = object;
        true
    }
    /// Takes the application's advice; a store without a DPU refuses it.
    fn advise(&self, object: ObjectId, advice: Advice) -> Result<(), StoreError> {
        let _ = object;
        Err(StoreError::Unsupported {
            store: self.name(),
            advice,
        })
    }
}

/// Whether `length` bytes at `offset` fit an object of `size` bytes.
pub(crate) fn check_range(
    object: ObjectId,
    offset: u64,
    length: usize,
    size: u64,
) -> Result<(), StoreError> {
    let end = offset.saturating_add(length as u64);
    if end > size {
        return Err(StoreError::OutOfRange {
            object,
            offset,
            end,
            length: size,
        });
    }
    Ok(())
}

/// An object's first contents: `initial` read whole (it must fit), or
/// zeros.
pub(crate) fn initial_data(initial: Option<&Path>, bytes: u64) -> Result<Vec<u8>, StoreError> {
    let mut data = Vec::new();
    // A file is read one byte past the object, to tell one too long.
    let room = bytes.saturating_add(u64::from(initial.is_some()));
    usize::try_from(room)
        .ok()
        .and_then(|length| data.try_reserve_exact(length).ok())
        .ok_or(StoreError::NoMemory { wanted: bytes })?;
    match initial {
        Some(path) => read_initial(path, bytes, data),
        None => {
            // Within the capacity reserved above.
            data.resize(bytes as usize, 0);
            Ok(data)
        }
    }
}

/// Reads `path` into `data`, which has room for `bytes`, and pads it with
/// zeros to `bytes`.
fn read_initial(path: &Path, bytes: u64, mut data: Vec<u8>) -> Result<Vec<u8>, StoreError> {
    let file_error = |source| StoreError::File {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(file_error)?;
    let file_bytes = file.metadata().map_err(file_error)?.len();
    // One byte past the room at most (a pipe tells no length): a longer
    // file is refused without being read into memory whole.
    std::io::Read::read_to_end(&mut std::io::Read::take(file, bytes + 1), &mut data)
        .map_err(file_error)?;
    if data.len() as u64 > bytes {
        return Err(StoreError::OutOfRange {
            object: ObjectId(u32::MAX),
            offset: 0,
            end: file_bytes.max(data.len() as u64),
            length: bytes,
        });
    }
    data.resize(bytes as usize, 0);
    Ok(data)
}

/// Chunks kept in this process's heap: no network, no disk. It lets the
/// buffer's faulting, dirty tracking and eviction be tested alone.
#[derive(Debug, Default)]
pub struct InProcessStore {
    objects: Mutex<HashMap<ObjectId, Vec<u8>>>,
}

impl ChunkStore for InProcessStore {
    fn name(&self) -> &'static str {
        "in-process"
    }

    fn reserve(
        &self,
        object: ObjectId,
        bytes: u64,
        initial: Option<&Path>,
    ) -> Result<(), StoreError> {
        let data = initial_data(initial, bytes)?;
        self.objects
            .lock()
            .expect("store lock")
            .insert(object, data);
        Ok(())
    }

    fn fetch(&self, object: ObjectId, offset: u64, into: &mut [u8]) -> Result<(), StoreError> {
        let objects = self.objects.lock().expect("store lock");
        let data = objects
            .get(&object)
            .ok_or(StoreError::UnknownObject(object))?;
        check_range(object, offset, into.len(), data.len() as u64)?;
        copy_bytes(into, &data[offset as usize..offset as usize + into.len()]);
        Ok(())
    }

    fn write_back(&self, object: ObjectId, offset: u64, chunk: &[u8]) -> Result<(), StoreError> {
        let mut objects = self.objects.lock().expect("store lock");
        let data = objects
            .get_mut(&object)
            .ok_or(StoreError::UnknownObject(object))?;
        check_range(object, offset, chunk.len(), data.len() as u64)?;
        copy_bytes(
            &mut data[offset as usize..offset as usize + chunk.len()],
            chunk,
        );
        Ok(())
    }

    fn release(&self, object: ObjectId) -> Result<(), StoreError> {
        let removed = self.objects.lock().expect("store lock").remove(&object);
        removed.map(drop).ok_or(StoreError::UnknownObject(object))
    }
}

/// The SSD baseline: every object is an extent of one local file, read
/// and written with `O_DIRECT` so the page cache does not stand in for
/// the disk. Chunk offsets and staging buffers are page aligned.
pub struct FileStore {
    path: PathBuf,
    file: File,
    extents: Mutex<FileExtents>,
}

/// Where each object lives in the file: its extent (reused once freed,
/// so a program that allocates and frees in a loop does not grow the
/// file for ever), and its exact size.
struct FileExtents {
    extents: Extents<ObjectId>,
    sizes: HashMap<ObjectId, u64>,
}

/// The room the file's extents are kept in: what a file system gives out
/// first is its own limit.
const FILE_SPACE_BYTES: u64 = 1 << 62;

/// Extents start on this boundary, which `O_DIRECT` needs.
const EXTENT_ALIGNMENT: u64 = remora_rack::pool::EXTENT_ALIGNMENT;

impl FileStore {
    /// Creates (or truncates) the backing file.
    pub fn create(path: &Path) -> Result<FileStore, StoreError> {
        let file_error = |source: std::io::Error| StoreError::File {
            path: path.to_owned(),
            source,
        };
        let flags =
            OFlags::RDWR | OFlags::CREATE | OFlags::TRUNC | OFlags::DIRECT | OFlags::CLOEXEC;
        let fd = rustix::fs::open(path, flags, Mode::from_raw_mode(0o600))
            .map_err(|errno| file_error(errno.into()))?;
        Ok(FileStore {
            path: path.to_owned(),
            file: File::from(fd),
            extents: Mutex::new(FileExtents {
                extents: Extents::new(FILE_SPACE_BYTES),
                sizes: HashMap::new(),
            }),
        })
    }

    fn extent(&self, object: ObjectId) -> Result<(u64, u64), StoreError> {
        let extents = self.extents.lock().expect("extent lock");
        let start = extents.extents.held(object).map(|(start, _)| start);
        let size = extents.sizes.get(&object).copied();
        start.zip(size).ok_or(StoreError::UnknownObject(object))
    }

    fn file_error(&self, source: std::io::Error) -> StoreError {
        StoreError::File {
            path: self.path.clone(),
            source,
        }
    }

    /// Takes an extent for `object`, first fit; where it starts. A freed
    /// extent reads as zeros ([`FileStore::release`]).
    fn claim_extent(&self, object: ObjectId, bytes: u64) -> Result<u64, StoreError> {
        let mut extents = self.extents.lock().expect("extent lock");
        let start = extents
            .extents
            .reserve(object, bytes)
            .map_err(crate::rack::pool_error(object))?;
        extents.sizes.insert(object, bytes);
        Ok(start)
    }

    /// Gives `object`'s extent back once its bytes read as zeros again; if
    /// they cannot be zeroed, the object stays (its release fails), so no
    /// later object is given its bytes.
    /// The object is gone at once (its size removed: lookups fail), and
    /// its extent, still held, is zeroed outside the lock, so other
    /// objects' reads and writes do not wait for a hole punch or for
    /// zeros written.
    fn free_extent(&self, object: ObjectId) -> Result<(), StoreError> {
        let (start, length) = {
            let mut extents = self.extents.lock().expect("extent lock");
            let held = extents.extents.held(object);
            let (start, length) = held.ok_or(StoreError::UnknownObject(object))?;
            extents.sizes.remove(&object);
            (start, length)
        };
        self.zero(start, length)?;
        self.extents
            .lock()
            .expect("extent lock")
            .extents
            .release(object)
            .map_err(crate::rack::pool_error(object))?;
        Ok(())
    }

    /// Makes `length` bytes from `start` read as zeros: a hole punched
    /// (which gives the disk space back), or zeros written where the file
    /// system punches none.
    fn zero(&self, start: u64, length: u64) -> Result<(), StoreError> {
        let flags = rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE;
        match rustix::fs::fallocate(&self.file, flags, start, length) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::OPNOTSUPP) => self.write_zeros(start, length),
            Err(errno) => Err(self.file_error(errno.into())),
        }
    }

    fn write_zeros(&self, start: u64, length: u64) -> Result<(), StoreError> {
        // O_DIRECT: from page-aligned memory, which a fresh mapping is
        // (and zero).
        let zeros =
            crate::mapping::Mapping::new(1 << 20).map_err(|errno| self.file_error(errno.into()))?;
        let piece_bytes = zeros.len() as u64;
        let mut offset = 0;
        // Bounded by the extent's length.
        while offset < length {
            let piece = piece_bytes.min(length - offset) as usize;
            self.write_all_at(&zeros.as_slice()[..piece], start + offset)?;
            offset += piece as u64;
        }
        Ok(())
    }

    /// Writes an extent's initial bytes, or makes the file reach its end.
    /// The file only ever grows here: an extent is filled after the lock
    /// that claimed it is dropped, so a later extent may already hold its
    /// data, and an `ftruncate` to this extent's end cut it off (its
    /// object then read zeros, and nothing said it was lost).
    fn fill_extent(
        &self,
        start: u64,
        bytes: u64,
        initial: Option<&Path>,
    ) -> Result<(), StoreError> {
        let Some(path) = initial else {
            return self.grow_over(start, bytes.next_multiple_of(EXTENT_ALIGNMENT));
        };
        // Loading goes through an aligned buffer, a chunk at a time.
        let data = initial_data(Some(path), bytes)?;
        let mut staging =
            crate::mapping::Mapping::new(1 << 20).map_err(|errno| self.file_error(errno.into()))?;
        let piece_bytes = staging.len();
        for (index, piece) in data.chunks(piece_bytes).enumerate() {
            let padded = piece.len().next_multiple_of(EXTENT_ALIGNMENT as usize);
            let buffer = &mut staging.as_mut_slice()[..padded];
            buffer[..piece.len()].copy_from_slice(piece);
            buffer[piece.len()..].fill(0);
            self.write_all_at(buffer, start + (index * piece_bytes) as u64)?;
        }
        Ok(())
    }

    /// Reserves `length` bytes from `start` and makes the file reach
    /// their end, never shorter: `fallocate` without flags only extends.
    /// Where the file system has no `fallocate`, the file grows as it is
    /// written, and a read past its end is zeros, as a fresh extent is.
    fn grow_over(&self, start: u64, length: u64) -> Result<(), StoreError> {
        if length == 0 {
            return Ok(());
        }
        let flags = rustix::fs::FallocateFlags::empty();
        match rustix::fs::fallocate(&self.file, flags, start, length) {
            Ok(()) | Err(rustix::io::Errno::OPNOTSUPP) => Ok(()),
            Err(errno) => Err(self.file_error(errno.into())),
        }
    }

    fn write_all_at(&self, mut data: &[u8], mut offset: u64) -> Result<(), StoreError> {
        while !data.is_empty() {
            let written = rustix::io::pwrite(&self.file, data, offset)
                .map_err(|errno| self.file_error(errno.into()))?;
            data = &data[written..];
            offset += written as u64;
        }
        Ok(())
    }
}

impl ChunkStore for FileStore {
    fn name(&self) -> &'static str {
        "file"
    }

    fn reserve(
        &self,
        object: ObjectId,
        bytes: u64,
        initial: Option<&Path>,
    ) -> Result<(), StoreError> {
        let start = self.claim_extent(object, bytes)?;
        let filled = self.fill_extent(start, bytes, initial);
        if filled.is_err() {
            // The extent goes back: kept, it was held for nothing.
            let _ = self.free_extent(object);
        }
        filled
    }

    fn fetch(&self, object: ObjectId, offset: u64, into: &mut [u8]) -> Result<(), StoreError> {
        let (start, size) = self.extent(object)?;
        check_range(object, offset, into.len(), size)?;
        let mut done = 0;
        while done < into.len() {
            let read =
                rustix::io::pread(&self.file, &mut into[done..], start + offset + done as u64)
                    .map_err(|errno| self.file_error(errno.into()))?;
            if read == 0 {
                into[done..].fill(0);
                break;
            }
            done += read;
        }
        Ok(())
    }

    fn write_back(&self, object: ObjectId, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        let (start, size) = self.extent(object)?;
        check_range(object, offset, data.len(), size)?;
        self.write_all_at(data, start + offset)
    }

    fn release(&self, object: ObjectId) -> Result<(), StoreError> {
        self.free_extent(object)
    }

    /// Whether the object's extent is given back. One whose bytes could
    /// not be zeroed stays held under its id (see `free_extent`), and an
    /// id named again for a new object found it `AlreadyHeld`.
    fn is_released(&self, object: ObjectId) -> bool {
        let extents = self.extents.lock().expect("extent lock");
        extents.extents.held(object).is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file store said every id was released, the default: after a
    /// reserve whose fill failed and whose extent could not be zeroed,
    /// the id was named again and its next reserve found it held. An id
    /// is released only once its extent is given back.
    #[test]
    fn an_object_is_released_only_once_its_extent_is_given_back() {
        let directory = tempfile::tempdir().unwrap();
        let store = FileStore::create(&directory.path().join("far")).unwrap();
        let object = ObjectId(3);
        store.reserve(object, 1 << 16, None).unwrap();
        assert!(!store.is_released(object));
        store.release(object).unwrap();
        assert!(store.is_released(object));
    }

    /// Extents were never reused: a program that allocated and freed in
    /// a loop grew the backing file by every object until the disk was
    /// full. A freed extent is taken again, and reads zeros, not the
    /// bytes of the object that had it.
    #[test]
    fn a_freed_extent_is_reused_and_reads_zeros() {
        const BYTES: usize = 1 << 20;
        let directory = tempfile::tempdir().unwrap();
        let backing = directory.path().join("backing");
        let store = FileStore::create(&backing).unwrap();
        let mut buffer = crate::mapping::Mapping::new(BYTES).unwrap();
        for round in 0..64 {
            let object = ObjectId(round);
            store.reserve(object, BYTES as u64, None).unwrap();
            store.fetch(object, 0, buffer.as_mut_slice()).unwrap();
            assert!(
                buffer.as_slice().iter().all(|byte| *byte == 0),
                "round {round}: an earlier object's bytes"
            );
            buffer.as_mut_slice().fill(0x55);
            store.write_back(object, 0, buffer.as_slice()).unwrap();
            store.release(object).unwrap();
        }
        let file_bytes = std::fs::metadata(&backing).unwrap().len();
        assert!(file_bytes <= BYTES as u64, "{file_bytes} bytes");
    }

    /// Where a file system punches no holes, a freed extent is zeroed by
    /// writing: the fallback, run here directly.
    #[test]
    fn written_zeros_clear_an_extent() {
        const BYTES: usize = 3 << 20;
        let directory = tempfile::tempdir().unwrap();
        let store = FileStore::create(&directory.path().join("backing")).unwrap();
        let object = ObjectId(1);
        store.reserve(object, BYTES as u64, None).unwrap();
        let mut buffer = crate::mapping::Mapping::new(BYTES).unwrap();
        buffer.as_mut_slice().fill(0x55);
        store.write_back(object, 0, buffer.as_slice()).unwrap();
        let (start, _) = store.extent(object).unwrap();
        store.write_zeros(start, BYTES as u64).unwrap();
        store.fetch(object, 0, buffer.as_mut_slice()).unwrap();
        assert!(buffer.as_slice().iter().all(|byte| *byte == 0));
    }

    /// An object too large for this process's heap aborted the process
    /// (`vec!` of 1 TiB); it is an error now, and the store serves on.
    #[test]
    fn an_object_too_large_for_the_heap_is_an_error_not_an_abort() {
        let store = InProcessStore::default();
        assert!(matches!(
            store.reserve(ObjectId(1), 1 << 60, None),
            Err(StoreError::NoMemory { wanted }) if wanted == 1 << 60
        ));
        store.reserve(ObjectId(2), 4096, None).unwrap();
    }

    /// A file longer than its object is refused, and named by its length,
    /// without being read whole.
    #[test]
    fn a_file_longer_than_its_object_is_refused_with_its_length() {
        let directory = tempfile::tempdir().unwrap();
        let initial = directory.path().join("initial");
        std::fs::write(&initial, vec![1u8; 10_000]).unwrap();
        assert!(matches!(
            initial_data(Some(&initial), 4096),
            Err(StoreError::OutOfRange {
                end: 10_000,
                length: 4096,
                ..
            })
        ));
        let data = initial_data(Some(&initial), 16_384).unwrap();
        assert_eq!(data.len(), 16_384);
        assert!(data[..10_000].iter().all(|byte| *byte == 1));
        assert!(data[10_000..].iter().all(|byte| *byte == 0));
    }

    /// Two objects reserved at once: the first (zeroed) claimed its
    /// extent, the second claimed the next and wrote its file's bytes, and
    /// only then did the first make the file reach its extent's end. With
    /// `ftruncate` that cut the second's bytes off, and it read zeros.
    #[test]
    fn a_zeroed_extent_filled_after_a_later_one_cuts_nothing_off() {
        const BYTES: usize = 1 << 20;
        let directory = tempfile::tempdir().unwrap();
        let store = FileStore::create(&directory.path().join("backing")).unwrap();
        let initial = directory.path().join("initial");
        std::fs::write(&initial, vec![0x77u8; BYTES]).unwrap();
        let (first, second) = (ObjectId(1), ObjectId(2));
        let first_start = store.claim_extent(first, BYTES as u64).unwrap();
        let second_start = store.claim_extent(second, BYTES as u64).unwrap();
        store
            .fill_extent(second_start, BYTES as u64, Some(&initial))
            .unwrap();
        store.fill_extent(first_start, BYTES as u64, None).unwrap();

        // Reads are O_DIRECT: into page-aligned memory.
        let mut buffer = crate::mapping::Mapping::new(BYTES).unwrap();
        store.fetch(second, 0, buffer.as_mut_slice()).unwrap();
        assert!(buffer.as_slice().iter().all(|byte| *byte == 0x77));
        store.fetch(first, 0, buffer.as_mut_slice()).unwrap();
        assert!(buffer.as_slice().iter().all(|byte| *byte == 0));
    }
}
