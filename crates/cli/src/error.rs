//! The command line's errors, typed down to `main` (whose `CliError` has
//! one per command): a system's failure keeps the system's own typed error
//! as its source, so a test can match on which check failed.

use crate::capture::CaptureError;
use crate::output::OutputError;
use crate::HistoryFileError;
use remora_rack::RackError;
use std::path::PathBuf;

/// A system's own error, with the system it came from: a demo step that
/// could not run, or a rack-file section the system refuses. The source
/// is the system's typed error (`source.downcast_ref` recovers it).
#[derive(Debug, thiserror::Error)]
#[error("{system}: {source}")]
pub struct SystemError {
    pub system: &'static str,
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl SystemError {
    pub fn new(
        system: &'static str,
        error: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        SystemError {
            system,
            source: Box::new(error),
        }
    }
}

/// Names the system a result's error came from.
pub trait InSystem<T> {
    fn in_system(self, system: &'static str) -> Result<T, SystemError>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> InSystem<T> for Result<T, E> {
    fn in_system(self, system: &'static str) -> Result<T, SystemError> {
        self.map_err(|error| SystemError::new(system, error))
    }
}

/// Why `remora demo` could not run (a failed check is not an error: the
/// demo reports it and exits 1).
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("the operations tour: {0}")]
    Tour(#[from] remora_rnic::VerbsError),
    #[error("the capture: {0}")]
    Capture(#[from] CaptureError),
    #[error("the embedded rack: {0}")]
    Rack(#[from] RackError),
    #[error("cannot find the remora executable: {0}")]
    Executable(std::io::Error),
    #[error(transparent)]
    System(#[from] SystemError),
    #[error(transparent)]
    History(#[from] HistoryFileError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error("the report: {0}")]
    Report(#[from] remora_report::ReportError),
}

/// Why `remora sim` could not run (failing seeds are not an error: the
/// campaign reports them and exits 1).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot read {path}: {source}")]
    ReadConfig {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {position}")]
    ParseConfig { path: PathBuf, position: String },
    #[error(transparent)]
    Config(#[from] remora_conformance::ScenarioConfigError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error("{count} seeds from {first}: a campaign runs at least one seed, and none past {}", u64::MAX - 1)]
    Seeds { first: u64, count: u64 },
}

/// Why `remora rack` or `remora node` could not run.
#[derive(Debug, thiserror::Error)]
pub enum RackCommandError {
    #[error(transparent)]
    Rack(#[from] RackError),
    #[error("{path}: {source}")]
    Unclaimed { path: PathBuf, source: RackError },
    #[error("{path}: {source}")]
    Section { path: PathBuf, source: SystemError },
    #[error("cannot find the remora executable: {0}")]
    Executable(std::io::Error),
    #[error("descriptor {0} is a standard stream, not one the launcher passes")]
    StandardStream(i32),
    #[error("descriptor {fd} is not open: {source}")]
    DescriptorClosed { fd: i32, source: rustix::io::Errno },
    #[error("say how this node reaches the switch: --shm-fd, --udp-fd with --udp-peer, --udp-bind with --udp-peer, --udp, or --packet-interface")]
    NoCarrier,
    #[error(transparent)]
    Output(#[from] OutputError),
}
