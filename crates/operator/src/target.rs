//! A forward's target as the plugin's config writes it.

use std::net::IpAddr;

/// `addr:port`, or `[addr]:port` for IPv6: a forward's target.
pub fn target(address: &str, port: u32) -> String {
    match address.parse::<IpAddr>() {
        Ok(IpAddr::V6(a)) => format!("[{a}]:{port}"),
        Ok(a) => format!("{a}:{port}"),
        Err(_) => format!("{address}:{port}"),
    }
}
