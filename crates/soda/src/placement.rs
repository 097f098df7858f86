//! Graph arrays in far memory: each array is written to a file that the
//! store loads into a new object (SODA's `alloc(bytes, file)`), and the
//! graph reads it through the object.

use crate::far::{FarMemory, FarObject};
use crate::store::Advice;
use remora_graph::{Array, Placement, PlacementError};
use std::marker::PhantomData;
use std::path::PathBuf;

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
        let error = |reason: String| PlacementError {
            name: name.into(),
            bytes: bytes.len() as u64,
            reason,
        };
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
}
