//! The RESP2 front end, driven by Debian's `redis-cli` and
//! `redis-benchmark` and by raw sockets, on a store small enough that
//! values go to the device.
//!
//! Without the Redis tools these tests fail, unless `REMORA_SKIP_REDIS`
//! is set, in which case the ones that need the tools say they skipped.

use remora_kv::resp::{serve, ServeError, ServerLimits};
use remora_kv::{MemoryDevice, Store, StoreConfig};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a tool or a socket may take before the test fails rather
/// than hangs.
const DEADLINE: Duration = Duration::from_secs(60);

/// Four 16 KiB pages in memory, as in tests/store.rs, so that a few
/// hundred records push the oldest to the device; sessions for
/// redis-benchmark's 50 clients and the tools' own connections.
fn small_config() -> StoreConfig {
    StoreConfig {
        sessions: 64,
        ..StoreConfig::smallest()
    }
}

struct TestServer {
    store: Store,
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(), ServeError>>>,
}

impl TestServer {
    fn start(max_connections: usize) -> TestServer {
        TestServer::on_device(max_connections, 64 << 20)
    }

    fn on_device(max_connections: usize, device_bytes: u64) -> TestServer {
        let limits = ServerLimits {
            max_connections,
            ..ServerLimits::default()
        };
        TestServer::with(limits, device_bytes)
    }

    fn with(limits: ServerLimits, device_bytes: u64) -> TestServer {
        let store = Store::new(small_config(), Arc::new(MemoryDevice::new(device_bytes))).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || serve(store, listener, limits, stop))
        };
        TestServer {
            store,
            port,
            stop,
            thread: Some(thread),
        }
    }

    fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream.set_read_timeout(Some(DEADLINE)).unwrap();
        stream
    }

    /// Stops the server and returns what `serve` returned.
    fn stop(mut self) -> Result<(), ServeError> {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.take().expect("stopped once");
        thread.join().expect("serve does not panic")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `true` if `tool` runs. Without it the test fails with a clear message,
/// or, with `REMORA_SKIP_REDIS` set, says it skipped and returns `false`.
fn have(tool: &str) -> bool {
    let runs = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success());
    if runs {
        return true;
    }
    if std::env::var_os("REMORA_SKIP_REDIS").is_some() {
        eprintln!("skipped: {tool} is not installed and REMORA_SKIP_REDIS is set");
        return false;
    }
    panic!(
        "{tool} is not installed or does not run: install Debian's redis-tools \
         (apt-get install redis-tools), or set REMORA_SKIP_REDIS=1 to skip these tests"
    );
}

/// Runs `program`, feeding it `input`, and fails the test if it takes
/// longer than [`DEADLINE`].
fn run(program: &str, arguments: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(program)
        .args(arguments)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("{program} does not start: {error}"));
    let mut stdin = child.stdin.take().expect("piped");
    stdin.write_all(input).unwrap();
    drop(stdin);
    let stdout = read_in_background(child.stdout.take().expect("piped"));
    let stderr = read_in_background(child.stderr.take().expect("piped"));
    let status = wait_with_deadline(&mut child, program);
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// Drains a pipe on its own thread, so that a chatty child never blocks
/// on a full pipe while the test waits for it.
fn read_in_background(mut pipe: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        pipe.read_to_end(&mut bytes).unwrap();
        bytes
    })
}

fn wait_with_deadline(child: &mut Child, program: &str) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("{program} did not finish within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `redis-cli -p PORT arguments...`: its output, without the newlines at
/// its end (redis-cli prints an error with an empty line after it).
/// Runs `redis-benchmark -q` against `server` with `arguments`: whether
/// it succeeded, its stdout and its stderr.
fn redis_benchmark(server: &TestServer, arguments: &[&str]) -> (bool, String, String) {
    let port = server.port.to_string();
    let mut all = vec!["-h", "127.0.0.1", "-p", &port, "-q"];
    all.extend_from_slice(arguments);
    let output = run("redis-benchmark", &all, b"");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn redis_cli(server: &TestServer, arguments: &[&str]) -> String {
    redis_cli_with_input(server, arguments, b"")
}

fn redis_cli_with_input(server: &TestServer, arguments: &[&str], input: &[u8]) -> String {
    let port = server.port.to_string();
    let mut all = vec!["-h", "127.0.0.1", "-p", &port];
    all.extend_from_slice(arguments);
    let output = run("redis-cli", &all, input);
    let text = String::from_utf8_lossy(&output.stdout);
    text.trim_end_matches('\n').to_string()
}

/// Reads from `stream` until the peer closes it.
fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).unwrap();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Reads until `expected` bytes have arrived.
fn read_exactly(stream: &mut TcpStream, expected: usize) -> String {
    let mut bytes = vec![0; expected];
    stream.read_exact(&mut bytes).unwrap();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[test]
fn redis_cli_sets_gets_counts_and_deletes() {
    if !have("redis-cli") {
        return;
    }
    let server = TestServer::start(8);
    assert_eq!(redis_cli(&server, &["PING"]), "PONG");
    assert_eq!(redis_cli(&server, &["SET", "k", "v"]), "OK");
    assert_eq!(redis_cli(&server, &["GET", "k"]), "v");
    assert_eq!(redis_cli(&server, &["GET", "missing"]), "");
    assert_eq!(redis_cli(&server, &["INCR", "n"]), "1");
    assert_eq!(redis_cli(&server, &["incr", "n"]), "2");
    assert_eq!(redis_cli(&server, &["DECR", "n"]), "1");
    assert_eq!(redis_cli(&server, &["INCRBY", "n", "41"]), "42");
    assert_eq!(redis_cli(&server, &["EXISTS", "k", "n", "missing"]), "2");
    assert_eq!(redis_cli(&server, &["DEL", "k", "missing"]), "1");
    assert_eq!(redis_cli(&server, &["EXISTS", "k"]), "0");
    assert_eq!(redis_cli(&server, &["MSET", "a", "1", "b", "2"]), "OK");
    assert_eq!(redis_cli(&server, &["MGET", "a", "missing", "b"]), "1\n\n2");
    assert_eq!(redis_cli(&server, &["SET", "word", "remora"]), "OK");
    assert_eq!(
        redis_cli(&server, &["INCR", "word"]),
        "ERR value is not an integer or out of range"
    );
    let info = redis_cli(&server, &["INFO"]);
    assert!(
        info.contains("# Server") && info.contains("remora-kv"),
        "{info}"
    );
    assert!(info.contains("db0:device=memory"), "{info}");
    assert!(
        info.contains("# Log") && info.contains("compactions=0,records_copied=0"),
        "{info}"
    );
    server.stop().unwrap();
}

#[test]
fn values_pushed_to_the_device_come_back_through_pending_operations() {
    if !have("redis-cli") {
        return;
    }
    let server = TestServer::start(8);
    assert_eq!(redis_cli(&server, &["SET", "counter", "10"]), "OK");
    let filler = "f".repeat(500);
    let keys: Vec<String> = (0..200).map(|number| format!("filler-{number}")).collect();
    let mut set_all = vec!["MSET"];
    for key in &keys {
        set_all.extend([key.as_str(), filler.as_str()]);
    }
    assert_eq!(redis_cli(&server, &set_all), "OK");
    let [_, head, _, _] = server.store.boundaries();
    assert!(head.value() > 0, "the first pages must have left memory");
    // INFO's counters are the serving worker's session's: with one worker,
    // every connection's operations so far, these two lookups among them.
    let answers = redis_cli_with_input(&server, &[], b"GET filler-0\nINCR counter\nINFO\n");
    let mut lines = answers.lines();
    assert_eq!(lines.next(), Some(filler.as_str()));
    assert_eq!(lines.next(), Some("11"));
    let pending = answers
        .split_once(",pending=")
        .and_then(|(_, rest)| rest.split(',').next())
        .and_then(|count| count.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("INFO reports pending operations: {answers}"));
    assert!(pending >= 2, "both lookups went to the device: {answers}");
    server.stop().unwrap();
}

/// Connections pipeline GETs of values that have left memory, at once:
/// the server's round detaches one connection's device reads while it
/// answers the others' batches (and their INCRs, which wait on the shared
/// session), yet every reply reaches its own connection, in order.
#[test]
fn concurrent_pipelines_of_device_reads_get_their_own_replies_in_order() {
    const KEYS: usize = 200;
    let server = TestServer::start(16);
    let value_of = |number: usize| format!("{number:03}-{}", "v".repeat(400));
    let mut writer = server.connect();
    let sets: String = (0..KEYS)
        .map(|number| format!("SET key-{number} {}\r\n", value_of(number)))
        .collect();
    writer.write_all(sets.as_bytes()).unwrap();
    assert_eq!(read_exactly(&mut writer, 5 * KEYS), "+OK\r\n".repeat(KEYS));
    let [_, head, _, _] = server.store.boundaries();
    assert!(head.value() > 0, "the first values must have left memory");
    let clients: Vec<_> = (0..4)
        .map(|client| {
            let mut stream = server.connect();
            std::thread::spawn(move || {
                let (mut requests, mut expected) = (String::new(), String::new());
                for round in 0..60 {
                    let number = (client * 50 + round * 7) % KEYS;
                    let value = value_of(number);
                    requests.push_str(&format!("GET key-{number}\r\nINCR count-{client}\r\n"));
                    expected.push_str(&format!(
                        "${}\r\n{value}\r\n:{}\r\n",
                        value.len(),
                        round + 1
                    ));
                }
                stream.write_all(requests.as_bytes()).unwrap();
                assert_eq!(
                    read_exactly(&mut stream, expected.len()),
                    expected,
                    "client {client}"
                );
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
    server.stop().unwrap();
}

/// A client that sends thousands of GETs of 4 KB values and reads none of
/// the 16 MB of replies fills its socket: the server stops reading it and
/// waits for it to take them, serves another client meanwhile, and hands
/// every reply over, in order, once the client reads.
#[test]
fn a_client_that_does_not_read_its_replies_holds_up_only_itself() {
    const KEYS: usize = 64;
    const GETS: usize = 4000;
    let server = TestServer::start(4);
    let value_of = |number: usize| format!("{number:02}{}", "w".repeat(3998));
    let mut writer = server.connect();
    let mut sets = Vec::new();
    for number in 0..KEYS {
        let (key, value) = (format!("big-{number}"), value_of(number));
        sets.extend_from_slice(
            format!(
                "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n{value}\r\n",
                key.len(),
                value.len()
            )
            .as_bytes(),
        );
    }
    writer.write_all(&sets).unwrap();
    assert_eq!(read_exactly(&mut writer, 5 * KEYS), "+OK\r\n".repeat(KEYS));
    let mut hoarder = server.connect();
    let requests: String = (0..GETS)
        .map(|get| format!("GET big-{}\r\n", get % KEYS))
        .collect();
    hoarder.write_all(requests.as_bytes()).unwrap();
    let mut other = server.connect();
    other.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_exactly(&mut other, 7), "+PONG\r\n");
    let reply_bytes = "$4000\r\n".len() + 4000 + "\r\n".len();
    let replies = read_exactly(&mut hoarder, GETS * reply_bytes);
    for (get, reply) in replies.as_bytes().chunks(reply_bytes).enumerate() {
        let expected = format!("$4000\r\n{}\r\n", value_of(get % KEYS));
        assert!(reply == expected.as_bytes(), "reply {get}");
    }
    server.stop().unwrap();
}

/// Three workers share the listener and the store: connections land on
/// whichever worker takes them, and each sees every other's writes.
#[test]
fn several_workers_serve_connections_that_share_one_store() {
    let limits = ServerLimits {
        max_connections: 16,
        workers: 3,
    };
    let server = TestServer::with(limits, 64 << 20);
    let mut clients: Vec<TcpStream> = (0..9).map(|_| server.connect()).collect();
    for (number, client) in clients.iter_mut().enumerate() {
        client
            .write_all(format!("SET key-{number} value-{number}\r\nINCR shared\r\n").as_bytes())
            .unwrap();
        let expected = format!("+OK\r\n:{}\r\n", number + 1);
        assert_eq!(read_exactly(client, expected.len()), expected);
    }
    for (number, client) in clients.iter_mut().rev().enumerate() {
        let other = (number + 4) % 9;
        client
            .write_all(format!("GET key-{other}\r\n").as_bytes())
            .unwrap();
        let value = format!("value-{other}");
        let expected = format!("${}\r\n{value}\r\n", value.len());
        assert_eq!(read_exactly(client, expected.len()), expected);
    }
    server.stop().unwrap();
}

/// A server with no worker, or no room for a connection, is refused.
#[test]
fn a_server_without_workers_or_connections_is_refused() {
    for limits in [
        ServerLimits {
            workers: 0,
            ..ServerLimits::default()
        },
        ServerLimits {
            max_connections: 0,
            ..ServerLimits::default()
        },
    ] {
        let store = Store::new(small_config(), Arc::new(MemoryDevice::new(1 << 20))).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        assert!(matches!(
            serve(store, listener, limits, stop),
            Err(ServeError::NoCapacity)
        ));
    }
}

#[test]
fn a_protocol_error_closes_only_its_own_connection() {
    if !have("redis-cli") {
        return;
    }
    let server = TestServer::start(8);
    let mut stream = server.connect();
    stream.write_all(b"PING\r\n*1\r\n$abc\r\n").unwrap();
    assert_eq!(
        read_until_closed(&mut stream),
        "+PONG\r\n-ERR Protocol error: invalid bulk length\r\n"
    );
    let mut stream = server.connect();
    stream.write_all(b"*2000\r\n").unwrap();
    let answer = read_until_closed(&mut stream);
    assert!(
        answer.starts_with("-ERR Protocol error: too many arguments"),
        "{answer}"
    );
    assert_eq!(redis_cli(&server, &["SET", "after", "error"]), "OK");
    assert_eq!(redis_cli(&server, &["GET", "after"]), "error");
    server.stop().unwrap();
}

#[test]
fn an_unknown_command_leaves_the_connection_usable() {
    if !have("redis-cli") {
        return;
    }
    let server = TestServer::start(8);
    let mut stream = server.connect();
    stream
        .write_all(b"*2\r\n$7\r\nNOTACMD\r\n$1\r\nx\r\n")
        .unwrap();
    let expected = "-ERR unknown command 'NOTACMD', with args beginning with: 'x' \r\n";
    assert_eq!(read_exactly(&mut stream, expected.len()), expected);
    stream
        .write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nok\r\n")
        .unwrap();
    assert_eq!(read_exactly(&mut stream, 5), "+OK\r\n");
    stream.write_all(b"GET k\r\n").unwrap();
    assert_eq!(read_exactly(&mut stream, 8), "$2\r\nok\r\n");
    // redis-cli sends lines from its input on one connection.
    let answers = redis_cli_with_input(&server, &[], b"NOTACMD\nSET a b\nGET a\n");
    let lines: Vec<&str> = answers.lines().filter(|line| !line.is_empty()).collect();
    assert_eq!(
        lines,
        [
            "ERR unknown command 'NOTACMD', with args beginning with: ",
            "OK",
            "b"
        ]
    );
    server.stop().unwrap();
}

#[test]
fn redis_benchmark_runs_pipelined_sets_and_gets() {
    if !have("redis-benchmark") {
        return;
    }
    let server = TestServer::start(60);
    let (success, stdout, stderr) = redis_benchmark(
        &server,
        &[
            "-t", "get,set", "-n", "2000", "-P", "16", "-r", "1000", "-d", "64",
        ],
    );
    assert!(success, "{stdout}\n{stderr}");
    for command in ["SET", "GET"] {
        let reported = stdout.split(['\r', '\n']).any(|line| {
            line.starts_with(&format!("{command}: ")) && line.contains("requests per second")
        });
        assert!(reported, "no {command} rate in: {stdout}\n{stderr}");
    }
    let [_, head, _, _] = server.store.boundaries();
    assert!(
        head.value() > 0,
        "the benchmark's values must reach the device"
    );
    server.stop().unwrap();
}

/// `kv serve`'s background compactor: redis-benchmark writes a 2 MiB
/// device's worth many times over; writers that outrun the compactor wait
/// for it, every SET succeeds, and a key written last reads back.
#[test]
fn a_compacted_server_takes_far_more_writes_than_its_device_holds() {
    use remora_kv::compactor::{CompactionPolicy, Compactor};
    if !have("redis-benchmark") {
        return;
    }
    let server = TestServer::on_device(60, 2 << 20);
    let compactor = Compactor::start(server.store.clone(), CompactionPolicy::default()).unwrap();
    let (success, stdout, stderr) = redis_benchmark(
        &server,
        &[
            "-t", "set", "-n", "60000", "-P", "16", "-c", "8", "-r", "2000", "-d", "200",
        ],
    );
    assert!(
        success && !stdout.contains("ERR") && !stderr.contains("ERR"),
        "{stdout}\n{stderr}"
    );
    let [begin, _, _, tail] = server.store.boundaries();
    assert!(
        tail.value() > 4 * (2 << 20) && begin.value() > 0,
        "the log went around the device several times: {begin} .. {tail}"
    );
    assert_eq!(redis_cli(&server, &["SET", "last", "word"]), "OK");
    assert_eq!(redis_cli(&server, &["GET", "last"]), "word");
    let info = redis_cli(&server, &["INFO"]);
    assert!(!info.contains("compactions=0,"), "{info}");
    compactor.stop().unwrap();
    server.stop().unwrap();
}

#[test]
fn connections_beyond_the_limit_are_refused_until_one_closes() {
    let server = TestServer::start(1);
    let mut first = server.connect();
    first.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_exactly(&mut first, 7), "+PONG\r\n");
    let mut second = server.connect();
    assert_eq!(
        read_until_closed(&mut second),
        "-ERR max number of clients reached\r\n"
    );
    drop(first);
    let started = Instant::now();
    loop {
        let mut third = server.connect();
        // A refused connection may be reset before the PING is written.
        let _ = third.write_all(b"PING\r\n");
        let mut answer = [0; 7];
        if third.read_exact(&mut answer).is_ok() && &answer == b"+PONG\r\n" {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the closed slot was never reused"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    server.stop().unwrap();
}

#[test]
fn stopping_closes_idle_connections_and_returns() {
    let server = TestServer::start(4);
    let mut idle = server.connect();
    idle.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_exactly(&mut idle, 7), "+PONG\r\n");
    // Stopped on a thread of its own, so a stop that never returns fails
    // the test instead of hanging it.
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || sender.send(server.stop()));
    receiver
        .recv_timeout(Duration::from_secs(5))
        .expect("the server stops within 5 s with a connection idle")
        .unwrap();
    assert_eq!(read_until_closed(&mut idle), "");
}

/// A real `redis-server` on a loopback port of its own, without
/// persistence; stopped when dropped.
struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    fn start() -> RedisServer {
        // A port the kernel just handed out and took back: free unless
        // another process takes it in the moment between.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let arguments = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        .map(str::to_owned);
        let child = Command::new("redis-server")
            .args(arguments)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("redis-server does not start: {error}"));
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(started.elapsed() < DEADLINE, "redis-server never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
        RedisServer { child, port }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `redis-cli` prints for `script` (a command a line) against the
/// server on `port`.
fn redis_cli_script(port: u16, script: &str) -> Vec<String> {
    let port = port.to_string();
    let output = run(
        "redis-cli",
        &["-h", "127.0.0.1", "-p", &port],
        script.as_bytes(),
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The same commands, their errors included, answered as Redis 7 answers
/// them, checked against Debian's `redis-server` rather than against
/// texts written down here.
#[test]
fn replies_and_error_texts_match_a_real_redis_server() {
    if !have("redis-cli") || !have("redis-server") {
        return;
    }
    let script = "\
SET k v
GET k
GET missing
INCR word
SET word remora
INCR word
INCRBY n x
SET n 5
INCRBY n 9223372036854775807
DECRBY n -9223372036854775808
DECRBY n 3
DECR n
MSET a 1 b 2
MGET a missing b
EXISTS a b missing
DEL a missing
GET
MSET a
DECRBY n
PING
PING hello
PING a b
FOO x
FOO aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb cccccccccc dddd
SELECT 0
";
    let redis = RedisServer::start();
    let remora = TestServer::start(8);
    let expected = redis_cli_script(redis.port, script);
    let answered = redis_cli_script(remora.port, script);
    let commands: Vec<&str> = script.lines().collect();
    assert_eq!(expected.len(), answered.len(), "{expected:?}\n{answered:?}");
    for (line, (expected, answered)) in expected.iter().zip(&answered).enumerate() {
        assert_eq!(answered, expected, "reply {line} of {commands:?}");
    }
    remora.stop().unwrap();
}
