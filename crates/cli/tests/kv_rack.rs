//! Recovery after the compute process is killed: the switch and the
//! memory node run as processes of their own (`remora rack switch`,
//! `remora node --udp`), `remora kv serve --rack` keeps its log in the
//! memory node's region, redis-cli writes and SAVEs, the server is killed
//! with SIGKILL, and a new one started with `--recover` serves every write
//! acknowledged before the SAVE, and none after it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills a process when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn remora(arguments: &[&str], log: &Path) -> Running {
    let log = std::fs::File::create(log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(arguments)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start remora");
    Running(child)
}

fn redis_cli(port: u16, arguments: &[&str]) -> String {
    let output = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(arguments)
        .stderr(Stdio::null())
        .output()
        .expect("redis-cli is installed (.ci/run installs redis-tools)");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

fn wait_for_server(port: u16, log: &Path) {
    let started = Instant::now();
    while redis_cli(port, &["ping"]) != "PONG" {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no server: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A rack of a compute and a memory node whose ports no other test uses.
fn rack_file(directory: &Path) -> std::path::PathBuf {
    let base = 41000 + (std::process::id() % 500) as u16 * 10;
    let text = format!(
        r#"[rack]
name = "kv-recovery"

[switch]
program = "l2l3"
tunnel_host = "127.0.0.1"
tunnel_base_port = {base}

[[node]]
name = "compute0"
role = "compute"
address = "10.0.0.1"
memory = "1MiB"
tunnel = "127.0.0.61:{compute}"

[[node]]
name = "memory0"
role = "memory"
address = "10.0.0.2"
memory = "64MiB"
tunnel = "127.0.0.62:{memory}"
control = "127.0.0.62:{control}"
"#,
        compute = base + 5,
        memory = base + 6,
        control = base + 7,
    );
    let path = directory.join("rack.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_killed_server_recovers_every_saved_write_from_the_memory_node() {
    if std::env::var_os("REMORA_SKIP_REDIS").is_some() {
        eprintln!("skipped: REMORA_SKIP_REDIS is set");
        return;
    }
    let directory = tempfile::tempdir().unwrap();
    let dir = directory.path();
    let rack = rack_file(dir);
    let store = dir.join("store.toml");
    std::fs::write(
        &store,
        "sessions = 4\npage_bits = 16\nmemory_pages = 8\nindex_buckets = 4096\n",
    )
    .unwrap();
    let (rack, store, run_dir) = (
        rack.to_str().unwrap(),
        store.to_str().unwrap(),
        dir.to_str().unwrap(),
    );
    let _switch = remora(&["rack", "switch", rack], &dir.join("switch.log"));
    let _memory = remora(
        &[
            "node",
            rack,
            "--name",
            "memory0",
            "--udp",
            "--run-dir",
            run_dir,
        ],
        &dir.join("memory.log"),
    );
    let port = 7000 + (std::process::id() % 900) as u16;
    let listen = format!("127.0.0.1:{port}");
    let serve = |recover: bool, log: &str| {
        let mut arguments = vec![
            "kv",
            "serve",
            "--rack",
            rack,
            "--run-dir",
            run_dir,
            "--config",
            store,
        ];
        arguments.extend(["--max-connections", "2", "--listen", &listen]);
        if recover {
            arguments.push("--recover");
        }
        let log = dir.join(log);
        let server = remora(&arguments, &log);
        wait_for_server(port, &log);
        server
    };

    let mut first = serve(false, "serve-1.log");
    assert_eq!(redis_cli(port, &["set", "greeting", "hello"]), "OK");
    for _ in 0..5 {
        redis_cli(port, &["incr", "counter"]);
    }
    // Enough other values that the saved ones leave memory for the device.
    let filler = "x".repeat(2000);
    for number in 0..400 {
        redis_cli(port, &["set", &format!("filler-{number}"), &filler]);
    }
    assert_eq!(redis_cli(port, &["save"]), "OK");
    assert_eq!(
        redis_cli(port, &["set", "greeting", "after the save"]),
        "OK"
    );
    assert_eq!(redis_cli(port, &["incr", "counter"]), "6");
    first.0.kill().unwrap();
    first.0.wait().unwrap();

    let _second = serve(true, "serve-2.log");
    let recovered = std::fs::read_to_string(dir.join("serve-2.log")).unwrap();
    assert!(recovered.contains("recovered checkpoint 1"), "{recovered}");
    assert_eq!(redis_cli(port, &["get", "greeting"]), "hello");
    assert_eq!(redis_cli(port, &["get", "counter"]), "5");
    assert_eq!(redis_cli(port, &["get", "filler-0"]), filler);
    assert_eq!(redis_cli(port, &["get", "filler-399"]), filler);
}
