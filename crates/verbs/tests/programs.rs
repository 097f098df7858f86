//! Unmodified RDMA programs from Debian's packages (`ibverbs-utils`,
//! `perftest`) run on Remora's libibverbs: two processes, over UDP and over
//! shared memory. Skipped loudly where the packages are missing, and
//! failing instead where `REMORA_REQUIRE_PERFTEST` is set (`.ci/run`).
//!
//! The libraries are the workspace's build output (`cargo build
//! --workspace` builds the stand-ins, which `cargo test` alone does not).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

/// A directory holding `lib*.so.1` links to the built libraries: what a
/// user's `LD_LIBRARY_PATH` names. Made once per test process (the tests
/// run in parallel threads).
fn library_directory() -> PathBuf {
    static DIRECTORY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIRECTORY.get_or_init(link_libraries).clone()
}

fn link_libraries() -> PathBuf {
    ibverbs::libraries::link_libraries(&common::build_directory(), "remora-verbs-test-libraries")
        .unwrap_or_else(|error| panic!("{error}"))
}

/// Whether `program` is installed; if not, the test is skipped loudly, or
/// fails where the packages are required.
fn installed(program: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|output| output.status.success());
    common::available(found, program, "REMORA_REQUIRE_PERFTEST")
}

/// Ports no two tests share: UDP carrier ports and the programs' own TCP
/// exchange ports.
fn next_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 2_000) as u16 * 10;
    base + NEXT.fetch_add(1, Ordering::Relaxed) % 10 * 1_000
}

#[derive(Clone)]
enum Carrier {
    Udp,
    SharedMemory,
}

/// The two processes' `REMORA_VERBS` values.
fn specs(carrier: &Carrier, name: &str) -> (String, String) {
    match carrier {
        Carrier::Udp => {
            let port = next_port();
            (
                format!("udp 127.0.0.1:{port} 127.0.0.2:{port}"),
                format!("udp 127.0.0.2:{port} 127.0.0.1:{port}"),
            )
        }
        Carrier::SharedMemory => {
            let socket = std::env::temp_dir().join(format!(
                "remora-verbs-test-{}-{name}.sock",
                std::process::id()
            ));
            let _ = std::fs::remove_file(&socket);
            let spec = format!("shm {}", socket.display());
            (spec.clone(), spec)
        }
    }
}

fn command(program: &str, spec: &str, arguments: &[String]) -> Command {
    let mut command = Command::new("timeout");
    command
        .arg("60")
        .arg(program)
        .args(arguments)
        .env("LD_LIBRARY_PATH", library_directory())
        .env("REMORA_VERBS", spec)
        .stdin(Stdio::null());
    command
}

/// Runs `program` as server and client (the client names 127.0.0.1), and
/// returns both outputs.
fn server_and_client(
    program: &str,
    carrier: Carrier,
    arguments: &[&str],
    client_environment: &[(&str, &Path)],
) -> (Output, Output) {
    let (server_spec, client_spec) = specs(&carrier, program);
    run_pair(
        program,
        &server_spec,
        &client_spec,
        arguments,
        client_environment,
    )
}

fn run_pair(
    program: &str,
    server_spec: &str,
    client_spec: &str,
    arguments: &[&str],
    client_environment: &[(&str, &Path)],
) -> (Output, Output) {
    let tcp_port = next_port() + 1;
    let mut arguments: Vec<String> = arguments
        .iter()
        .map(|argument| argument.to_string())
        .collect();
    arguments.extend(["-p".to_string(), tcp_port.to_string()]);
    let mut server = command(program, server_spec, &arguments)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    // The server listens on its TCP port before the client connects (a
    // fixed pause could end first on a loaded machine). If it never does,
    // the client's failure and the server's output say why.
    remora_base::await_listening(&mut server, tcp_port, Duration::from_secs(20)).unwrap();
    arguments.push("127.0.0.1".to_string());
    let mut client_command = command(program, client_spec, &arguments);
    for (name, value) in client_environment {
        client_command.env(name, value);
    }
    let client = client_command.output().expect("run the client");
    let server = server.wait_with_output().expect("wait for the server");
    (server, client)
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn assert_succeeded(name: &str, output: &Output) {
    assert!(output.status.success(), "{name} failed:\n{}", text(output));
}

#[test]
fn ibv_devinfo_lists_the_remora_device_with_its_roce_gid() {
    if !installed("ibv_devinfo") {
        return;
    }
    let spec = "udp 127.0.0.1:7 127.0.0.2:7";
    let output = command("ibv_devinfo", spec, &["-v".into()])
        .output()
        .unwrap();
    assert_succeeded("ibv_devinfo", &output);
    let printed = text(&output);
    for expected in [
        "hca_id:\tremora0",
        "PORT_ACTIVE",
        "link_layer:\t\tEthernet",
        "GID[  0]:\t\t::ffff:127.0.0.1, RoCE v2",
    ] {
        assert!(printed.contains(expected), "no {expected:?} in:\n{printed}");
    }
}

#[test]
fn a_bad_configuration_is_one_line_and_no_device() {
    if !installed("ibv_devinfo") {
        return;
    }
    for spec in ["udp 127.0.0.1:7", "carrier-pigeon"] {
        let output = command("ibv_devinfo", spec, &[]).output().unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        let ours: Vec<&str> = stderr
            .lines()
            .filter(|line| line.starts_with("remora-verbs:"))
            .collect();
        assert_eq!(ours.len(), 1, "{stderr}");
        assert!(ours[0].contains("REMORA_VERBS"), "{stderr}");
        assert!(stderr.contains("Failed to get IB devices list"), "{stderr}");
    }
}

fn pingpong(carrier: Carrier, arguments: &[&str]) {
    if !installed("ibv_rc_pingpong") {
        return;
    }
    let (server, client) = server_and_client("ibv_rc_pingpong", carrier, arguments, &[]);
    assert_succeeded("server", &server);
    assert_succeeded("client", &client);
    for output in [&server, &client] {
        assert!(text(output).contains("200 iters in"), "{}", text(output));
    }
}

#[test]
fn ibv_rc_pingpong_completes_over_udp_by_gid() {
    pingpong(Carrier::Udp, &["-g", "0", "-n", "200"]);
}

#[test]
fn ibv_rc_pingpong_completes_over_shared_memory_by_lid_with_events() {
    // No GID (the peer is the carrier's other end) and completion events.
    pingpong(Carrier::SharedMemory, &["-n", "200", "-e"]);
}

/// The last row of a perftest table: its numeric columns.
fn table_row(printed: &str) -> Vec<f64> {
    let mut lines = printed.lines().skip_while(|line| !line.contains("#bytes"));
    lines.next().expect("a table header");
    let row = lines.next().expect("a table row");
    row.split_whitespace()
        .map(|field| {
            field
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("row {row:?}"))
        })
        .collect()
}

fn perftest(program: &str, carrier: Carrier, arguments: &[&str]) -> Vec<f64> {
    let (server, client) = server_and_client(program, carrier, arguments, &[]);
    assert_succeeded(&format!("{program} server"), &server);
    assert_succeeded(&format!("{program} client"), &client);
    table_row(&text(&client))
}

#[test]
fn perftest_latency_tools_print_their_tables_over_udp() {
    if !installed("ib_write_lat") {
        return;
    }
    for program in [
        "ib_send_lat",
        "ib_write_lat",
        "ib_read_lat",
        "ib_atomic_lat",
    ] {
        let row = perftest(program, Carrier::Udp, &["-n", "200"]);
        // #bytes, #iterations, t_min, t_max, t_typical, t_avg, ...
        assert_eq!(row[1], 200.0, "{program}: {row:?}");
        assert!(row[2] > 0.0 && row[2] <= row[4], "{program}: {row:?}");
    }
}

#[test]
fn perftest_bandwidth_tools_print_their_tables_over_udp_and_shared_memory() {
    if !installed("ib_write_bw") {
        return;
    }
    for (program, carrier) in [
        ("ib_write_bw", Carrier::Udp),
        ("ib_read_bw", Carrier::Udp),
        ("ib_write_bw", Carrier::SharedMemory),
    ] {
        let row = perftest(program, carrier, &["-n", "200"]);
        // #bytes, #iterations, BW peak, BW average, MsgRate
        assert_eq!(row[0], 65536.0, "{program}: {row:?}");
        assert!(row[3] > 0.0, "{program}: {row:?}");
    }
}

#[test]
fn a_perftest_capture_is_rocev2_with_every_icrc_right() {
    if !installed("ib_write_lat") {
        return;
    }
    let capture = std::env::temp_dir().join(format!("remora-verbs-{}.pcap", std::process::id()));
    let (server, client) = server_and_client(
        "ib_read_lat",
        Carrier::Udp,
        &["-n", "50"],
        &[("REMORA_VERBS_PCAP", &capture)],
    );
    assert_succeeded("server", &server);
    assert_succeeded("client", &client);
    check_capture(&capture);
    std::fs::remove_file(&capture).ok();
}

fn check_capture(capture: &Path) {
    let path = capture.to_str().unwrap();
    let Some(decoded) = tshark(&[
        "-r",
        path,
        "-T",
        "fields",
        "-e",
        "frame.protocols",
        "-e",
        "infiniband.bth.opcode",
    ]) else {
        return;
    };
    let frames: Vec<(&str, &str)> = decoded
        .lines()
        .map(|line| line.split_once('\t').expect("two fields"))
        .collect();
    // 50 READ requests and 50 responses, at least.
    assert!(frames.len() >= 100, "{} frames", frames.len());
    assert!(frames
        .iter()
        .all(|(protocols, _)| protocols.contains(":infiniband")));
    let opcodes: BTreeSet<&str> = frames.iter().map(|(_, opcode)| *opcode).collect();
    // READ request (12) and READ response only (16).
    assert!(
        opcodes.contains("12") && opcodes.contains("16"),
        "{opcodes:?}"
    );
    let problems = tshark(&[
        "-r",
        path,
        "-Y",
        "_ws.malformed || _ws.expert.severity >= \"warning\"",
    ])
    .unwrap_or_default();
    assert!(
        problems.trim().is_empty(),
        "frames tshark flags:\n{problems}"
    );
    check_icrcs_with_scapy(capture, frames.len());
}

fn tshark(arguments: &[&str]) -> Option<String> {
    let output = Command::new("tshark").args(arguments).output();
    if !common::available(output.is_ok(), "tshark", "REMORA_REQUIRE_TSHARK") {
        return None;
    }
    let output = output.expect("checked");
    assert!(
        output.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(String::from_utf8(output.stdout).unwrap())
}

/// scapy's RoCE layer recomputes every ICRC (`tools/scapy_icrc.py`, as the
/// rack's capture test does).
fn check_icrcs_with_scapy(capture: &Path, frames: usize) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var_os("REMORA_SCAPY_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".ci/venv/bin/python"));
    let output = Command::new(&python)
        .arg(root.join("tools/scapy_icrc.py"))
        .arg(capture)
        .output();
    if !common::available(
        output.is_ok(),
        "a Python with scapy",
        "REMORA_REQUIRE_SCAPY",
    ) {
        return;
    }
    let output = output.expect("checked");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "scapy disagrees: {report} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        report.contains(&format!("\"matched\": {frames}")),
        "{report}"
    );
}

/// Through a running `remora rack switch`: each process tunnels to its
/// switch port and takes its node's address from the rack file
/// (`examples/rack-across-hosts.toml`), and the switch forwards every frame.
#[test]
fn perftest_runs_through_a_rack_switch() {
    if !installed("ib_write_lat") {
        return;
    }
    let remora = common::build_directory().join("remora");
    assert!(
        remora.exists(),
        "{} is missing: run `cargo build --workspace`",
        remora.display()
    );
    let rack =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/rack-across-hosts.toml");
    let switch = Command::new(&remora)
        .arg("rack")
        .arg("switch")
        .arg(&rack)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the switch");
    // Killed if the run panics: left running, it held the rack's UDP
    // ports and broke every later run.
    let switch = KilledOnDrop(Some(switch));
    std::thread::sleep(Duration::from_millis(500));
    let (server, client) = run_pair(
        "ib_write_lat",
        "udp 127.0.0.32:47932 127.0.0.1:47901 10.0.0.2",
        "udp 127.0.0.31:47931 127.0.0.1:47900 10.0.0.1",
        &["-n", "200"],
        &[],
    );
    // The switch prints its counters when interrupted.
    let switch = switch.take();
    let interrupted = Command::new("kill")
        .args(["-INT", &switch.id().to_string()])
        .status()
        .unwrap();
    assert!(interrupted.success());
    let report = switch.wait_with_output().unwrap();
    assert_succeeded("server", &server);
    assert_succeeded("client", &client);
    let printed = text(&report);
    let transmitted: u64 = printed
        .lines()
        .find_map(|line| line.trim().strip_prefix("\"transmitted\": "))
        .and_then(|value| value.trim_end_matches(',').parse().ok())
        .unwrap_or_else(|| panic!("no transmitted count in the switch's report:\n{printed}"));
    // 200 WRITEs each way and their ACKs, at least.
    assert!(
        transmitted >= 800,
        "the switch forwarded {transmitted} frames"
    );
}

/// `tests/c/api.c`, built against rdma-core's headers and its libibverbs,
/// run on Remora's: every supported operation between two queue pairs of
/// one process, a WRITE past a region answered with a NAK, and the errno
/// of each refused request.
#[test]
fn the_verbs_api_from_c_checks_operations_naks_and_refusals() {
    let header_found = Path::new(common::RDMA_HEADER).exists();
    if !common::available(header_found, "libibverbs-dev", "REMORA_REQUIRE_PERFTEST") {
        return;
    }
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/api.c");
    let program = std::env::temp_dir().join(format!("remora-verbs-api-{}", std::process::id()));
    let compiled = Command::new("gcc")
        .arg("-O1")
        .arg("-Wall")
        .arg("-Werror")
        .arg(&source)
        .arg("-o")
        .arg(&program)
        .arg("-libverbs")
        .arg("-pthread")
        .output()
        .expect("gcc");
    assert!(
        compiled.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let port = next_port();
    let output = Command::new("timeout")
        .arg("60")
        .arg(&program)
        .env("LD_LIBRARY_PATH", library_directory())
        .env(
            "REMORA_VERBS",
            format!("udp 127.0.0.1:{port} 127.0.0.1:{port}"),
        )
        .output()
        .unwrap();
    std::fs::remove_file(&program).ok();
    assert_succeeded("api", &output);
    assert_eq!(String::from_utf8_lossy(&output.stdout), "ok\n");
}

/// A child process killed (and reaped) when dropped, unless taken first.
struct KilledOnDrop(Option<std::process::Child>);

impl KilledOnDrop {
    fn take(mut self) -> std::process::Child {
        self.0.take().expect("taken once")
    }
}

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
