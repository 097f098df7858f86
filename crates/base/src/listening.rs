//! Whether a local TCP port has a listener, read from Linux's
//! `/proc/net/tcp` and `/proc/net/tcp6`: for harnesses that start a server
//! program (perftest's) and must not start its client before it listens.
//! A connection attempt cannot ask: perftest's server takes the first
//! connection it accepts for its client.

use std::io;

/// The socket state `/proc/net/tcp*` gives a listening socket.
const LISTEN_STATE: &str = "0A";

/// Whether some socket listens on TCP `port`, over IPv4 or IPv6.
pub fn tcp_port_is_listening(port: u16) -> io::Result<bool> {
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        match std::fs::read_to_string(table) {
            Ok(text) if table_has_listener(&text, port) => return Ok(true),
            Ok(_) => {}
            // A kernel without IPv6 has no tcp6 table.
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error),
        }
    }
    Ok(false)
}

/// Waits until some socket listens on TCP `port` (`server`, once it is
/// ready for its client): true then, false if `server` ended first or
/// `limit` passed.
pub fn await_listening(
    server: &mut std::process::Child,
    port: u16,
    limit: std::time::Duration,
) -> io::Result<bool> {
    let deadline = std::time::Instant::now() + limit;
    // Bounded by the deadline.
    loop {
        if tcp_port_is_listening(port)? {
            return Ok(true);
        }
        if server.try_wait()?.is_some() || std::time::Instant::now() > deadline {
            return Ok(false);
        }
        std::thread::sleep(LOOK_INTERVAL);
    }
}

/// How often [`await_listening`] looks.
const LOOK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);

/// Whether a `/proc/net/tcp*` table lists a listener on `port`. Each row
/// after the heading reads `sl local_address rem_address st ...`, the
/// local address as `HEXADDRESS:HEXPORT`.
fn table_has_listener(table: &str, port: u16) -> bool {
    table.lines().skip(1).any(|row| {
        let mut fields = row.split_whitespace().skip(1);
        let local_port = fields
            .next()
            .and_then(|local| local.rsplit_once(':'))
            .and_then(|(_, hex)| u16::from_str_radix(hex, 16).ok());
        let state = fields.nth(1);
        local_port == Some(port) && state == Some(LISTEN_STATE)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:5209 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:A001 0100007F:5209 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 30 10 -1
";

    #[test]
    fn a_listening_row_is_found_by_its_port_and_a_connected_one_is_not() {
        assert!(table_has_listener(TABLE, 0x5209));
        // 0xA001 is only a client's end of a connection.
        assert!(!table_has_listener(TABLE, 0xA001));
        assert!(!table_has_listener(TABLE, 80));
        assert!(!table_has_listener("garbage\nno fields here\n", 0x5209));
    }

    #[test]
    fn a_socket_this_test_listens_on_is_seen() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(tcp_port_is_listening(port).unwrap());
        drop(listener);
        assert!(!tcp_port_is_listening(port).unwrap());
    }
}
