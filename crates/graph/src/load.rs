//! Graph files: GAPBS's `.el` (edge list), `.wel` (weighted edge list;
//! weights are checked and dropped, no application here uses them) and
//! `.sg` (serialized CSR), Ligra's `AdjacencyGraph` text and SNAP edge
//! lists with `#` comments.
//!
//! Text errors name the line; `.sg` errors name the byte offset. Sizes in
//! a header are checked against the bytes that are there before anything
//! is allocated, so a lying header costs nothing.

use crate::csr::{Graph, GraphError};
use crate::Vertex;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphFormat {
    /// `.el`: "source destination" per line.
    EdgeList,
    /// `.wel`: "source destination weight" per line.
    WeightedEdgeList,
    /// `.sg`: GAPBS's binary CSR.
    Serialized,
    /// `.adj`: Ligra's `AdjacencyGraph`.
    Adjacency,
    /// `.txt`: a SNAP edge list, `#` lines being comments.
    Snap,
}

impl GraphFormat {
    pub fn from_path(path: &Path) -> Option<GraphFormat> {
        match path.extension()?.to_str()? {
            "el" => Some(GraphFormat::EdgeList),
            "wel" => Some(GraphFormat::WeightedEdgeList),
            "sg" => Some(GraphFormat::Serialized),
            "adj" => Some(GraphFormat::Adjacency),
            "txt" | "snap" => Some(GraphFormat::Snap),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: unknown graph format (expected .el, .wel, .sg, .adj or .txt)")]
    UnknownFormat { path: PathBuf },
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
    #[error("byte {offset}: {reason}")]
    Offset { offset: usize, reason: String },
    #[error("the largest vertex id makes {vertex_count} vertices for {edge_count} edges, past the limit of {limit}: give a larger maximum vertex count if the ids are that sparse")]
    SparseIds {
        vertex_count: usize,
        edge_count: usize,
        limit: usize,
    },
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// What was wrong with a file's contents, with the file named.
    #[error("{path}: {source}")]
    InFile {
        path: PathBuf,
        source: Box<LoadError>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoadOptions {
    /// Treat every edge as undirected (GAPBS's `-s`). Without it, edge
    /// lists are directed, as in GAPBS; `.sg` files say for themselves.
    pub symmetrize: bool,
    /// The most vertices an edge list may ask for (its largest id + 1).
    /// `None` allows [`SPARSE_IDS_PER_EDGE`] per edge plus
    /// [`SPARSE_IDS_ALLOWANCE`]: a short file cannot ask for gigabytes of
    /// offsets, while real graphs, whose ids are dense, always fit.
    pub max_vertex_count: Option<usize>,
}

/// Vertices an edge list may have per edge, by default.
pub const SPARSE_IDS_PER_EDGE: usize = 16;
/// Vertices an edge list may have whatever its edge count, by default.
pub const SPARSE_IDS_ALLOWANCE: usize = 1 << 20;

pub fn load(path: &Path, options: LoadOptions) -> Result<Graph, LoadError> {
    let format = GraphFormat::from_path(path).ok_or_else(|| LoadError::UnknownFormat {
        path: path.to_owned(),
    })?;
    let bytes = std::fs::read(path).map_err(|source| LoadError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse(format, &bytes, options).map_err(|source| LoadError::InFile {
        path: path.to_owned(),
        source: Box::new(source),
    })
}

pub fn parse(format: GraphFormat, bytes: &[u8], options: LoadOptions) -> Result<Graph, LoadError> {
    let directed = !options.symmetrize;
    match format {
        GraphFormat::Serialized => parse_serialized(bytes, options),
        GraphFormat::Adjacency => {
            let (vertex_count, edges) = parse_adjacency(bytes)?;
            Ok(Graph::from_edges(vertex_count, &edges, directed)?)
        }
        text => {
            let (vertex_count, edges) = parse_edge_lines(text, bytes)?;
            let limit = options
                .max_vertex_count
                .unwrap_or(edges.len().saturating_mul(SPARSE_IDS_PER_EDGE) + SPARSE_IDS_ALLOWANCE);
            if vertex_count > limit {
                return Err(LoadError::SparseIds {
                    vertex_count,
                    edge_count: edges.len(),
                    limit,
                });
            }
            Ok(Graph::from_edges(vertex_count, &edges, directed)?)
        }
    }
}

fn line_error(line: usize, reason: impl Into<String>) -> LoadError {
    LoadError::Line {
        line,
        reason: reason.into(),
    }
}

fn parse_vertex(token: &str, line: usize) -> Result<Vertex, LoadError> {
    let value: u64 = token
        .parse()
        .map_err(|_| line_error(line, format!("{token:?} is not a vertex id")))?;
    if value >= u64::from(crate::NO_VERTEX) {
        return Err(line_error(
            line,
            format!("vertex id {value} does not fit 32 bits"),
        ));
    }
    Ok(value as Vertex)
}

fn text_lines(bytes: &[u8]) -> Result<std::str::Lines<'_>, LoadError> {
    let text = std::str::from_utf8(bytes).map_err(|error| LoadError::Offset {
        offset: error.valid_up_to(),
        reason: "not UTF-8 text".into(),
    })?;
    Ok(text.lines())
}

/// The whitespace-separated words of a text file, each with its line
/// number, skipping SNAP's `#` comment lines when `comments`. GAPBS and
/// Ligra read their text formats as such a stream (`in >> u >> v`,
/// `stringToWords`), so an item's place on its line does not matter: read
/// a line at a time, a Ligra file with two numbers on a line, or an edge
/// list with two edges on one, was refused though both tools load it.
fn words(bytes: &[u8], comments: bool) -> Result<impl Iterator<Item = (usize, &str)>, LoadError> {
    Ok(text_lines(bytes)?
        .enumerate()
        .filter(move |(_, text)| !(comments && text.trim_start().starts_with('#')))
        .flat_map(|(index, text)| {
            text.split_ascii_whitespace()
                .map(move |word| (index + 1, word))
        }))
}

/// `.el`, `.wel` and SNAP: a stream of edges, two vertex ids each (and a
/// weight in `.wel`); returns the vertex count (largest id + 1) and the
/// edges.
fn parse_edge_lines(
    format: GraphFormat,
    bytes: &[u8],
) -> Result<(usize, Vec<(Vertex, Vertex)>), LoadError> {
    let weighted = format == GraphFormat::WeightedEdgeList;
    let mut words = words(bytes, format == GraphFormat::Snap)?;
    let mut edges = Vec::new();
    let mut vertex_count = 0usize;
    // Bounded by the file's words, two or three a turn.
    while let Some((line, first)) = words.next() {
        let source = parse_vertex(first, line)?;
        let (line, second) = words
            .next()
            .ok_or_else(|| line_error(line, "the file ends inside an edge"))?;
        let destination = parse_vertex(second, line)?;
        if weighted {
            let (line, weight) = words
                .next()
                .ok_or_else(|| line_error(line, "the file ends before an edge's weight"))?;
            if weight.parse::<f64>().map_or(true, |w| !w.is_finite()) {
                return Err(line_error(line, format!("{weight:?} is not a weight")));
            }
        }
        vertex_count = vertex_count.max(source.max(destination) as usize + 1);
        edges.push((source, destination));
    }
    Ok((vertex_count, edges))
}

/// Ligra: "AdjacencyGraph", n, m, n offsets, m neighbours, as words.
fn parse_adjacency(bytes: &[u8]) -> Result<(usize, Vec<(Vertex, Vertex)>), LoadError> {
    let mut tokens = words(bytes, false)?;
    // The line an early end is reported at: the one after the last read.
    let mut last_line = 0;
    let mut next = |what: &str| match tokens.next() {
        Some((line, text)) => {
            last_line = line;
            Ok((line, text))
        }
        None => Err(line_error(
            last_line + 1,
            format!("the file ends before {what}"),
        )),
    };
    let (line, header) = next("the header")?;
    if header != "AdjacencyGraph" {
        return Err(line_error(line, "expected the header \"AdjacencyGraph\""));
    }
    let mut number = |what: &str| -> Result<(usize, u64), LoadError> {
        let (line, text) = next(what)?;
        let value = text
            .parse::<u64>()
            .map_err(|_| line_error(line, format!("{what}: {text:?} is not a number")))?;
        Ok((line, value))
    };
    let (line, vertex_count) = number("the vertex count")?;
    if vertex_count >= u64::from(crate::NO_VERTEX) || vertex_count as usize > bytes.len() {
        return Err(line_error(
            line,
            format!("vertex count {vertex_count} is larger than the file"),
        ));
    }
    let (line, edge_count) = number("the edge count")?;
    if edge_count as usize > bytes.len() {
        return Err(line_error(
            line,
            format!("edge count {edge_count} is larger than the file"),
        ));
    }
    // Grown as the lines come, not reserved from the header: counts up to
    // the file's length reserved about 16 times it, and a failed
    // reservation aborts rather than returning an error.
    let mut offsets = Vec::new();
    for _ in 0..vertex_count {
        let (line, offset) = number("an offset")?;
        if offsets.is_empty() && offset != 0 {
            return Err(line_error(
                line,
                format!("the first offset is {offset}, not 0"),
            ));
        }
        if offset > edge_count || offsets.last().is_some_and(|&last| offset < last) {
            return Err(line_error(
                line,
                format!("offset {offset} decreases or passes the edge count"),
            ));
        }
        offsets.push(offset);
    }
    offsets.push(edge_count);
    let mut edges = Vec::new();
    let mut source = 0usize;
    for index in 0..edge_count {
        let (line, destination) = number("a neighbour")?;
        if destination >= vertex_count {
            return Err(line_error(
                line,
                format!("neighbour {destination} is not a vertex"),
            ));
        }
        while offsets[source + 1] <= index {
            source += 1;
        }
        edges.push((source as Vertex, destination as Vertex));
    }
    // Ligra refuses a file with more neighbours than m says: a wrong m
    // would otherwise drop edges silently.
    if let Ok((line, text)) = next("nothing more") {
        return Err(line_error(
            line,
            format!("{text:?} follows the {edge_count} neighbours the header counts"),
        ));
    }
    Ok((vertex_count as usize, edges))
}

struct Reader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> Reader<'a> {
    fn error(&self, reason: impl Into<String>) -> LoadError {
        LoadError::Offset {
            offset: self.offset,
            reason: reason.into(),
        }
    }

    fn take(&mut self, length: usize, what: &str) -> Result<&'a [u8], LoadError> {
        let end = self
            .offset
            .checked_add(length)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| self.error(format!("the file ends inside {what}")))?;
        let taken = &self.bytes[self.offset..end];
        self.offset = end;
        Ok(taken)
    }

    fn count(&mut self, what: &str) -> Result<usize, LoadError> {
        let value = i64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes"));
        // Each counted item takes at least 4 bytes of what follows.
        usize::try_from(value)
            .ok()
            .filter(|&count| count <= self.bytes.len() / 4)
            .ok_or_else(|| self.error(format!("{what} {value} cannot fit in the file")))
    }

    fn offsets(&mut self, vertex_count: usize) -> Result<Vec<u64>, LoadError> {
        let bytes = self.take((vertex_count + 1) * 8, "the offsets")?;
        bytes
            .chunks_exact(8)
            .map(|chunk| {
                let value = i64::from_le_bytes(chunk.try_into().expect("8 bytes"));
                u64::try_from(value).map_err(|_| self.error(format!("negative offset {value}")))
            })
            .collect()
    }

    fn neighbours(&mut self, edge_count: usize) -> Result<Vec<Vertex>, LoadError> {
        let bytes = self.take(edge_count * 4, "the neighbours")?;
        bytes
            .chunks_exact(4)
            .map(|chunk| {
                let value = i32::from_le_bytes(chunk.try_into().expect("4 bytes"));
                u32::try_from(value).map_err(|_| self.error(format!("negative vertex {value}")))
            })
            .collect()
    }
}

fn parse_serialized(bytes: &[u8], options: LoadOptions) -> Result<Graph, LoadError> {
    let mut reader = Reader { bytes, offset: 0 };
    let directed = match reader.take(1, "the header")?[0] {
        0 => false,
        1 => true,
        other => return Err(reader.error(format!("directed flag {other} is neither 0 nor 1"))),
    };
    let edge_count = reader.count("edge count")?;
    let vertex_count = reader.count("vertex count")?;
    let out_offsets = reader.offsets(vertex_count)?;
    let out_neighbours = reader.neighbours(edge_count)?;
    let incoming = if directed {
        Some((
            reader.offsets(vertex_count)?,
            reader.neighbours(edge_count)?,
        ))
    } else {
        None
    };
    if reader.offset != bytes.len() {
        return Err(reader.error("bytes follow the graph"));
    }
    let graph = Graph::from_csr(out_offsets, out_neighbours, incoming)?;
    if options.symmetrize && graph.is_directed() {
        let edges: Vec<(Vertex, Vertex)> = (0..graph.vertex_count() as Vertex)
            .flat_map(|source| {
                graph
                    .out_neighbours(source)
                    .iter()
                    .map(move |&d| (source, d))
            })
            .collect();
        return Ok(Graph::from_edges(graph.vertex_count(), &edges, false)?);
    }
    Ok(graph)
}

/// Writes `graph` as GAPBS's `.sg`. Its ids are 32-bit signed: a graph
/// of more vertices is refused (written, its ids past 2^31 read back as
/// negative, and neither this loader nor GAPBS could load it).
pub fn write_serialized(graph: &Graph, out: &mut impl Write) -> std::io::Result<()> {
    check_serializable(graph.vertex_count())?;
    let ((out_offsets, out_neighbours), incoming) = graph.arrays();
    out.write_all(&[u8::from(graph.is_directed())])?;
    out.write_all(&(out_neighbours.len() as i64).to_le_bytes())?;
    out.write_all(&(graph.vertex_count() as i64).to_le_bytes())?;
    let sides = std::iter::once((out_offsets, out_neighbours)).chain(incoming);
    for (offsets, neighbours) in sides {
        for &offset in offsets {
            out.write_all(&(offset as i64).to_le_bytes())?;
        }
        for &neighbour in neighbours {
            out.write_all(&(neighbour as i32).to_le_bytes())?;
        }
    }
    Ok(())
}

fn check_serializable(vertex_count: usize) -> std::io::Result<()> {
    if vertex_count > i32::MAX as usize {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{vertex_count} vertices do not fit .sg's 32-bit signed ids"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_graph_past_signed_32_bit_ids_is_not_written_as_sg() {
        assert!(check_serializable(i32::MAX as usize).is_ok());
        let refused = check_serializable(i32::MAX as usize + 1).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::InvalidInput);
    }

    fn expect_line(result: Result<Graph, LoadError>, wanted: usize) {
        match result {
            Err(LoadError::Line { line, .. }) => assert_eq!(line, wanted),
            other => panic!("expected an error on line {wanted}, got {other:?}"),
        }
    }

    #[test]
    fn text_formats_read_and_errors_name_the_line() {
        let options = LoadOptions::default();
        let graph = parse(GraphFormat::EdgeList, b"0 1\n1 2\n\n2 0\n", options).unwrap();
        assert_eq!((graph.vertex_count(), graph.edge_count()), (3, 3));
        let snap = parse(
            GraphFormat::Snap,
            b"# Nodes: 3\n0\t1\n# more\n1\t2\n",
            options,
        )
        .unwrap();
        assert_eq!(snap.out_neighbours(1), &[2]);
        parse(GraphFormat::WeightedEdgeList, b"0 1 2.5\n", options).unwrap();
        expect_line(parse(GraphFormat::EdgeList, b"0 1\n1 x\n", options), 2);
        expect_line(
            parse(GraphFormat::WeightedEdgeList, b"0 1 2\n0 1\n", options),
            2,
        );
        expect_line(parse(GraphFormat::EdgeList, b"0 4294967295\n", options), 1);
    }

    #[test]
    fn ligra_adjacency_graphs_read() {
        let text = b"AdjacencyGraph\n3\n4\n0\n2\n3\n1\n2\n2\n0\n";
        let graph = parse(GraphFormat::Adjacency, text, LoadOptions::default()).unwrap();
        assert_eq!(graph.out_neighbours(0), &[1, 2]);
        assert_eq!(graph.out_neighbours(1), &[2]);
        assert_eq!(graph.out_neighbours(2), &[0]);
        expect_line(
            parse(
                GraphFormat::Adjacency,
                b"AdjacencyGraph\n2\n1\n0\n1\n5\n",
                LoadOptions::default(),
            ),
            6,
        );
    }

    /// Ligra and GAPBS read their text formats as streams of words, so
    /// two items on a line load there; read a line at a time, both files
    /// were refused here.
    #[test]
    fn text_formats_read_as_streams_of_words() {
        let options = LoadOptions::default();
        let ligra = parse(
            GraphFormat::Adjacency,
            b"AdjacencyGraph\n2 1\n0 1\n1\n",
            options,
        )
        .unwrap();
        assert_eq!(ligra.out_neighbours(0), &[1]);
        assert_eq!(ligra.out_neighbours(1), &[] as &[Vertex]);
        let edges = parse(GraphFormat::EdgeList, b"0 1 1 2\n", options).unwrap();
        assert_eq!((edges.vertex_count(), edges.edge_count()), (3, 2));
        expect_line(parse(GraphFormat::EdgeList, b"0 1\n2\n", options), 2);
    }

    #[test]
    fn a_ligra_file_whose_offsets_start_past_0_or_that_runs_past_m_is_refused() {
        let offsets_from_1 = b"AdjacencyGraph\n2\n2\n1\n1\n1\n0\n";
        expect_line(
            parse(
                GraphFormat::Adjacency,
                offsets_from_1,
                LoadOptions::default(),
            ),
            4,
        );
        let one_neighbour_too_many = b"AdjacencyGraph\n1\n0\n0\n5\n";
        expect_line(
            parse(
                GraphFormat::Adjacency,
                one_neighbour_too_many,
                LoadOptions::default(),
            ),
            5,
        );
    }

    #[test]
    fn an_undirected_serialized_graph_listing_an_edge_one_way_is_refused() {
        // Undirected, 1 edge, 2 vertices: 0 lists 1, but 1 lists nothing.
        let mut bytes = vec![0u8];
        for value in [1i64, 2, 0, 1, 1] {
            bytes.extend_from_slice(&value.to_le_bytes());
        }
        bytes.extend_from_slice(&1i32.to_le_bytes());
        assert!(matches!(
            parse(GraphFormat::Serialized, &bytes, LoadOptions::default()),
            Err(LoadError::Graph(GraphError::NotSymmetric { vertex: 0 }))
        ));
    }

    #[test]
    fn serialized_graphs_round_trip_and_lying_headers_are_caught() {
        for directed in [false, true] {
            let graph = Graph::from_edges(5, &[(0, 1), (1, 2), (3, 4), (4, 0)], directed).unwrap();
            let mut bytes = Vec::new();
            write_serialized(&graph, &mut bytes).unwrap();
            let read = parse(GraphFormat::Serialized, &bytes, LoadOptions::default()).unwrap();
            assert_eq!(read.arrays(), graph.arrays());
            let mut lying = bytes.clone();
            lying[1..9].copy_from_slice(&(1i64 << 40).to_le_bytes());
            assert!(matches!(
                parse(GraphFormat::Serialized, &lying, LoadOptions::default()),
                Err(LoadError::Offset { offset: 9, .. })
            ));
            let truncated = &bytes[..bytes.len() - 1];
            assert!(parse(GraphFormat::Serialized, truncated, LoadOptions::default()).is_err());
        }
    }
}
