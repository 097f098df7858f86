//! `remora rack up` end to end, in every mode, and its capture checked by
//! two tools nobody here wrote: tshark decodes every frame that crossed
//! the switch as RoCEv2 with the right opcode, and scapy's RoCE layer
//! recomputes every ICRC and agrees with the wire.
//!
//! `.ci/run` installs both (tshark from Debian, scapy from PyPI into
//! `.ci/venv`) and sets `REMORA_REQUIRE_TSHARK` and `REMORA_REQUIRE_SCAPY`,
//! so there a missing tool fails the test instead of skipping it.

mod common;

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
}

/// Runs `rack up` and returns its JSON report.
fn rack_up(rack: &str, extra: &[&str], tag: &str) -> Value {
    let json = common::scratch(&format!("{tag}.json"));
    let output = Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(["rack", "up"])
        .arg(example(rack))
        .arg("--json")
        .arg(&json)
        .args(extra)
        .output()
        .expect("run remora rack up");
    assert!(
        output.status.success(),
        "rack up {extra:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("report written"))
            .expect("report is JSON");
    std::fs::remove_file(&json).ok();
    report
}

/// Every compute node ran its whole checked workload; nobody failed.
fn assert_workloads_complete(report: &Value, expected_operations: u64) {
    let nodes = report["nodes"].as_array().expect("nodes");
    for node in nodes {
        assert!(
            node["error"].is_null(),
            "{} failed: {}",
            node["name"],
            node["error"]
        );
        if node["role"] == "compute" {
            let workload = &node["workload"];
            assert_eq!(
                workload["operations"].as_u64(),
                Some(expected_operations),
                "{}",
                node["name"]
            );
            assert!(workload["checked_results"].as_u64().unwrap() > 0);
            assert!(
                workload["reads"].as_u64().unwrap() > 0 && workload["writes"].as_u64().unwrap() > 0
            );
            assert!(
                workload["sends"].as_u64().unwrap() > 0
                    && workload["atomics"].as_u64().unwrap() > 0
            );
        }
    }
    let switch = &report["switch"]["counters"];
    assert!(
        switch["transmitted"].as_u64().unwrap() >= 2 * expected_operations,
        "{switch}"
    );
}

#[test]
fn the_embedded_rack_runs_its_workload_and_its_capture_passes_tshark_and_scapy() {
    let capture = common::scratch("rack.pcap");
    let report = rack_up(
        "rack-two-nodes.toml",
        &["--capture", capture.to_str().unwrap()],
        "embedded",
    );
    assert_eq!(report["mode"], "embedded");
    assert_workloads_complete(&report, 300);
    let received = report["switch"]["counters"]["received"].as_u64().unwrap();
    check_capture_with_tshark(&capture, received);
    check_icrcs_with_scapy(&capture, received);
    std::fs::remove_file(&capture).ok();
}

/// The DPU example: shaped uplinks and a local link, with no note, since
/// its rates and delays are ones the rack keeps.
#[test]
fn the_dpu_example_runs_with_its_links_shaped_and_nothing_flagged() {
    let report = rack_up("rack-dpu.toml", &[], "dpu");
    assert_workloads_complete(&report, 300);
    assert_eq!(report["notes"], serde_json::json!([]), "{report}");
    let dpu = &report["nodes"][2];
    assert_eq!(dpu["name"], "dpu0");
    assert_eq!(dpu["role"], "offload");
}

fn check_capture_with_tshark(capture: &Path, expected_frames: u64) {
    let path = capture.to_str().unwrap();
    let Some(frames) = common::tshark_opcodes(path) else {
        return;
    };
    assert_eq!(
        frames.len() as u64,
        expected_frames,
        "the capture holds every frame the switch received"
    );
    for (number, (protocols, _)) in frames.iter().enumerate() {
        assert!(
            protocols.contains(":infiniband"),
            "frame {} is not RoCEv2: {protocols}",
            number + 1
        );
    }
    let opcodes: BTreeSet<u8> = frames.iter().map(|(_, opcode)| *opcode).collect();
    // SEND only, WRITE only, READ request and response, ACK, atomic ACK,
    // CMP_SWAP, FETCH_ADD.
    for expected in [4, 10, 12, 16, 17, 18, 19, 20] {
        assert!(
            opcodes.contains(&expected),
            "no frame with opcode {expected} in {opcodes:?}"
        );
    }
    let problems = common::tshark_problems(path);
    assert!(
        problems.trim().is_empty(),
        "frames tshark flags:\n{problems}"
    );
}

fn scapy_report(python: &Path, capture: &Path) -> (bool, Value) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/scapy_icrc.py");
    let output = Command::new(python)
        .arg(script)
        .arg(capture)
        .output()
        .expect("run scapy");
    let report = serde_json::from_slice(&output.stdout).unwrap_or_else(|_| {
        panic!(
            "scapy printed no JSON: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.success(), report)
}

fn check_icrcs_with_scapy(capture: &Path, expected_frames: u64) {
    let Some(python) = common::scapy_python() else {
        return;
    };
    let (all_match, report) = scapy_report(&python, capture);
    assert!(all_match, "scapy disagrees: {report}");
    assert_eq!(report["matched"].as_u64(), Some(expected_frames));
    // The control: one flipped payload bit must make scapy disagree, or the
    // check above proves nothing.
    let mut reader =
        pcap_file::pcap::PcapReader::new(std::fs::File::open(capture).unwrap()).unwrap();
    let corrupted = common::scratch("corrupted.pcap");
    let mut writer =
        pcap_file::pcap::PcapWriter::new(std::fs::File::create(&corrupted).unwrap()).unwrap();
    let mut first = true;
    while let Some(packet) = reader.next_packet() {
        let mut packet = packet.unwrap().into_owned();
        if first {
            let mut data = packet.data.to_vec();
            let at = data.len() - 5;
            data[at] ^= 0x01;
            packet.data = data.into();
            first = false;
        }
        writer.write_packet(&packet).unwrap();
    }
    drop(writer);
    let (all_match, report) = scapy_report(&python, &corrupted);
    std::fs::remove_file(&corrupted).ok();
    assert!(!all_match, "scapy missed a flipped bit: {report}");
    assert_eq!(report["mismatched"][0]["frame"], 1);
}

#[test]
fn a_rack_of_processes_runs_over_shared_memory() {
    let report = rack_up(
        "rack-two-nodes.toml",
        &["--mode", "processes", "--carrier", "shm"],
        "shm",
    );
    assert_eq!(report["mode"], "processes");
    assert_workloads_complete(&report, 300);
}

#[test]
fn a_rack_of_processes_runs_over_the_udp_tunnel_with_a_lossy_link() {
    let report = rack_up(
        "rack-four-nodes-lossy.toml",
        &["--mode", "processes", "--carrier", "udp"],
        "udp",
    );
    assert_eq!(report["carrier"], "UDP tunnel");
    // Two memory nodes per compute node.
    assert_workloads_complete(&report, 400);
}

#[test]
fn a_rack_in_network_namespaces_runs_over_af_packet() {
    let root = running_as_root();
    if !root {
        assert!(
            std::env::var_os("REMORA_REQUIRE_NETNS").is_none(),
            "REMORA_REQUIRE_NETNS is set, but the tests do not run as root"
        );
        eprintln!("SKIPPED: netns mode needs root (the refusal is checked instead)");
        let output = Command::new(env!("CARGO_BIN_EXE_remora"))
            .args(["rack", "up"])
            .arg(example("rack-two-nodes.toml"))
            .args(["--mode", "netns"])
            .output()
            .unwrap();
        assert!(!output.status.success());
        assert!(String::from_utf8_lossy(&output.stderr).contains("needs root"));
        return;
    }
    let report = rack_up("rack-two-nodes.toml", &["--mode", "netns"], "netns");
    assert_eq!(report["carrier"], "AF_PACKET over veth");
    assert_workloads_complete(&report, 300);
    // The rack's namespaces are named remora<pid>n<node>; none may remain.
    let leftovers = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let listing = String::from_utf8_lossy(&leftovers.stdout);
    let left: Vec<&str> = listing
        .lines()
        .filter(|line| {
            line.starts_with("remora") && line[6..].starts_with(|c: char| c.is_ascii_digit())
        })
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|output| String::from_utf8_lossy(&output.stdout).trim() == "0")
}

/// `remora rack up FILE ARGUMENTS...` where FILE holds `text`: its exit
/// code and what it said on stderr.
fn rack_up_with(text: &str, arguments: &[&str]) -> (Option<i32>, String) {
    let path = common::scratch("bad.toml");
    std::fs::write(&path, text).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(["rack", "up"])
        .arg(&path)
        .args(arguments)
        .output()
        .unwrap();
    std::fs::remove_file(&path).ok();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.code(), stderr)
}

#[test]
fn bad_rack_files_fail_with_a_clear_message() {
    let (code, stderr) = rack_up_with("[rack]\nname = \"x\"\n[switch]\n[[node]]\nname = \"a\"\nrole = \"compute\"\naddress = \"10.0.0.300\"\nmemory = \"1MiB\"\n", &[]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("not an IPv4 address"), "{stderr}");

    // A system section no system claims (a typo) is refused by name.
    let cowbird = std::fs::read_to_string(example("rack-cowbird.toml")).unwrap();
    let (code, stderr) = rack_up_with(&cowbird.replace("[cowbird]", "[cowbrid]"), &[]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("[cowbrid] names no system"), "{stderr}");

    // A system's own section is checked by the system, which names the
    // field it refuses.
    let clover = std::fs::read_to_string(example("rack-clover.toml")).unwrap();
    let (code, stderr) = rack_up_with(
        &clover.replace("zipf_theta = 0.99", "zipf_theta = 1.5"),
        &[],
    );
    assert_eq!(code, Some(2));
    assert!(stderr.contains("[clover] zipf_theta is 1.5"), "{stderr}");

    // A capture into a directory that does not exist names the path.
    let two_nodes = std::fs::read_to_string(example("rack-two-nodes.toml")).unwrap();
    let missing = "/nonexistent-remora-directory/rack.pcap";
    let (code, stderr) = rack_up_with(&two_nodes, &["--capture", missing]);
    assert_ne!(code, Some(0));
    assert!(stderr.contains(missing), "{stderr}");
}

#[test]
fn a_rack_across_hosts_runs_from_separate_switch_and_node_commands() {
    let rack = example("rack-across-hosts.toml");
    let run_dir = common::scratch("across");
    std::fs::create_dir_all(&run_dir).unwrap();
    let remora = env!("CARGO_BIN_EXE_remora");
    let mut switch = Command::new(remora)
        .args(["rack", "switch"])
        .arg(&rack)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let node = |name: &str| {
        let mut command = Command::new(remora);
        command
            .arg("node")
            .arg(&rack)
            .args(["--name", name, "--udp", "--run-dir"])
            .arg(&run_dir);
        command
    };
    let mut memory = node("memory0").spawn().unwrap();
    let report = run_dir.join("compute0.json");
    let compute = node("compute0")
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    for child in [&memory, &switch] {
        Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
    }
    let memory_status = memory.wait().unwrap();
    let switch_status = switch.wait().unwrap();
    assert!(
        compute.status.success(),
        "compute0 failed: {}",
        String::from_utf8_lossy(&compute.stderr)
    );
    assert!(memory_status.success() && switch_status.success(), "Ctrl-C must stop the memory node ({memory_status}) and the switch ({switch_status}) cleanly");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(report["workload"]["operations"].as_u64(), Some(200));
    assert!(report["workload"]["checked_results"].as_u64().unwrap() > 0);
    std::fs::remove_dir_all(&run_dir).ok();
}

#[test]
fn a_node_that_dies_is_reported_and_the_rack_stops_instead_of_waiting() {
    // memory0's control address cannot be bound, so its process dies at
    // once; the launcher must notice, stop compute0 and say who failed.
    let rack = std::fs::read_to_string(example("rack-two-nodes.toml"))
        .unwrap()
        .replace(
            "address = \"10.0.0.2\"",
            "address = \"10.0.0.2\"\ncontrol = \"192.0.2.1:9\"",
        );
    let path = common::scratch("dying.toml");
    std::fs::write(&path, rack).unwrap();
    let started = std::time::Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(["rack", "up"])
        .arg(&path)
        .args(["--mode", "processes"])
        .output()
        .unwrap();
    std::fs::remove_file(&path).ok();
    assert!(!output.status.success());
    assert!(
        started.elapsed() < std::time::Duration::from_secs(4),
        "the launcher waited {:?}",
        started.elapsed()
    );
    // The reason reaches the launcher's report: it said only that memory0
    // "exited without a report".
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("failed: memory0: control channel: listen on tcp:192.0.2.1:9"),
        "{stderr}"
    );
}

/// With no compute node, the launcher stopped the memory nodes at once,
/// while they were still starting: each died of the SIGTERM before its
/// interrupt handler was in place, and the rack failed with "exited
/// (signal: 15) without a report". It now waits for each to serve.
#[test]
fn a_rack_of_processes_with_no_compute_node_comes_up_and_stops_cleanly() {
    let rack = "[rack]\nname = \"no-compute\"\n[switch]\nprogram = \"l2l3\"\n\
        [[node]]\nname = \"memory0\"\nrole = \"memory\"\naddress = \"10.0.0.2\"\nmemory = \"1MiB\"\n\
        [[node]]\nname = \"memory1\"\nrole = \"memory\"\naddress = \"10.0.0.3\"\nmemory = \"1MiB\"\n";
    let (code, stderr) = rack_up_with(rack, &["--mode", "processes"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("without a report"), "{stderr}");
}

/// Runs `remora bench NAME --quick --json`, checks that every ratio in
/// `ratios` is a positive finite number, and returns the variants measured.
fn quick_bench_variants(name: &str, ratios: &[&str]) -> Vec<String> {
    variants_of(&quick_bench(name, ratios))
}

/// The variants a report measured.
fn variants_of(report: &Value) -> Vec<String> {
    report["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|result| result["variant"].as_str().unwrap().to_string())
        .collect()
}

/// Runs `remora bench NAME --quick --json`, checks that every ratio in
/// `ratios` is a positive finite number, and returns the report.
fn quick_bench(name: &str, ratios: &[&str]) -> Value {
    let json = common::scratch(&format!("bench-{name}.json"));
    let results = common::scratch(&format!("results-{name}"));
    let output = Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(["bench", name, "--quick", "--json"])
        .arg(&json)
        .env("REMORA_RESULTS", &results)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).ok();
    assert_eq!(report["bench"], name);
    assert_eq!(
        saved_runs(&results),
        std::slice::from_ref(&report),
        "the run is saved once"
    );
    std::fs::remove_dir_all(&results).ok();
    for key in ratios {
        let value = report["ratios"][key]
            .as_f64()
            .unwrap_or_else(|| panic!("ratio {key} missing"));
        assert!(value.is_finite() && value > 0.0, "{key} = {value}");
    }
    report
}

/// The runs saved in a results directory.
fn saved_runs(directory: &std::path::Path) -> Vec<Value> {
    std::fs::read_dir(directory)
        .unwrap()
        .map(|entry| {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            serde_json::from_str(&text).unwrap()
        })
        .collect()
}

/// The benchmark's figures are not checked here (targets live in the
/// benchmark, not in tests); its JSON shape is.
#[test]
fn bench_switch_quick_writes_the_ratios_as_json() {
    let variants = quick_bench_variants(
        "switch",
        &[
            "forward_vs_ring",
            "udp_read_p50_vs_udp_pingpong",
            "shm_read_p50_vs_udp_read_p50",
            "forward_mfps",
        ],
    );
    for carrier in ["inproc", "shm", "udp"] {
        for size in ["64B", "4KiB"] {
            assert!(
                variants.contains(&format!("read_{carrier}_{size}")),
                "no READ over {carrier} at {size}"
            );
        }
    }
}

/// The fabric benchmark's ratios, its scaling and size-sweep figures and
/// its baselines' absolute figures are in the JSON.
#[test]
fn bench_fabric_quick_writes_scaling_sweep_and_baselines() {
    let report = quick_bench(
        "fabric",
        &[
            "read64_vs_memcpy1k",
            "write64k_vs_memcpy_bw",
            "qp_scaling_1024_vs_1",
            "idle_qps_1023_vs_none",
        ],
    );
    for baseline in ["memcpy_1kib_ns", "memcpy_64kib_ns"] {
        let value = report["baselines"][baseline].as_f64().unwrap();
        assert!(value.is_finite() && value > 0.0, "{baseline} = {value}");
    }
    let variants = variants_of(&report);
    for queue_pairs in [1, 16, 256, 1024] {
        let name = format!("read 64B over {queue_pairs} queue pairs");
        assert!(variants.contains(&name), "no {name}");
    }
    for size in ["64B", "1024KiB"] {
        assert!(variants.contains(&format!("write {size} sweep")));
    }
    assert!(variants.contains(&"queue pair".to_string()));
    assert!(variants.contains(&"read 64B beside 1023 idle queue pairs".to_string()));
}

/// A rack file of `computes` compute nodes, each with a workload of 100
/// operations, and one memory node of `memory`; `rack_settings` are more
/// lines of its `[rack]` table.
fn compute_nodes_rack(name: &str, rack_settings: &str, computes: u32, memory: &str) -> String {
    let mut rack =
        format!("[rack]\nname = \"{name}\"\n{rack_settings}[switch]\nprogram = \"l2l3\"\n");
    for index in 1..=computes {
        rack += &format!("[[node]]\nname = \"c{index}\"\nrole = \"compute\"\naddress = \"10.0.0.{index}\"\nmemory = \"1MiB\"\n[node.workload]\noperations = 100\n");
    }
    rack + &format!(
        "[[node]]\nname = \"m\"\nrole = \"memory\"\naddress = \"10.0.0.9\"\nmemory = \"{memory}\"\n"
    )
}

/// Runs `rack up --json` on the rack file `text`, which must succeed;
/// returns what it printed and its JSON report.
fn rack_up_text(text: &str, tag: &str) -> (String, Value) {
    let path = common::scratch(&format!("{tag}.toml"));
    std::fs::write(&path, text).unwrap();
    let json = common::scratch(&format!("{tag}.json"));
    let output = Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(["rack", "up"])
        .arg(&path)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    std::fs::remove_file(&path).ok();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).ok();
    (stdout, report)
}

/// `[rack] fabric_threads` spreads the embedded rack over that many
/// threads (here more than this machine's cores), every workload still
/// checked, and the report says how many ran.
#[test]
fn a_rack_file_spreads_the_embedded_rack_over_its_fabric_threads() {
    let rack = compute_nodes_rack("spread", "fabric_threads = 3\n", 2, "4MiB");
    let (stdout, report) = rack_up_text(&rack, "spread");
    assert!(stdout.contains("3 fabric threads"), "{stdout}");
    assert_eq!(report["fabric_threads"], 3);
    assert_workloads_complete(&report, 100);
}

/// Three compute nodes split a memory region into shares that must stay
/// 8-byte aligned for their atomics (16 MiB / 3 is not).
#[test]
fn three_compute_nodes_share_a_memory_node_with_aligned_atomics() {
    let rack = compute_nodes_rack("three", "", 3, "16MiB");
    let (_, report) = rack_up_text(&rack, "three");
    assert_workloads_complete(&report, 100);
}

#[test]
fn bench_clover_quick_writes_the_ratios_and_the_sweeps_as_json() {
    let variants = quick_bench_variants(
        "clover",
        &[
            "resolver_speedup_ycsba_z075_c64",
            "top8_speedup_ycsba_z075_c64",
            "resolver_p99_ratio_ycsba_z075_c64",
            "embedded_resolver_speedup_ycsba_z075_c64",
            "resolver_speedup_ycsba_z075_c64_cx5",
            "top8_speedup_ycsba_z075_c64_cx5",
            "cx5_profile_max_error",
        ],
    );
    for variant in [
        "ycsba_z075_c1_plain",
        "ycsba_z075_c64_plain_cx5",
        "ycsba_z075_c64_top8_cx5",
        "cx5_validation/same_address_atomic_rate_mops",
        "ycsba_z075_c64_resolver",
        "ycsba_z075_c64_top0",
        "ycsba_z075_c64_top8",
        "ycsbc_z075_c64_plain",
        "ycsba_uniform_c64_resolver",
        "embedded_ycsba_z075_c64_plain",
        "embedded_ycsba_z075_c64_resolver",
    ] {
        assert!(variants.iter().any(|name| name == variant), "no {variant}");
    }
}

#[test]
fn bench_cowbird_quick_writes_every_variant_and_the_ratios_as_json() {
    let variants = quick_bench_variants(
        "cowbird",
        &[
            "spot_vs_local_compute_bound",
            "spot_vs_async_probe",
            "app_cpu_per_op_spot_vs_async",
            "p4_vs_local_compute_bound",
            "p4_vs_spot_probe",
            "simulated_p4_vs_spot_ideal",
            "simulated_p4_vs_spot_cx5",
        ],
    );
    for case in ["probe", "compute_bound"] {
        for variant in ["local", "sync", "async", "rpc", "spot", "spot_sync", "p4"] {
            let name = format!("{case}_{variant}");
            assert!(variants.contains(&name), "no {name}");
        }
    }
    for variant in ["simulated_spot_ideal", "simulated_p4_cx5"] {
        assert!(variants.iter().any(|name| name == variant), "no {variant}");
    }
}

#[test]
fn a_rack_file_with_a_cowbird_section_runs_cowbird_through_its_engine() {
    let report = rack_up("rack-cowbird.toml", &[], "rack-cowbird");
    assert_workloads_complete(&report["rack"], 100);
    let cowbird = &report["cowbird"];
    assert_eq!(cowbird["engine"], "P4", "{cowbird}");
    assert_eq!(cowbird["completed"], 1200, "{cowbird}");
    assert!(cowbird["reads_checked"].as_u64().unwrap() > 0, "{cowbird}");
}

#[test]
fn bench_cowbird_refuses_bad_settings_clearly() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_remora"))
            .args(["bench", "cowbird", "--quick"])
            .args(args)
            .output()
            .unwrap()
    };
    let output = run(&["--threads", "0"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--threads"));
    let plain = example("rack-two-nodes.toml");
    let output = run(&["--config", plain.to_str().unwrap()]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("has no [cowbird] section"), "{stderr}");
}

#[test]
fn a_rack_file_with_a_clover_section_runs_clover_with_the_resolver() {
    let report = rack_up("rack-clover.toml", &[], "rack-clover");
    assert_workloads_complete(&report["rack"], 100);
    let clover = &report["clover"];
    assert_eq!(clover["resolver"], true, "{clover}");
    assert_eq!(clover["operations"], 4000, "{clover}");
    assert_eq!(
        clover["not_linearizable_keys"],
        serde_json::json!([]),
        "{clover}"
    );
}

/// The `[soda]` section runs BFS through the DPU beside the compute node,
/// over its local link, and checks every vertex against local memory; a
/// section asking for a DPU on a rack without one is refused by name.
#[test]
fn a_rack_file_with_a_soda_section_runs_bfs_through_the_dpu_and_checks_it() {
    let report = rack_up("rack-soda.toml", &[], "rack-soda");
    assert_workloads_complete(&report["rack"], 100);
    let soda = &report["soda"];
    assert_eq!(soda["backend"], "dpu-static", "{soda}");
    assert_eq!(soda["checked_against_local"], true, "{soda}");
    assert!(
        soda["far_memory"]["missing_faults"].as_u64().unwrap() > 0,
        "{soda}"
    );
    let without_dpu = std::fs::read_to_string(example("rack-soda.toml"))
        .unwrap()
        .replace("role = \"offload\"", "role = \"memory\"")
        .replace("attached_to = \"compute0\"\n", "")
        .replace("[node.local_link]", "[node.link]");
    let (code, stderr) = rack_up_with(&without_dpu, &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("[soda] backend dpu-static needs an offload node"),
        "{stderr}"
    );
}

/// The `[tiga]` section calls every record of the three applications
/// through the memory node's SmartNIC and CPU-only, each checked against
/// the compute node's version, every forwarded request acknowledged.
#[test]
fn a_rack_file_with_a_tiga_section_runs_every_app_through_the_smartnic() {
    let report = rack_up("rack-tiga.toml", &[], "rack-tiga");
    assert_workloads_complete(&report["rack"], 100);
    let tiga = &report["tiga"];
    let runs = tiga["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 6, "{tiga}");
    for run in runs {
        assert_eq!(run["matched"], 32, "{run}");
    }
    let forwarded = tiga["forwarded"].as_u64().unwrap();
    assert!(forwarded > 0, "{tiga}");
    assert_eq!(tiga["acknowledged"].as_u64(), Some(forwarded), "{tiga}");
}

/// The `[bifrost]` section runs the array services on the rack's own
/// hosts through the Gatekeeper, every answer right; a rack with one
/// compute node is refused by name.
#[test]
fn a_rack_file_with_a_bifrost_section_runs_the_array_services_through_the_gatekeeper() {
    let report = rack_up("rack-bifrost.toml", &[], "rack-bifrost");
    for node in report["rack"]["nodes"].as_array().expect("nodes") {
        assert!(node["error"].is_null(), "{node}");
    }
    let bifrost = &report["bifrost"];
    let runs = bifrost["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "{bifrost}");
    for run in runs {
        assert_eq!(run["matched"], 50, "{run}");
    }
    let gatekeeper = &bifrost["gatekeeper"];
    // Every call routed once; a caller whose 20 ms timer fired on a
    // loaded machine resends, and the resend is routed too (to the same
    // callee, which answers it from its replies).
    let routed = gatekeeper["calls_routed"].as_u64().unwrap();
    let resends = gatekeeper["resends_routed"].as_u64().unwrap();
    assert_eq!(routed - resends, 100, "{bifrost}");
    assert!(
        gatekeeper["reads_allowed"].as_u64().unwrap() > 0,
        "{bifrost}"
    );
    let one_compute_node = std::fs::read_to_string(example("rack-bifrost.toml"))
        .unwrap()
        .replacen(
            "role = \"compute\"\naddress = \"10.0.0.2\"",
            "role = \"memory\"\naddress = \"10.0.0.2\"",
            1,
        );
    let (code, stderr) = rack_up_with(&one_compute_node, &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("[bifrost] needs two compute nodes"),
        "{stderr}"
    );
}

/// The children of a process, from /proc.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    // After the command's parenthesised name: state, ppid.
                    let rest = &stat[stat.rfind(')')? + 2..];
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

/// The launcher's node processes once `count` have started (or after
/// 20 s, however many there are).
fn node_processes(launcher: &std::process::Child, count: usize) -> Vec<u32> {
    let started = std::time::Instant::now();
    loop {
        let nodes = children_of(launcher.id());
        if nodes.len() >= count || started.elapsed() > std::time::Duration::from_secs(20) {
            return nodes;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Starts `remora rack up` (with `arguments`) in the background, on a
/// copy of the example `example_name` written to the scratch file
/// `scratch_name`, with its workload made long enough to outlast the test
/// by the `(finite, long)` replacement. Returns the launcher and the copy.
fn spawn_long_rack_up(
    example_name: &str,
    (finite, long): (&str, &str),
    scratch_name: &str,
    arguments: &[&str],
) -> (std::process::Child, PathBuf) {
    let rack = std::fs::read_to_string(example(example_name))
        .unwrap()
        .replace(finite, long);
    let path = common::scratch(scratch_name);
    std::fs::write(&path, rack).unwrap();
    let launcher = Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(["rack", "up"])
        .arg(&path)
        .args(arguments)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    (launcher, path)
}

/// A launcher killed outright (SIGKILL, the OOM killer) left its node
/// processes running for ever, their memory registered. They end with it.
#[test]
fn the_nodes_of_a_killed_launcher_end_with_it() {
    let (mut launcher, path) = spawn_long_rack_up(
        "rack-two-nodes.toml",
        ("operations = 300", "operations = 100000000"),
        "orphans.toml",
        &["--mode", "processes"],
    );
    let nodes = node_processes(&launcher, 2);
    assert_eq!(nodes.len(), 2, "two node processes started");
    let run_directory = std::env::temp_dir().join(format!("remora-two-nodes-{}", launcher.id()));
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let alive = |pid: &u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| !stat.contains(") Z "))
    };
    while nodes.iter().any(alive) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let left: Vec<u32> = nodes.iter().copied().filter(alive).collect();
    for pid in &left {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    std::fs::remove_file(&path).ok();
    // The killed launcher could not remove its run directory.
    std::fs::remove_dir_all(&run_directory).ok();
    assert!(left.is_empty(), "nodes {left:?} outlived their launcher");
}

/// Ctrl-C only raised the rack's stop flag: a `rack up` past its rack went
/// on to run its systems' sections (Cowbird's for up to two minutes), and
/// no further Ctrl-C ended it. The sections still to come do not start,
/// and the report so far reaches `--json` (it exited 130 before it).
#[test]
fn an_interrupted_rack_up_runs_no_further_section_and_writes_its_report() {
    let json = common::scratch("interrupted.json");
    std::fs::remove_file(&json).ok();
    // The rack's own workload long enough to be interrupted.
    let (mut launcher, path) = spawn_long_rack_up(
        "rack-cowbird.toml",
        ("operations = 100\n", "operations = 100000000\n"),
        "interrupted.toml",
        &["--json", json.to_str().unwrap()],
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let status = common::interrupt_and_wait(&mut launcher, "rack up");
    std::fs::remove_file(&path).ok();
    assert_eq!(status.code(), Some(130), "{status:?}");
    let report = std::fs::read_to_string(&json).expect("the report so far");
    std::fs::remove_file(&json).ok();
    assert!(report.contains("\"rack\""), "{report}");
}

/// In processes (and netns) mode an interrupt threw away the reports the
/// nodes had just written: `rack up` said "error: interrupted", exited 2
/// and wrote no `--json`. It reports what the nodes did, and exits 130.
#[test]
fn an_interrupted_rack_up_of_processes_writes_its_report() {
    let json = common::scratch("interrupted-processes.json");
    std::fs::remove_file(&json).ok();
    let (mut launcher, path) = spawn_long_rack_up(
        "rack-two-nodes.toml",
        ("operations = 300", "operations = 100000000"),
        "interrupted-processes.toml",
        &["--mode", "processes", "--json", json.to_str().unwrap()],
    );
    node_processes(&launcher, 2);
    // Past the nodes' start, into the workload.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let status = common::interrupt_and_wait(&mut launcher, "rack up");
    std::fs::remove_file(&path).ok();
    assert_eq!(status.code(), Some(130), "{status:?}");
    let report = std::fs::read_to_string(&json).expect("the report of the interrupted rack");
    std::fs::remove_file(&json).ok();
    assert!(report.contains("\"mode\": \"processes\""), "{report}");
    assert!(report.contains("interrupted"), "{report}");
}

/// A second Ctrl-C ends `rack up` at once, without destructors: in netns
/// mode the rack's namespaces (each keeping its veth pair) outlived it.
#[test]
fn a_second_ctrl_c_in_netns_mode_leaves_no_namespaces() {
    if !running_as_root() {
        eprintln!("SKIPPED: netns mode needs root");
        return;
    }
    let (mut launcher, path) = spawn_long_rack_up(
        "rack-two-nodes.toml",
        ("operations = 300", "operations = 100000000"),
        "netns-twice.toml",
        &["--mode", "netns"],
    );
    node_processes(&launcher, 2);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let interrupt = || {
        let sent = Command::new("kill")
            .args(["-INT", &launcher.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    };
    // The second comes while the first's stop is under way (the nodes
    // asked to stop, the namespaces not yet removed).
    interrupt();
    std::thread::sleep(std::time::Duration::from_millis(5));
    interrupt();
    let status = common::interrupt_and_wait(&mut launcher, "rack up after two Ctrl-C");
    std::fs::remove_file(&path).ok();
    assert_eq!(status.code(), Some(130), "{status:?}");
    let prefix = format!("remora{}n", launcher.id() % 100_000);
    let listing = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left: Vec<String> = String::from_utf8_lossy(&listing.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(&prefix))
        .map(str::to_string)
        .collect();
    for name in &left {
        let _ = Command::new("ip").args(["netns", "del", name]).status();
    }
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

/// Node processes read the rack file again when they started: an edit
/// after the launcher read it (or a file gone) gave nodes another rack
/// than the launcher's, or none. They run the rack the launcher parsed,
/// whatever is on disk: here there is no file at all.
#[test]
fn node_processes_run_the_launchers_rack_not_the_file_on_disk() {
    use remora_rack::launch::{rack_up, CarrierKind, LaunchOptions, Mode};
    let text = std::fs::read_to_string(example("rack-two-nodes.toml"))
        .unwrap()
        .replace("operations = 300", "operations = 200")
        .replace("name = \"two-nodes\"", "name = \"launchers-rack\"");
    let rack = remora_rack::RackConfig::parse(&text).unwrap();
    let options = LaunchOptions {
        mode: Mode::Processes,
        carrier: CarrierKind::Shm,
        capture: None,
        executable: env!("CARGO_BIN_EXE_remora").into(),
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let report = rack_up(&rack, &options, stop).unwrap();
    let report = serde_json::to_value(&report).unwrap();
    assert_workloads_complete(&report, 200);
}
