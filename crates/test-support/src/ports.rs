//! Free loopback TCP ports for tests that must name a port before anything listens on it.

use std::net::{Ipv4Addr, TcpListener};

/// A TCP port on 127.0.0.1 that was free a moment ago.
///
/// The port is released before returning, so another process may take it; prefer binding to port 0
/// and reading the bound address where the program under test allows it.
pub fn free_port() -> u16 {
    match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|listener| listener.local_addr()) {
        Ok(addr) => addr.port(),
        Err(err) => panic!("no free TCP port on 127.0.0.1: {err}"),
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
}
