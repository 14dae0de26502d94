//! The manager's listeners and their TLS material.

pub mod dev_certs;
pub mod health;

use std::net::SocketAddr;

/// Parses a listen address the way the Go manager's flags spell them:
/// `:9440` means every interface, `127.0.0.1:9440` one of them.
pub fn parse_listen_addr(value: &str) -> Result<SocketAddr, String> {
    let full = match value.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => value.to_string(),
    };
    full.parse()
        .map_err(|e| format!("{value:?} is not host:port or :port ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        let table = [
            (":9440", Ok("0.0.0.0:9440")),
            ("127.0.0.1:8443", Ok("127.0.0.1:8443")),
            ("[::1]:1", Ok("[::1]:1")),
            ("9440", Err(())),
            (":http", Err(())),
        ];
        for (input, want) in table {
            let got = parse_listen_addr(input).map(|a| a.to_string()).map_err(|_| ());
            assert_eq!(got, want.map(str::to_string), "{input}");
        }
    }
}
