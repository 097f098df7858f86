//! The five applications of SODA's case study (and Ligra's paper).

pub mod bc;
pub mod bfs;
pub mod cc;
pub mod pagerank;
pub mod radii;

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum App {
    Bfs,
    PageRank,
    Radii,
    Bc,
    Cc,
}

impl App {
    pub const ALL: [App; 5] = [App::Bfs, App::PageRank, App::Radii, App::Bc, App::Cc];

    pub fn name(self) -> &'static str {
        match self {
            App::Bfs => "bfs",
            App::PageRank => "pr",
            App::Radii => "radii",
            App::Bc => "bc",
            App::Cc => "cc",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown application {0:?}: expected bfs, pr, radii, bc or cc")]
pub struct UnknownApp(pub String);

impl FromStr for App {
    type Err = UnknownApp;
    fn from_str(text: &str) -> Result<App, UnknownApp> {
        App::ALL
            .into_iter()
            .find(|app| app.name() == text)
            .ok_or_else(|| UnknownApp(text.into()))
    }
}

/// An `f64` updated by several threads (BC's path counts and dependencies).
#[derive(Debug, Default)]
pub(crate) struct AtomicF64(AtomicU64);

impl AtomicF64 {
    pub(crate) fn new(value: f64) -> AtomicF64 {
        AtomicF64(AtomicU64::new(value.to_bits()))
    }

    pub(crate) fn load(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    pub(crate) fn store(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Relaxed);
    }

    /// Adds `value`; returns what was there before.
    pub(crate) fn fetch_add(&self, value: f64) -> f64 {
        let mut current = self.0.load(Ordering::Relaxed);
        loop {
            let next = (f64::from_bits(current) + value).to_bits();
            match self
                .0
                .compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(previous) => return f64::from_bits(previous),
                Err(actual) => current = actual,
            }
        }
    }
}
