//! Where a graph's arrays live.
//!
//! A kernel reads an [`Array`] as a plain slice. Behind it is either a
//! local vector or memory a [`Placement`] gave out (a far-memory object),
//! kept alive by the array. Kernels never know which.

use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;

/// An immutable array of `T`, shared cheaply between threads.
pub struct Array<T: 'static> {
    storage: Arc<dyn AsRef<[T]> + Send + Sync>,
}

impl<T: 'static> Array<T> {
    /// An array over any storage that yields a slice: a vector, or a typed
    /// view of a far-memory object.
    pub fn new(storage: impl AsRef<[T]> + Send + Sync + 'static) -> Array<T> {
        Array {
            storage: Arc::new(storage),
        }
    }
}

impl<T: Send + Sync + 'static> From<Vec<T>> for Array<T> {
    fn from(vector: Vec<T>) -> Array<T> {
        Array::new(vector)
    }
}

impl<T: 'static> Clone for Array<T> {
    fn clone(&self) -> Array<T> {
        Array {
            storage: Arc::clone(&self.storage),
        }
    }
}

impl<T: 'static> Deref for Array<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        (*self.storage).as_ref()
    }
}

impl<T: 'static> fmt::Debug for Array<T> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "Array(len {})", self.len())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("placing array {name:?} ({bytes} bytes): {reason}")]
pub struct PlacementError {
    pub name: String,
    pub bytes: u64,
    pub reason: String,
}

/// Puts a graph's arrays somewhere. `name` says which array ("out
/// offsets", "out neighbours", ...), so a placement can pin some and not
/// others (SODA's static cache pins vertex data, not edges).
pub trait Placement {
    fn place_offsets(&self, name: &str, data: Vec<u64>) -> Result<Array<u64>, PlacementError>;
    fn place_vertices(&self, name: &str, data: Vec<u32>) -> Result<Array<u32>, PlacementError>;
    /// Where the applications run on the placed graph keep their
    /// per-vertex values; `None` keeps them in local memory.
    fn values(&self) -> Option<Arc<dyn ValuePlacement>> {
        None
    }
}

/// Where applications keep their per-vertex values (PageRank's ranks,
/// BFS's parents, ...): vertex data as much as the offsets are, so SODA's
/// Ligra allocates them in far memory too (§V). Values are atomic words,
/// zeroed, because the kernels' threads update them in place.
pub trait ValuePlacement: Send + Sync {
    fn place_words32(&self, name: &str, count: usize) -> Result<Array<AtomicU32>, PlacementError>;
    fn place_words64(&self, name: &str, count: usize) -> Result<Array<AtomicU64>, PlacementError>;
}

/// Local memory: the array is the vector itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalPlacement;

impl Placement for LocalPlacement {
    fn place_offsets(&self, _name: &str, data: Vec<u64>) -> Result<Array<u64>, PlacementError> {
        Ok(Array::from(data))
    }
    fn place_vertices(&self, _name: &str, data: Vec<u32>) -> Result<Array<u32>, PlacementError> {
        Ok(Array::from(data))
    }
}

impl ValuePlacement for LocalPlacement {
    fn place_words32(&self, _name: &str, count: usize) -> Result<Array<AtomicU32>, PlacementError> {
        Ok(Array::from(
            (0..count).map(|_| AtomicU32::new(0)).collect::<Vec<_>>(),
        ))
    }
    fn place_words64(&self, _name: &str, count: usize) -> Result<Array<AtomicU64>, PlacementError> {
        Ok(Array::from(
            (0..count).map(|_| AtomicU64::new(0)).collect::<Vec<_>>(),
        ))
    }
}
