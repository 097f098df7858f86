//! Where an object's chunks live when they are not in the host buffer: a
//! [`ChunkStore`]. SODA's backends are stores: a memory node (direct, or
//! through the DPU), a local file (the SSD baseline), or this process's
//! own memory (for tests of the buffer alone).

use remora_base::copy_bytes;
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
    usize::try_from(bytes)
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
    extents: Mutex<Extents>,
}

#[derive(Default)]
struct Extents {
    next_offset: u64,
    objects: HashMap<ObjectId, (u64, u64)>,
}

/// Extents start on this boundary, which `O_DIRECT` needs.
const EXTENT_ALIGNMENT: u64 = 4096;

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
            extents: Mutex::new(Extents::default()),
        })
    }

    fn extent(&self, object: ObjectId) -> Result<(u64, u64), StoreError> {
        let extents = self.extents.lock().expect("extent lock");
        extents
            .objects
            .get(&object)
            .copied()
            .ok_or(StoreError::UnknownObject(object))
    }

    fn file_error(&self, source: std::io::Error) -> StoreError {
        StoreError::File {
            path: self.path.clone(),
            source,
        }
    }

    /// Takes the next extent for `object`; where it starts.
    fn claim_extent(&self, object: ObjectId, bytes: u64) -> u64 {
        let mut extents = self.extents.lock().expect("extent lock");
        let start = extents.next_offset;
        extents.next_offset = (start + bytes).next_multiple_of(EXTENT_ALIGNMENT);
        extents.objects.insert(object, (start, bytes));
        start
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
        let start = self.claim_extent(object, bytes);
        self.fill_extent(start, bytes, initial)
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
        let removed = self
            .extents
            .lock()
            .expect("extent lock")
            .objects
            .remove(&object);
        removed.map(drop).ok_or(StoreError::UnknownObject(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let first_start = store.claim_extent(first, BYTES as u64);
        let second_start = store.claim_extent(second, BYTES as u64);
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
