//! Where benchmark results live: `remora bench` saves every run's JSON in
//! a results directory outside the source tree, and `remora report`
//! reads the latest of each benchmark from it.
//!
//! The directory is `$REMORA_RESULTS` when set, else
//! `$XDG_DATA_HOME/remora/results`, else `~/.local/share/remora/results`.
//! A run is saved as `<bench>-<unix milliseconds>.json`, so the latest
//! run of a benchmark is the one with the largest number.

use serde_json::Value;
use std::path::{Path, PathBuf};

/// Why results could not be saved or read.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    #[error("no results directory: set REMORA_RESULTS, XDG_DATA_HOME or HOME")]
    NoDirectory,
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: not a benchmark's JSON: {error}")]
    Json {
        path: PathBuf,
        error: serde_json::Error,
    },
    #[error("{path}: not a benchmark's JSON: it has no \"bench\" name")]
    NoBenchName { path: PathBuf },
    #[error(
        "{directory}: no benchmark results here; run `remora bench NAME` first, or name JSON files"
    )]
    NoResults { directory: PathBuf },
}

/// The results directory this process uses.
pub fn directory() -> Result<PathBuf, ResultsError> {
    let from = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
    if let Some(directory) = from("REMORA_RESULTS") {
        return Ok(PathBuf::from(directory));
    }
    if let Some(data) = from("XDG_DATA_HOME") {
        return Ok(PathBuf::from(data).join("remora/results"));
    }
    let home = from("HOME").ok_or(ResultsError::NoDirectory)?;
    Ok(PathBuf::from(home).join(".local/share/remora/results"))
}

/// The results directory, made if it is not there and checked writable
/// (a probe file made and removed): for a long run to find out before it
/// starts, not when it saves.
pub fn ready_directory() -> Result<PathBuf, ResultsError> {
    let directory = directory()?;
    std::fs::create_dir_all(&directory).map_err(io_error(&directory))?;
    let probe = directory.join(format!(".remora-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(io_error(&probe))?;
    std::fs::remove_file(&probe).map_err(io_error(&probe))?;
    Ok(directory)
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ResultsError + '_ {
    move |error| ResultsError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// Saves one run of `bench` in `directory`, returning its path.
pub fn save(directory: &Path, bench: &str, json: &Value) -> Result<PathBuf, ResultsError> {
    save_linking(directory, bench, json, |from, to| {
        std::fs::hard_link(from, to)
    })
}

/// How a file is given a name it must not take from another.
type Link = fn(&Path, &Path) -> std::io::Result<()>;

/// [`save`], naming the written file with `link`.
fn save_linking(
    directory: &Path,
    bench: &str,
    json: &Value,
    link: Link,
) -> Result<PathBuf, ResultsError> {
    std::fs::create_dir_all(directory).map_err(io_error(directory))?;
    let now_milliseconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis());
    let text = serde_json::to_string_pretty(json).expect("a JSON value serializes");
    // Written beside its final name and linked there, so a reader never
    // sees half a file.
    let process = std::process::id();
    let partial = directory.join(format!("{bench}-{now_milliseconds}-{process}.json.partial"));
    let text = text + "\n";
    std::fs::write(&partial, &text).map_err(io_error(&partial))?;
    // The first free number from now on: a link fails where a file is, so
    // two runs saved in one millisecond (two shells, two CI jobs) never
    // share a name. (A rename replaced the first run without a word.)
    use std::io::ErrorKind;
    let mut claimed = None;
    let mut linking = true;
    for number in now_milliseconds..now_milliseconds + MAX_NAME_TRIES {
        let path = directory.join(format!("{bench}-{number}.json"));
        // A file system without links (vfat, some shares) refused the
        // link after the whole run, and the run was deleted: the name is
        // then claimed by creating it anew, which fails where a file is
        // too (a reader may see it half written, never another run's).
        let mut named = match linking {
            true => link(&partial, &path),
            false => remora_base::create_new_file(&path, text.as_bytes()),
        };
        if linking
            && named
                .as_ref()
                .is_err_and(|error| error.kind() != ErrorKind::AlreadyExists)
        {
            linking = false;
            named = remora_base::create_new_file(&path, text.as_bytes());
        }
        match named {
            Ok(()) => {
                claimed = Some(path);
                break;
            }
            Err(error) if error.kind() == ErrorKind::AlreadyExists => continue,
            // The partial file is kept, and named: it holds the run.
            Err(error) => {
                let kept = std::io::Error::new(
                    error.kind(),
                    format!(
                        "naming it {}: {error}; the run is kept here",
                        path.display()
                    ),
                );
                return Err(io_error(&partial)(kept));
            }
        }
    }
    std::fs::remove_file(&partial).map_err(io_error(&partial))?;
    claimed.ok_or_else(|| {
        io_error(directory)(std::io::Error::other(format!(
            "no free name among {MAX_NAME_TRIES} after {bench}-{now_milliseconds}.json"
        )))
    })
}

/// Names a save tries past the current millisecond's.
const MAX_NAME_TRIES: u128 = 1000;

/// A benchmark's JSON, read from a file.
#[derive(Debug, Clone)]
pub struct BenchResult {
    pub bench: String,
    pub path: PathBuf,
    pub json: Value,
}

/// Reads one benchmark JSON file.
pub fn read(path: &Path) -> Result<BenchResult, ResultsError> {
    let text = std::fs::read_to_string(path).map_err(io_error(path))?;
    let json: Value = serde_json::from_str(&text).map_err(|error| ResultsError::Json {
        path: path.to_path_buf(),
        error,
    })?;
    let bench = json["bench"]
        .as_str()
        .ok_or_else(|| ResultsError::NoBenchName {
            path: path.to_path_buf(),
        })?
        .to_string();
    Ok(BenchResult {
        bench,
        path: path.to_path_buf(),
        json,
    })
}

/// The run number in a saved file's name, `<bench>-<number>.json`.
fn run_number(path: &Path) -> Option<(String, u128)> {
    let stem = path.file_name()?.to_str()?.strip_suffix(".json")?;
    let (bench, number) = stem.rsplit_once('-')?;
    Some((bench.to_string(), number.parse().ok()?))
}

/// The latest saved run of each benchmark in `directory`, by name.
pub fn latest(directory: &Path) -> Result<Vec<BenchResult>, ResultsError> {
    let entries = std::fs::read_dir(directory).map_err(io_error(directory))?;
    let mut newest: std::collections::BTreeMap<String, (u128, PathBuf)> = Default::default();
    for entry in entries {
        let path = entry.map_err(io_error(directory))?.path();
        let Some((bench, number)) = run_number(&path) else {
            continue;
        };
        let slot = newest.entry(bench).or_insert((number, path.clone()));
        if number >= slot.0 {
            *slot = (number, path);
        }
    }
    if newest.is_empty() {
        return Err(ResultsError::NoResults {
            directory: directory.to_path_buf(),
        });
    }
    newest.values().map(|(_, path)| read(path)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A results directory that cannot make hard links (vfat, some
    /// shares) refused the link after the whole run, and the run was
    /// deleted with its partial file. The name is claimed by creating it.
    #[test]
    fn a_run_is_saved_where_links_are_refused() {
        let directory = tempfile::tempdir().unwrap();
        let refuse =
            |_: &Path, _: &Path| Err(std::io::Error::from(std::io::ErrorKind::Unsupported));
        for marker in 0..3 {
            let run = json!({"bench": "soda", "marker": marker});
            let path = save_linking(directory.path(), "soda", &run, refuse).unwrap();
            assert_eq!(read(&path).unwrap().json["marker"], marker);
        }
        let files = std::fs::read_dir(directory.path()).unwrap().count();
        assert_eq!(files, 3, "three runs, no partial file left");
    }

    /// Two runs saved in the same millisecond shared a name, and the
    /// second replaced the first without a word.
    #[test]
    fn runs_saved_in_one_millisecond_keep_their_own_files() {
        let directory = tempfile::tempdir().unwrap();
        let paths: std::collections::BTreeSet<PathBuf> = (0..20)
            .map(|marker| {
                let run = json!({"bench": "fabric", "marker": marker});
                save(directory.path(), "fabric", &run).unwrap()
            })
            .collect();
        assert_eq!(paths.len(), 20);
        let files = std::fs::read_dir(directory.path()).unwrap().count();
        assert_eq!(files, 20, "no partial file is left behind");
        let latest = latest(directory.path()).unwrap();
        assert_eq!(latest[0].json["marker"], 19, "the last saved is the latest");
    }

    #[test]
    fn the_latest_run_of_each_benchmark_is_read_and_others_are_ignored() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path();
        let write = |name: &str, bench: &str, marker: u32| {
            let text = json!({"bench": bench, "marker": marker}).to_string();
            std::fs::write(path.join(name), text).unwrap();
        };
        write("clover-100.json", "clover", 1);
        write("clover-900.json", "clover", 2);
        write("bench-name-with-dashes-5.json", "bench-name-with-dashes", 3);
        write("notes.txt", "clover", 4);
        write("clover-900.json.partial", "clover", 5);
        let latest = latest(path).unwrap();
        let markers: Vec<_> = latest
            .iter()
            .map(|result| (result.bench.as_str(), result.json["marker"].as_u64()))
            .collect();
        assert_eq!(
            markers,
            [("bench-name-with-dashes", Some(3)), ("clover", Some(2))]
        );
    }

    #[test]
    fn a_saved_run_reads_back_and_bad_files_name_their_fault() {
        let directory = tempfile::tempdir().unwrap();
        let saved = save(directory.path(), "fabric", &json!({"bench": "fabric"})).unwrap();
        assert_eq!(read(&saved).unwrap().bench, "fabric");
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            latest(empty.path()),
            Err(ResultsError::NoResults { .. })
        ));
        let nameless = directory.path().join("x.json");
        std::fs::write(&nameless, "{}").unwrap();
        assert!(matches!(
            read(&nameless),
            Err(ResultsError::NoBenchName { .. })
        ));
        std::fs::write(&nameless, "{").unwrap();
        assert!(matches!(read(&nameless), Err(ResultsError::Json { .. })));
    }
}
