//! The gateway's addresses (`AUTH_TRUSTED_PROXIES`): ranges a peer's
//! address is matched against.

use std::net::IpAddr;

/// An address range: `10.0.0.0/8`, `::1`, `127.0.0.1/32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl std::str::FromStr for IpNet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an address or a range (a.b.c.d/n)"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
        };
        Ok(Self { addr, prefix })
    }
}

impl IpNet {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// `AUTH_TRUSTED_PROXIES`: the gateway's addresses, as one value (clap
/// would take a `Vec` for a list of values, and panic at start when its
/// parser gives a whole list for each).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(pub Vec<IpNet>);

impl std::str::FromStr for TrustedProxies {
    type Err = String;

    /// Comma-separated addresses or ranges.
    fn from_str(s: &str) -> Result<Self, String> {
        s.split(',')
            .filter(|p| !p.trim().is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_ranges_match_their_addresses_only() {
        let parse_proxies = |s: &str| s.parse::<TrustedProxies>().map(|p| p.0);
        let nets = parse_proxies("10.0.0.0/8, 127.0.0.2,::1").unwrap();
        let any = |ip: &str| nets.iter().any(|n| n.contains(ip.parse().unwrap()));
        assert!(any("10.200.3.4"));
        assert!(any("127.0.0.2"));
        assert!(any("::ffff:127.0.0.2"));
        assert!(any("::1"));
        assert!(!any("11.0.0.1"));
        assert!(!any("127.0.0.1"));
        assert!(!any("::2"));
        assert!(parse_proxies("10.0.0.0/33").is_err());
        assert!(parse_proxies("example.com").is_err());
        assert!(parse_proxies("0.0.0.0/0").unwrap()[0].contains("8.8.8.8".parse().unwrap()));
    }
}
