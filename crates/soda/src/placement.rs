//! Graph arrays in far memory: each array is written to a file that the
//! store loads into a new object (SODA's `alloc(bytes, file)`), and the
//! graph reads it through the object.

use crate::far::{FarAllocator, FarMemory, FarObject};
use crate::mapping::AtomicWord;
use crate::store::Advice;
use remora_graph::csr::VALUES_PREFIX;
use remora_graph::{Array, Placement, PlacementError, ValuePlacement};
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;

/// A far-memory object seen as a slice of `T`.
pub struct ObjectArray<T> {
    object: FarObject,
    element: PhantomData<T>,
}

impl<T: bytemuck::Pod> AsRef<[T]> for ObjectArray<T> {
    fn as_ref(&self) -> &[T] {
        self.object.as_slice().expect("checked when placed")
    }
}

impl<T> ObjectArray<T> {
    pub fn object(&self) -> &FarObject {
        &self.object
    }
}

/// Places every array of a graph in far memory, through files in
/// `staging_directory`.
pub struct FarPlacement<'a> {
    pub memory: &'a FarMemory,
    pub chunk_bytes: usize,
    pub staging_directory: PathBuf,
    /// Advice for an array, by name ("out offsets", "in neighbours", ...).
    pub advice: &'a dyn Fn(&str) -> Option<Advice>,
}

/// Why array `name` of `bytes` could not be placed.
fn placement_error(name: &str, bytes: usize, reason: String) -> PlacementError {
    PlacementError {
        name: name.into(),
        bytes: bytes as u64,
        reason,
    }
}

/// No advice for any array.
pub fn no_advice(_name: &str) -> Option<Advice> {
    None
}

impl FarPlacement<'_> {
    fn place<T: bytemuck::Pod + Send + Sync>(
        &self,
        name: &str,
        data: Vec<T>,
    ) -> Result<Array<T>, PlacementError> {
        let bytes: &[u8] = bytemuck::cast_slice(&data);
        let error = |reason: String| placement_error(name, bytes.len(), reason);
        let path = self
            .staging_directory
            .join(format!("{}.bin", name.replace(' ', "-")));
        std::fs::write(&path, bytes).map_err(|e| error(format!("{}: {e}", path.display())))?;
        let object = self
            .memory
            .alloc_chunked(bytes.len(), self.chunk_bytes, Some(&path))
            .map_err(|e| error(e.to_string()));
        let _ = std::fs::remove_file(&path);
        let object = object?;
        object.as_slice::<T>().map_err(|e| error(e.to_string()))?;
        if let Some(advice) = (self.advice)(name) {
            object.advise(advice).map_err(|e| error(e.to_string()))?;
        }
        Ok(Array::new(ObjectArray {
            object,
            element: PhantomData::<T>,
        }))
    }
}

impl Placement for FarPlacement<'_> {
    fn place_offsets(&self, name: &str, data: Vec<u64>) -> Result<Array<u64>, PlacementError> {
        self.place(name, data)
    }

    fn place_vertices(&self, name: &str, data: Vec<u32>) -> Result<Array<u32>, PlacementError> {
        self.place(name, data)
    }

    /// Applications' values go to far memory too, as SODA's Ligra
    /// allocates its vertex data there, with the advice values get.
    fn values(&self) -> Option<Arc<dyn ValuePlacement>> {
        Some(Arc::new(FarValues {
            allocator: self.memory.allocator(),
            chunk_bytes: self.chunk_bytes,
            advice: (self.advice)(VALUES_PREFIX),
        }))
    }
}

/// Where applications on a far-placed graph keep their values: zeroed
/// far-memory objects, advised as the placement's advice says for names
/// starting with [`VALUES_PREFIX`].
pub struct FarValues {
    allocator: FarAllocator,
    chunk_bytes: usize,
    advice: Option<Advice>,
}

impl FarValues {
    fn place<W: AtomicWord>(&self, name: &str, count: usize) -> Result<Array<W>, PlacementError> {
        let bytes = count * std::mem::size_of::<W>();
        let error = |reason: String| placement_error(name, bytes, reason);
        let object = self
            .allocator
            .alloc_chunked(bytes, self.chunk_bytes, None)
            .map_err(|e| error(e.to_string()))?;
        if let Some(advice) = self.advice {
            object.advise(advice).map_err(|e| error(e.to_string()))?;
        }
        Ok(Array::new(object.into_words::<W>()))
    }
}

impl ValuePlacement for FarValues {
    fn place_words32(&self, name: &str, count: usize) -> Result<Array<AtomicU32>, PlacementError> {
        self.place(name, count)
    }

    fn place_words64(&self, name: &str, count: usize) -> Result<Array<AtomicU64>, PlacementError> {
        self.place(name, count)
    }
}
