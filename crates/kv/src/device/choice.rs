//! Devices by name, as the command line and the benchmark pick them.

use super::far_memory::{FarMemoryDevice, FarMemoryPath};
use super::{Device, DeviceError, FileDevice, MemoryDevice};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Every device the store can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Memory,
    File,
    OneSidedSync,
    OneSidedAsync,
    CowbirdSpot,
    CowbirdP4,
}

impl DeviceKind {
    pub const ALL: [DeviceKind; 6] = [
        DeviceKind::Memory,
        DeviceKind::File,
        DeviceKind::OneSidedSync,
        DeviceKind::OneSidedAsync,
        DeviceKind::CowbirdSpot,
        DeviceKind::CowbirdP4,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Memory => "memory",
            DeviceKind::File => "file",
            DeviceKind::OneSidedSync => "one-sided-sync",
            DeviceKind::OneSidedAsync => "one-sided-async",
            DeviceKind::CowbirdSpot => "cowbird-spot",
            DeviceKind::CowbirdP4 => "cowbird-p4",
        }
    }

    pub fn from_name(name: &str) -> Option<DeviceKind> {
        DeviceKind::ALL.into_iter().find(|kind| kind.name() == name)
    }

    fn far_memory_path(self) -> Option<FarMemoryPath> {
        match self {
            DeviceKind::OneSidedSync => Some(FarMemoryPath::OneSidedSync),
            DeviceKind::OneSidedAsync => Some(FarMemoryPath::OneSidedAsync),
            DeviceKind::CowbirdSpot => Some(FarMemoryPath::CowbirdSpot),
            DeviceKind::CowbirdP4 => Some(FarMemoryPath::CowbirdP4(
                remora_cowbird::embedded::embedded_p4_config(),
            )),
            DeviceKind::Memory | DeviceKind::File => None,
        }
    }
}

/// Where a file device keeps its file, and with which settings.
#[derive(Debug, Clone)]
pub struct FileSettings {
    pub directory: PathBuf,
    pub io_threads: usize,
    pub direct: bool,
}

impl Default for FileSettings {
    fn default() -> FileSettings {
        FileSettings {
            // On the disk, not tmpfs: O_DIRECT needs a block device.
            directory: PathBuf::from("/var/tmp"),
            io_threads: 4,
            direct: true,
        }
    }
}

/// An opened device, with what a report needs of it afterwards.
pub struct OpenDevice {
    pub device: Arc<dyn Device>,
    far_memory: Option<Arc<FarMemoryDevice>>,
    /// Keeps the file device's directory until the device goes.
    _directory: Option<tempfile::TempDir>,
}

impl OpenDevice {
    /// Opens `kind` with `capacity_bytes` and room for `queues` queues at
    /// once (sessions plus one for flushes).
    pub fn open(
        kind: DeviceKind,
        capacity_bytes: u64,
        queues: usize,
        file: &FileSettings,
    ) -> Result<OpenDevice, DeviceError> {
        if let Some(path) = kind.far_memory_path() {
            let device = Arc::new(FarMemoryDevice::start(path, capacity_bytes, queues)?);
            return Ok(OpenDevice {
                device: device.clone(),
                far_memory: Some(device),
                _directory: None,
            });
        }
        if kind == DeviceKind::File {
            let directory = tempfile::Builder::new()
                .prefix("remora-kv-")
                .tempdir_in(&file.directory)
                .map_err(|error| {
                    DeviceError::Io(format!("{}: {error}", file.directory.display()))
                })?;
            let path = directory.path().join("hybrid-log");
            let device = FileDevice::create(&path, capacity_bytes, file.io_threads, file.direct)?;
            return Ok(OpenDevice {
                device: Arc::new(device),
                far_memory: None,
                _directory: Some(directory),
            });
        }
        Ok(OpenDevice {
            device: Arc::new(MemoryDevice::new(capacity_bytes)),
            far_memory: None,
            _directory: None,
        })
    }

    /// A far-memory device opened elsewhere (on a rack file's node).
    pub fn far_memory(device: Arc<FarMemoryDevice>) -> OpenDevice {
        OpenDevice {
            device: device.clone(),
            far_memory: Some(device),
            _directory: None,
        }
    }

    /// Stops a far-memory device's rack: the fabric thread's CPU (NIC
    /// emulation and switch, engine included) and the engine's share.
    pub fn stop(&self) -> Result<Option<(Duration, Duration)>, DeviceError> {
        let Some(far_memory) = &self.far_memory else {
            return Ok(None);
        };
        let engine = far_memory.engine_busy();
        let fabric = far_memory.stop()?;
        Ok(Some((fabric, engine)))
    }
}
