//! A set of vertices that a traversal starts from: a list when it is
//! small (sparse), a flag per vertex when it is large (dense).

use crate::Vertex;
use rayon::prelude::*;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frontier {
    Sparse(Vec<Vertex>),
    Dense { members: Vec<bool>, count: usize },
}

impl Frontier {
    pub fn empty() -> Frontier {
        Frontier::Sparse(Vec::new())
    }

    pub fn single(vertex: Vertex) -> Frontier {
        Frontier::Sparse(vec![vertex])
    }

    pub fn all(vertex_count: usize) -> Frontier {
        Frontier::Dense {
            members: vec![true; vertex_count],
            count: vertex_count,
        }
    }

    pub fn from_members(members: Vec<bool>) -> Frontier {
        let count = members.par_iter().filter(|&&member| member).count();
        Frontier::Dense { members, count }
    }

    pub fn len(&self) -> usize {
        match self {
            Frontier::Sparse(vertices) => vertices.len(),
            Frontier::Dense { count, .. } => *count,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The members as a list, in increasing order for a dense frontier.
    pub fn to_vertices(&self) -> Vec<Vertex> {
        match self {
            Frontier::Sparse(vertices) => vertices.clone(),
            Frontier::Dense { members, .. } => members
                .par_iter()
                .enumerate()
                .filter(|(_, &member)| member)
                .map(|(vertex, _)| vertex as Vertex)
                .collect(),
        }
    }

    /// One flag per vertex.
    pub fn to_members(&self, vertex_count: usize) -> Vec<bool> {
        match self {
            Frontier::Sparse(vertices) => {
                let mut members = vec![false; vertex_count];
                for &vertex in vertices {
                    members[vertex as usize] = true;
                }
                members
            }
            Frontier::Dense { members, .. } => members.clone(),
        }
    }
}
