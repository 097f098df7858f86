//! The `remora` binary as a user runs it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Runs `remora`; benchmark runs are saved in a scratch results
/// directory, not the user's.
fn remora(arguments: &[&str]) -> std::process::Output {
    let results = std::env::temp_dir().join(format!("remora-test-results-{}", std::process::id()));
    Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(arguments)
        .env("REMORA_RESULTS", results)
        .output()
        .expect("run remora")
}

/// The variants a benchmark's JSON report has results for.
fn result_variants(report: &serde_json::Value) -> Vec<&str> {
    report["results"]
        .as_array()
        .expect("the results")
        .iter()
        .filter_map(|result| result["variant"].as_str())
        .collect()
}

#[test]
fn the_demo_checks_every_operation() {
    let report = std::env::temp_dir().join(format!("remora-demo-report-{}", std::process::id()));
    let output = remora(&["demo", "--report", report.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    // The report holds the tour's checks and every system's step.
    let page = std::fs::read_to_string(report.join("index.html")).unwrap();
    std::fs::remove_dir_all(&report).ok();
    assert!(page.contains("Every check passed."), "{page}");
    assert!(page.contains("id=\"demo-tour\""));
    for system in ["clover", "cowbird", "soda", "bifrost", "tiga", "kv"] {
        assert!(
            page.contains(&format!("id=\"demo-{system}\"")),
            "no {system} step"
        );
    }
    assert!(page.contains("<svg"), "the tour's plot");
    for operation in [
        "SEND",
        "RDMA WRITE",
        "RDMA READ",
        "CMP_SWAP",
        "FETCH_ADD",
        "read-only",
    ] {
        assert!(stdout.contains(operation), "the tour shows {operation}");
    }
    assert!(stdout.contains("all 9 operations checked"));
    assert!(
        stdout.contains("Clover, Cowbird, SODA, Bifröst, TIGA and the far-memory KV store passed"),
        "{stdout}"
    );
    // TIGA's NDP path on the rack, every result equal to the CN version's.
    assert!(
        stdout.contains("64 of 64 MVS queries match the CN version"),
        "{stdout}"
    );
    assert!(
        stdout.contains("written and read back on 3 of 3 nodes"),
        "{stdout}"
    );
    assert!(stdout.contains("300 calls ran exactly once"), "{stdout}");
    assert!(
        stdout.contains("2000 calls, each took effect once"),
        "{stdout}"
    );
    // SODA's BFS on far memory, once per far-memory backend.
    assert_eq!(
        stdout.matches("depths equal to local memory: yes").count(),
        4,
        "{stdout}"
    );
    assert!(stdout.contains("remote records fetched and checked"));
    // Cowbird's crash scenario, once per execution mode.
    assert_eq!(
        stdout
            .matches(
                "1200 requests completed once, pool equal to the models: yes (engine restarted 1"
            )
            .count(),
        2,
        "{stdout}"
    );
    assert!(!stdout.contains("FAILED"));
}

#[test]
fn a_campaign_writes_its_report_as_json() {
    let path = std::env::temp_dir().join(format!("remora-campaign-{}.json", std::process::id()));
    let output = remora(&[
        "sim",
        "fabric",
        "--seeds",
        "5",
        "--loss",
        "0.1",
        "--json",
        path.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let text = std::fs::read_to_string(&path).expect("the JSON report");
    std::fs::remove_file(&path).ok();
    assert!(text.contains("\"seeds\": 5"));
    assert!(text.contains("\"loss\": 0.1"));
    assert!(text.contains("\"failures\": []"));
}

/// `sim kv`: the compute host crashes under the store, and every seed's
/// recovery holds; the report says what was checked.
#[test]
fn the_kv_crash_campaign_passes_and_writes_its_report() {
    let path = std::env::temp_dir().join(format!("remora-kv-sim-{}.json", std::process::id()));
    let output = remora(&[
        "sim",
        "kv",
        "--seeds",
        "12",
        "--loss",
        "0.02",
        "--json",
        path.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains("seeds passed                12 of 12"),
        "{stdout}"
    );
    let text = std::fs::read_to_string(&path).expect("the JSON report");
    std::fs::remove_file(&path).ok();
    let report: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(report["passed"], 12);
    assert_eq!(report["keys_checked"], 12 * 64);
    assert!(report["violations"].as_array().unwrap().is_empty());
}

#[test]
fn bad_input_gets_a_clear_error() {
    let output = remora(&["sim", "fabric", "--seeds", "1", "--loss", "2"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("'--loss <LOSS>': probability 2 is outside [0, 1]"),
        "{stderr}"
    );

    // A campaign of no seeds would check nothing and pass.
    let output = remora(&["sim", "fabric", "--seeds", "0"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("'--seeds <SEEDS>'"), "{stderr}");

    let output = remora(&["kv", "serve", "--compact-below-room", "1.5"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("not a share of the log's capacity"),
        "{stderr}"
    );

    let output = remora(&["sim", "fabric", "--config", "/nonexistent/remora.toml"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("cannot read /nonexistent/remora.toml")
    );
}

#[test]
fn the_demo_writes_its_checked_histories_as_json_lines() {
    let path = std::env::temp_dir().join(format!("remora-history-{}.jsonl", std::process::id()));
    let output = remora(&["demo", "--history", path.to_str().unwrap()]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(&path).expect("the history file");
    std::fs::remove_file(&path).ok();
    let mut written = std::collections::BTreeSet::new();
    let mut reads = Vec::new();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect();
    // Clover's step checks two histories of 400 requests each.
    assert_eq!(lines.len(), 800);
    for line in &lines {
        let history = line["history"].as_str().expect("a history name");
        let key = line["key"].as_u64().expect("a key");
        let call = line["call"].as_u64().expect("a call time");
        assert!(line["client"].is_u64());
        if let Some(ret) = line.get("ret") {
            assert!(ret.as_u64().expect("a return time") >= call, "{line}");
        }
        match line["op"].as_str() {
            Some("write") => {
                written.insert((history, key, line["value"].as_u64().expect("a value")));
            }
            Some("read") => reads.push((history, key, line["output"].as_u64())),
            other => panic!("op {other:?}"),
        }
    }
    // Every read saw the loaded version (id 0) or a value written to its
    // key in its own history.
    for (history, key, output) in reads {
        if let Some(id) = output.filter(|id| *id != 0) {
            assert!(
                written.contains(&(history, key, id)),
                "{history} key {key} read {id}"
            );
        }
    }
}

#[test]
fn remora_log_follows_a_replayed_seed_through_its_crash() {
    let output = Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(["sim", "fabric", "--seed", "1", "--crash", "1"])
        .env("REMORA_LOG", "info")
        .output()
        .unwrap();
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("host crashed"), "{stderr}");
    assert!(stderr.contains("host restarted"), "{stderr}");

    let output = Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(["sim", "fabric", "--seed", "1"])
        .env("REMORA_LOG", "loud")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("REMORA_LOG"));
}

/// `bench soda` runs every app on every backend, checks each against
/// local memory, and writes the issue's ratios.
#[test]
fn bench_soda_writes_its_ratios() {
    let directory = std::env::temp_dir().join(format!("remora-soda-bench-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let json = directory.join("soda.json");
    let output = remora(&[
        "bench",
        "soda",
        "--quick",
        "--scale",
        "12",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    for ratio in ["dpu_opt_vs_file_geomean", "dpu_opt_vs_memserver_geomean"] {
        let value = report["ratios"][ratio].as_f64().unwrap_or(f64::NAN);
        assert!(value.is_finite() && value > 0.0, "{ratio} = {value}");
    }
    // On a graph this small the hit rate may be anything in [0, 1], and
    // the saving may even be negative: which chunks the evictor drops, and
    // so how much is fetched again, varies from run to run by more than
    // the pinned vertex data weighs.
    let hit_rate = report["ratios"]["dynamic_hit_rate_pr"]
        .as_f64()
        .unwrap_or(f64::NAN);
    assert!((0.0..=1.0).contains(&hit_rate), "hit rate {hit_rate}");
    let saving = report["ratios"]["static_cache_traffic_saving_pr"]
        .as_f64()
        .unwrap_or(f64::NAN);
    assert!(saving.is_finite() && saving <= 1.0, "saving {saving}");
    let runtimes = |prefix: bool| {
        report["results"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|result| result["metric"] == "runtime")
            .filter(|result| result["variant"].as_str().unwrap().starts_with("fig8/") == prefix)
            .count()
    };
    assert_eq!(runtimes(false), 5 * 8, "every app on every backend");
    assert_eq!(
        runtimes(true),
        5 * 2,
        "every app beside BFS, memserver and DPU"
    );
    assert!(report["ratios"]["fig8_traffic_saving_mean"]
        .as_f64()
        .unwrap()
        .is_finite());
    std::fs::remove_dir_all(&directory).unwrap();
}

/// `soda run` checks a far-memory run against local memory and writes
/// per-vertex results; bad input is a clear error.
#[test]
fn soda_run_checks_and_writes_results() {
    let directory = std::env::temp_dir().join(format!("remora-soda-run-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let graph = directory.join("graph.el");
    std::fs::write(&graph, "0 1\n1 2\n2 3\n3 0\n4 5\n").unwrap();
    let out = directory.join("depths.txt");
    let output = remora(&[
        "soda",
        "run",
        "bfs",
        graph.to_str().unwrap(),
        "--backend",
        "memserver",
        "--symmetrize",
        "--check",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains("check: memserver agrees with local memory"),
        "{stdout}"
    );
    let depths = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        depths.lines().collect::<Vec<_>>(),
        ["0 0", "1 1", "2 2", "3 1", "4 4294967295", "5 4294967295"]
    );
    std::fs::write(&graph, "0 1\n1 x\n").unwrap();
    let bad = remora(&["soda", "run", "bfs", graph.to_str().unwrap()]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("line 2"));
    std::fs::remove_dir_all(&directory).unwrap();
}

/// `bench bifrost` pings through Bifröst on the rack, Thrift over TCP and
/// raw UDP, and writes the issue's ratios and echo's.
#[test]
fn bench_bifrost_writes_its_ratios() {
    let json =
        std::env::temp_dir().join(format!("remora-bifrost-bench-{}.json", std::process::id()));
    let output = remora(&[
        "bench",
        "bifrost",
        "--quick",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    for key in [
        "ping_p50_vs_thrift_tcp",
        "gatekeeper_ping_overhead",
        "add_arrays_1mib_vs_thrift_tcp",
        "echo_64B_p50_vs_thrift_tcp",
        "echo_1KiB_p50_vs_thrift_tcp",
        "increment_array_1mib_vs_thrift_tcp",
        "gatekeeper_add_arrays_1mib_overhead",
        "gatekeeper_increment_array_1mib_overhead",
        "simulated_call_rate_cx5_vs_ideal",
    ] {
        let ratio = report["ratios"][key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing"));
        assert!(ratio.is_finite() && ratio > 0.0, "{key} = {ratio}");
    }
    // Issue 20: the simulator's figures under both NIC profiles, where a
    // ConnectX-5's costs can only slow the calls down.
    let variants = result_variants(&report);
    for variant in [
        "failover (simulator, heartbeat timeout 1 ms)",
        "failover (simulator, heartbeat timeout 1 ms, cx5 NICs)",
        "calls (simulator, 8 outstanding, ideal NICs)",
        "calls (simulator, 8 outstanding, cx5 NICs)",
    ] {
        assert!(variants.contains(&variant), "{variant} missing");
    }
    let slowed = report["ratios"]["simulated_call_rate_cx5_vs_ideal"]
        .as_f64()
        .unwrap();
    assert!(slowed < 1.0, "cx5 NICs made calls faster: {slowed}");
    // Fig. 7.8: both systems on both workloads, every stage, and the
    // stages of each adding up to a call's time.
    let breakdown = report["series"]["fig7_8_breakdown_us"]
        .as_object()
        .expect("the breakdown series");
    assert_eq!(breakdown.len(), 4, "{breakdown:?}");
    for (label, stages) in breakdown {
        let stages = stages.as_object().expect("stages");
        assert_eq!(stages.len(), 7, "{label}: {stages:?}");
        let total: f64 = stages.values().filter_map(|value| value.as_f64()).sum();
        assert!(total > 0.0 && total.is_finite(), "{label}: {stages:?}");
    }
    std::fs::remove_file(&json).unwrap();
}

/// `bench kv` runs YCSB on every device, the in-memory comparison with
/// FASTER and redis-benchmark against both servers, and writes the
/// issue's ratios (their values are the benchmark's business).
#[test]
fn bench_kv_writes_its_ratios() {
    let directory = std::env::temp_dir().join(format!("remora-kv-bench-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let json = directory.join("kv.json");
    let output = remora(&[
        "bench",
        "kv",
        "--quick",
        "--records",
        "20000",
        "--keyspace",
        "20000",
        "--seconds",
        "0.1",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    for ratio in [
        "cowbird_vs_local_ycsb_z099_64b",
        "cowbird_vs_file_ycsb_z099_64b",
        "cowbird_vs_async_one_sided_ycsb_z099_64b",
        "comm_ratio_cowbird",
        "resp_get_vs_redis_pipelined",
        "local_vs_faster_ycsb_b",
    ] {
        let value = report["ratios"][ratio].as_f64().unwrap_or(f64::NAN);
        assert!(value.is_finite() && value > 0.0, "{ratio} = {value}");
    }
    let variants = result_variants(&report);
    for device in [
        "memory",
        "file",
        "one-sided-sync",
        "one-sided-async",
        "cowbird-spot",
        "cowbird-p4",
    ] {
        for shape in ["64B/1t", "64B/2t", "512B/1t", "512B/2t"] {
            let variant = format!("{device}/{shape}");
            assert!(variants.contains(&variant.as_str()), "{variant} missing");
        }
    }
    std::fs::remove_dir_all(&directory).ok();
}

#[test]
fn kv_ycsb_refuses_bad_input_clearly() {
    let output = remora(&["kv", "ycsb", "--device", "tape"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("no device \"tape\""));
    let output = remora(&[
        "kv",
        "ycsb",
        "--device",
        "memory",
        "--workload",
        "e",
        "--records",
        "1000",
    ]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("range scans"));
    // Only a memory node's region outlives the process: recovering from
    // any other device always found nothing.
    let output = remora(&["kv", "ycsb", "--device", "file", "--recover"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--rack"));
    // Finite but past what a Duration holds: this panicked.
    for seconds in ["1e20", "0", "-1", "NaN"] {
        let argument = format!("--seconds={seconds}");
        let output = remora(&["kv", "ycsb", "--device", "memory", &argument]);
        // The command line's error exit, not a panic's 101.
        assert_eq!(output.status.code(), Some(2), "{seconds}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("is not a run length"),
            "{seconds}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// Inputs a review found panicking, aborting, hanging or running to the
/// end before failing: each is now one error line and exit code 2, at
/// once.
#[test]
fn inputs_that_crashed_or_ran_for_nothing_are_refused_at_once() {
    let scratch = std::env::temp_dir().join(format!("remora-bad-inputs-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let empty = scratch.join("empty.el");
    std::fs::write(&empty, "").unwrap();
    let edges = scratch.join("edges.el");
    std::fs::write(&edges, "0 1\n1 2\n").unwrap();
    let one_session = scratch.join("one-session.toml");
    std::fs::write(&one_session, "sessions = 1\n").unwrap();
    let calibration = scratch.join("calibration.json");
    std::fs::write(
        &calibration,
        r#"{"apps":[],"context_switch_ns":1.0,"detection_ns":1.0,"repetitions":0}"#,
    )
    .unwrap();
    let path = |file: &std::path::Path| file.to_str().unwrap().to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["soda", "run", "bfs", &path(&empty), "--backend", "local"]
                .into_iter()
                .map(String::from)
                .collect(),
            "no vertices",
        ),
        (
            [
                "soda",
                "run",
                "bfs",
                &path(&edges),
                "--chunk-kib",
                "18014398509481984",
            ]
            .map(String::from)
            .to_vec(),
            "--chunk-kib",
        ),
        (
            ["soda", "run", "bfs", &path(&edges), "--threads", "100000"]
                .map(String::from)
                .to_vec(),
            "--threads",
        ),
        (
            ["soda", "run", "bfs", "kron:30"].map(String::from).to_vec(),
            "edges",
        ),
        (
            ["kv", "ycsb", "--device", "memory", "--threads", "0"]
                .map(String::from)
                .to_vec(),
            "--threads",
        ),
        (
            [
                "kv",
                "ycsb",
                "--device",
                "memory",
                "--value-bytes",
                "100000000000",
            ]
            .map(String::from)
            .to_vec(),
            "--value-bytes",
        ),
        (
            ["kv", "ycsb", "--device-mib", "65536", "--records", "10"]
                .map(String::from)
                .to_vec(),
            "one registered region",
        ),
        // Checked only when written, after the whole run.
        (
            [
                "kv",
                "ycsb",
                "--device",
                "memory",
                "--history",
                "/nonexistent/h.jsonl",
            ]
            .map(String::from)
            .to_vec(),
            "its directory does not exist",
        ),
        // Checked before the run (20,000 seeds would take minutes): a
        // directory no file can be made in (root passes access(2) there)
        // failed the write after it.
        (
            [
                "sim",
                "fabric",
                "--seeds",
                "20000",
                "--json",
                "/sys/remora-x.json",
            ]
            .map(String::from)
            .to_vec(),
            "cannot write /sys/remora-x.json",
        ),
        (
            ["sim", "fabric", "--seed", "18446744073709551615"]
                .map(String::from)
                .to_vec(),
            "a campaign runs at least one seed",
        ),
        (
            [
                "sim",
                "fabric",
                "--seeds",
                "1",
                "--json",
                "/nonexistent/x.json",
            ]
            .map(String::from)
            .to_vec(),
            "its directory does not exist",
        ),
        (
            [
                "bench",
                "tiga",
                "--quick",
                "--calibration",
                &path(&calibration),
            ]
            .map(String::from)
            .to_vec(),
            "no mvs",
        ),
        (
            [
                "kv",
                "serve",
                "--workers",
                "4",
                "--config",
                &path(&one_session),
            ]
            .map(String::from)
            .to_vec(),
            "sessions are fewer",
        ),
    ];
    for (arguments, expected) in cases {
        let arguments: Vec<&str> = arguments.iter().map(String::as_str).collect();
        let started = std::time::Instant::now();
        let output = remora(&arguments);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{arguments:?}: {stderr}");
        assert!(stderr.contains(expected), "{arguments:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{arguments:?}: {stderr}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{arguments:?} took {:?}",
            started.elapsed()
        );
    }
    std::fs::remove_dir_all(&scratch).ok();
}

/// `kv ycsb --history` records a concurrent run, checks it and writes it
/// as JSON lines that name each request's key, value and times.
#[test]
fn kv_ycsb_writes_a_checked_history() {
    let directory = std::env::temp_dir().join(format!("remora-kv-history-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let history = directory.join("history.jsonl");
    let output = remora(&[
        "kv",
        "ycsb",
        "--device",
        "memory",
        "--records",
        "500",
        "--threads",
        "2",
        "--seconds",
        "0.2",
        "--history",
        history.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("linearizable"));
    let text = std::fs::read_to_string(&history).unwrap();
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    for field in ["history", "client", "op", "key", "call"] {
        assert!(first.get(field).is_some(), "{field} missing from {first}");
    }
    assert!(text.lines().count() > 1000);
    std::fs::remove_dir_all(&directory).ok();
}

/// `bench verbs` runs perftest on the drop-in beside the native API and
/// a UDP ping-pong, and writes the issue's three ratios. It needs the
/// drop-in built (`.ci/run` builds the workspace) and perftest.
#[test]
fn bench_verbs_writes_its_ratios() {
    let installed = std::process::Command::new("sh")
        .args(["-c", "command -v ib_write_lat"])
        .output()
        .is_ok_and(|output| output.status.success());
    if !installed {
        assert!(
            std::env::var_os("REMORA_REQUIRE_PERFTEST").is_none(),
            "perftest is required but not installed"
        );
        eprintln!("SKIPPED: perftest is not installed (.ci/run installs it)");
        return;
    }
    let json = std::env::temp_dir().join(format!("remora-verbs-bench-{}.json", std::process::id()));
    let output = remora(&[
        "bench",
        "verbs",
        "--quick",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    for ratio in [
        "write_lat_64_shm_vs_native",
        "write_lat_64_udp_vs_udp_pingpong",
        "write_bw_64k_shm_vs_native",
    ] {
        let value = report["ratios"][ratio].as_f64().unwrap_or(f64::NAN);
        assert!(value.is_finite() && value > 0.0, "{ratio} = {value}");
    }
    let native = report["baselines"]["native_write_bw_64k_shm_mib_per_s"]
        .as_f64()
        .unwrap_or(f64::NAN);
    assert!(native > 0.0, "native bandwidth {native}");
    std::fs::remove_file(&json).ok();
}

/// `remora report` draws named JSON files, or the latest run of each
/// benchmark in the results directory, and refuses what it cannot read
/// with the file's name.
#[test]
fn report_draws_benchmark_results_and_names_what_it_cannot_read() {
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../report/tests/fixtures");
    let scratch = std::env::temp_dir().join(format!("remora-report-{}", std::process::id()));
    let results = scratch.join("results");
    std::fs::create_dir_all(&results).unwrap();
    for (bench, run) in [("clover", 5), ("clover", 40), ("switch", 7)] {
        std::fs::copy(
            fixtures.join(format!("{bench}.json")),
            results.join(format!("{bench}-{run}.json")),
        )
        .unwrap();
    }
    let out = scratch.join("page");
    let output = Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(["report", "--out", out.to_str().unwrap()])
        .env("REMORA_RESULTS", &results)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let page = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(page.contains("clover-40.json"), "the latest clover run");
    assert!(!page.contains("clover-5.json"));
    assert!(page.contains("id=\"bench-switch\""));

    let missing = remora(&["report", "no-such-run.json", "--out", out.to_str().unwrap()]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no-such-run.json"));
    let empty = scratch.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let none = Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(["report", "--out", out.to_str().unwrap()])
        .env("REMORA_RESULTS", &empty)
        .output()
        .unwrap();
    assert_eq!(none.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&none.stderr).contains("no benchmark results here"));
    std::fs::remove_dir_all(&scratch).ok();
}

/// A results directory that cannot be made (here, under a file) was found
/// only when a run tried to save: `bench all` ran every benchmark in full
/// and then marked each failed. Both refuse it before they run anything.
#[test]
fn a_results_directory_that_cannot_be_made_is_refused_before_any_run() {
    let under_a_file =
        std::env::temp_dir().join(format!("remora-not-a-directory-{}", std::process::id()));
    std::fs::write(&under_a_file, b"a file").unwrap();
    let results = under_a_file.join("results");
    for arguments in [
        &["bench", "switch", "--quick"][..],
        &["bench", "all", "--quick"],
    ] {
        let started = std::time::Instant::now();
        let output = Command::new(env!("CARGO_BIN_EXE_remora"))
            .args(arguments)
            .env("REMORA_RESULTS", &results)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{arguments:?}: {output:?}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{arguments:?} ran before refusing"
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("results"), "{arguments:?}: {stderr}");
    }
    std::fs::remove_file(&under_a_file).unwrap();
}

/// Spawns `remora ARGUMENTS` with TMPDIR at `directory`, waits until it has
/// made a scratch entry there, interrupts it, and returns its exit code and
/// what it left in `directory`.
fn interrupt_once_scratch_appears(
    arguments: &[&str],
    directory: &Path,
) -> (Option<i32>, Vec<PathBuf>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(arguments)
        .env("TMPDIR", directory)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let entries = || -> Vec<PathBuf> {
        std::fs::read_dir(directory)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .collect()
    };
    // Generous: `soda run` builds its graph first, on a shared machine.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while entries().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{arguments:?} made no scratch entry"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "{arguments:?} ended before its interrupt"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let status = common::interrupt_and_wait(&mut child, &format!("{arguments:?}"));
    (status.code(), entries())
}

/// `kv ycsb` on the file device, `soda run` and `bench soda` left their
/// scratch directories behind when Ctrl-C ended them (none watches a stop
/// flag).
#[test]
fn an_interrupted_kv_ycsb_or_soda_run_leaves_no_scratch_behind() {
    let directory = std::env::temp_dir().join(format!("remora-interrupted-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let directory_text = directory.to_str().unwrap().to_owned();
    let ycsb = [
        "kv",
        "ycsb",
        "--device",
        "file",
        "--device-mib",
        "64",
        "--file-directory",
        &directory_text,
        "--records",
        "2000",
        "--seconds",
        "60",
    ];
    let soda = ["soda", "run", "pr", "kron:20", "--backend", "in-process"];
    // Its work directory (file store, staging files) was left behind too.
    let bench_soda = ["bench", "soda", "--quick"];
    for arguments in [&ycsb[..], &soda[..], &bench_soda[..]] {
        let (code, left) = interrupt_once_scratch_appears(arguments, &directory);
        assert_eq!(code, Some(130), "{arguments:?}");
        assert!(left.is_empty(), "{arguments:?} left {left:?}");
    }
    std::fs::remove_dir_all(&directory).ok();
}

/// An interrupted demo returned at once: --json and --report had nothing,
/// though the tour and the rack's checks had run. What ran is written,
/// marked interrupted, and the exit is 130.
#[test]
fn an_interrupted_demo_writes_what_it_ran() {
    use std::io::BufRead;
    let json = std::env::temp_dir().join(format!(
        "remora-demo-interrupted-{}.json",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&json);
    let mut child = Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(["demo", "--json", json.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(stdout).lines();
    // The rack's step: the interrupt handler is installed well before it.
    let reached = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|line| line.contains("the embedded rack"));
    assert!(reached, "the demo never reached its rack");
    let draining = std::thread::spawn(move || lines.map_while(Result::ok).count());
    let status = common::interrupt_and_wait(&mut child, "demo");
    draining.join().unwrap();
    assert_eq!(status.code(), Some(130));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON was written"))
            .unwrap();
    assert_eq!(summary["interrupted"], true);
    assert!(!summary["rows"].as_array().unwrap().is_empty());
    std::fs::remove_file(&json).unwrap();
}
