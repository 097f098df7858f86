//! Per-vertex results as text: one "vertex value" line per vertex.

use std::fmt::Display;
use std::io::{BufWriter, Write};
use std::path::Path;

pub fn write_vertex_values<T: Display>(path: &Path, values: &[T]) -> std::io::Result<()> {
    let mut out = BufWriter::new(std::fs::File::create(path)?);
    write_vertex_values_to(&mut out, values)?;
    out.flush()
}

pub fn write_vertex_values_to<T: Display>(
    out: &mut impl Write,
    values: &[T],
) -> std::io::Result<()> {
    for (vertex, value) in values.iter().enumerate() {
        writeln!(out, "{vertex} {value}")?;
    }
    Ok(())
}
