//! Register arrays: per-stage stateful memory a program reads and writes
//! as packets pass, like a Tofino RegisterAction.

use crate::resources::RegisterResources;

#[derive(Debug, Clone)]
pub struct RegisterArray<T> {
    name: &'static str,
    stage: u8,
    cells: Vec<T>,
}

impl<T: Copy + Default> RegisterArray<T> {
    pub fn new(name: &'static str, stage: u8, cell_count: usize) -> RegisterArray<T> {
        RegisterArray {
            name,
            stage,
            cells: vec![T::default(); cell_count],
        }
    }

    pub fn len(&self) -> usize {
        self.cells.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// None for an index past the array, which a program must handle (a
    /// hardware index would wrap or be masked; silently wrapping here would
    /// hide bugs).
    pub fn read(&self, index: usize) -> Option<T> {
        self.cells.get(index).copied()
    }

    /// Applies `update` to one cell and returns the new value: the
    /// read-modify-write a RegisterAction does in one stage.
    pub fn update(&mut self, index: usize, update: impl FnOnce(T) -> T) -> Option<T> {
        let cell = self.cells.get_mut(index)?;
        *cell = update(*cell);
        Some(*cell)
    }

    pub fn resources(&self) -> RegisterResources {
        RegisterResources {
            name: self.name.to_string(),
            stage: self.stage,
            cells: self.cells.len(),
            cell_bytes: std::mem::size_of::<T>(),
        }
    }
}
