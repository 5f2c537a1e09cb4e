//! Free loopback TCP ports for tests that must name a port before anything listens on it.

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;

/// Ports already handed out by this process: the kernel may offer a just-released port again,
/// and a test that asks for several ports in a row (gRPC, HTTP, monitoring) needs distinct ones.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A TCP port on 127.0.0.1 that was free a moment ago, never the same twice in one process.
///
/// The port is released before returning, so another process may take it; prefer binding to port 0
/// and reading the bound address where the program under test allows it.
pub fn free_port() -> u16 {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let handed_out = handed_out.get_or_insert_with(HashSet::new);
    loop {
        let port = match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|listener| listener.local_addr()) {
            Ok(addr) => addr.port(),
            Err(err) => panic!("no free TCP port on 127.0.0.1: {err}"),
        };
        if handed_out.insert(port) {
            return port;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_port_can_be_bound() -> std::io::Result<()> {
        let port = free_port();
        assert_ne!(port, 0);
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))?;
        assert_eq!(listener.local_addr()?.port(), port);
        Ok(())
    }

    #[test]
    fn never_the_same_port_twice() {
        let ports: HashSet<u16> = (0..200).map(|_| free_port()).collect();
        assert_eq!(ports.len(), 200);
    }
}
