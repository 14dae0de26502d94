//! Free ports for the processes of a test, below the ephemeral range.

use super::*;

/// `N` distinct free ports below the kernel's ephemeral range: a port from
/// that range, free when picked, may be taken by an outgoing connection
/// before the process it is for binds it (a manager failed so, "Address
/// already in use"). Each is checked by binding it on every address, and
/// held until all are bound, so no port is handed out twice.
pub fn free_ports<const N: usize>() -> Result<[u16; N], String> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let below = ephemeral_start().clamp(LOWEST_PORT + 1000, u16::MAX);
    let span = u64::from(below - LOWEST_PORT);
    let mut state = rand_seed() as u64 ^ u64::from(std::process::id()) << 32;
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0; N];
    let mut tries = 0;
    while listeners.len() < N {
        tries += 1;
        if tries > 10_000 {
            return Err(format!("no free port between {LOWEST_PORT} and {below}"));
        }
        // splitmix64: spread the picks of concurrent test processes.
        state = state.wrapping_add(
            0x9E37_79B9_7F4A_7C15 ^ NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        );
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let port = LOWEST_PORT + ((z ^ (z >> 31)) % span) as u16;
        if ports.contains(&port) {
            continue;
        }
        if let Ok(listener) = TcpListener::bind(("0.0.0.0", port)) {
            ports[listeners.len()] = port;
            listeners.push(listener);
        }
    }
    Ok(ports)
}

/// The lowest port the test kit hands out.
const LOWEST_PORT: u16 = 20_000;

/// The first port of the kernel's ephemeral range (32768 when unknown).
fn ephemeral_start() -> u16 {
    fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}
