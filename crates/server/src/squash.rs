//! Root squash: which clients' root users the server serves as an
//! anonymous user instead of as root.
//!
//! The server trusts the ids a client on another host sends with each
//! namespace request, as an NFS server trusts `AUTH_SYS`: the token and
//! TLS decide which hosts may speak at all (a client on the server's own
//! machine is served as the user it runs as: see `peer`). Root squash (NFS's `root_squash`, Lustre's
//! `root_squash` with its `nosquash_nids`) keeps a host's root user from
//! being root in the shared tree: requests made as uid 0 are served as
//! the anonymous uid, and gid 0 as the anonymous gid, except from the
//! addresses exempted (the server's own host, say, from which an
//! administrator sets the tree up). Decided once per connection, from
//! its peer's address.
//!
//! ```
//! use interlock_server::{IpPrefix, RootSquash};
//!
//! let squash = RootSquash { anon: (65534, 65534), except: vec!["10.1.0.0/16".parse().unwrap()] };
//! assert_eq!(squash.for_peer("10.2.0.7".parse().unwrap()), Some((65534, 65534)));
//! assert_eq!(squash.for_peer("10.1.3.4".parse().unwrap()), None);
//! ```

use std::net::IpAddr;
use std::str::FromStr;

use interlock_proto::RootSquashInfo;

/// Root squash: the ids root is served as, and the clients it spares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootSquash {
    /// The uid and gid that root's requests are served as.
    pub anon: (u32, u32),
    /// Clients from these addresses are served as they say they are.
    pub except: Vec<IpPrefix>,
}

impl RootSquash {
    /// As `status` reports it.
    pub fn info(&self) -> RootSquashInfo {
        let (uid, gid) = self.anon;
        RootSquashInfo { uid, gid, except: self.except.iter().map(ToString::to_string).collect() }
    }

    /// The ids to serve root's requests as for a client at `peer`, or
    /// `None` where it is exempt. O(exemptions).
    pub fn for_peer(&self, peer: IpAddr) -> Option<(u32, u32)> {
        (!self.except.iter().any(|p| p.contains(peer))).then_some(self.anon)
    }
}

/// An address prefix: `ADDR/LEN` (`10.1.0.0/16`, `fd00::/8`), or one
/// address (`127.0.0.1`, as `/32`). In a config file, the same string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub struct IpPrefix {
    addr: IpAddr,
    len: u8,
}

impl IpPrefix {
    /// Whether `ip` is in the prefix; an IPv4 client that reaches a
    /// server listening on IPv6 (`::ffff:a.b.c.d`) is taken as its IPv4
    /// address. O(1).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                same_high_bits(net.to_bits().into(), ip.to_bits().into(), self.len, 32)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => same_high_bits(net.to_bits(), ip.to_bits(), self.len, 128),
            _ => false,
        }
    }
}

/// Whether the top `len` of the low `width` bits of `a` and `b` agree.
fn same_high_bits(a: u128, b: u128, len: u8, width: u32) -> bool {
    len == 0 || (a ^ b) >> (width - u32::from(len)) == 0
}

impl FromStr for IpPrefix {
    type Err = String;

    fn from_str(s: &str) -> Result<IpPrefix, String> {
        let bad = || format!("{s:?}: an address or ADDR/LEN (127.0.0.1, 10.1.0.0/16, fd00::/8)");
        let (addr, len) = s.split_once('/').map_or((s, None), |(a, l)| (a, Some(l)));
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let width = if addr.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => width,
            Some(l) => l.parse::<u8>().ok().filter(|&l| l <= width).ok_or_else(bad)?,
        };
        Ok(IpPrefix { addr, len })
    }
}

impl TryFrom<String> for IpPrefix {
    type Error = String;

    fn try_from(s: String) -> Result<IpPrefix, String> {
        s.parse()
    }
}

impl std::fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_prefix_holds_the_addresses_under_it_alone() {
        let net: IpPrefix = "10.1.0.0/16".parse().unwrap();
        assert!(net.contains(ip("10.1.0.0")) && net.contains(ip("10.1.255.255")));
        assert!(!net.contains(ip("10.2.0.0")) && !net.contains(ip("10.0.255.255")));
        assert!(net.contains(ip("::ffff:10.1.2.3")), "an IPv4 client of an IPv6 listener");
        assert!(!net.contains(ip("::1")));
        let one: IpPrefix = "127.0.0.1".parse().unwrap();
        assert!(one.contains(ip("127.0.0.1")) && !one.contains(ip("127.0.0.2")));
        let all: IpPrefix = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("192.168.9.9")) && !all.contains(ip("fd00::1")));
        let v6: IpPrefix = "fd00::/8".parse().unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        assert_eq!(v6.to_string(), "fd00::/8");
        for bad in ["10.1.0.0/33", "fd00::/129", "10.1.0.0/", "10.1/16", "host", "", "/8", "1.2.3.4/-1"] {
            assert!(bad.parse::<IpPrefix>().is_err(), "{bad}");
        }
    }

    #[test]
    fn root_is_squashed_unless_its_client_is_exempt() {
        let squash = RootSquash { anon: (7, 8), except: vec!["127.0.0.1".parse().unwrap()] };
        assert_eq!(squash.for_peer(ip("127.0.0.1")), None);
        assert_eq!(squash.for_peer(ip("127.0.0.2")), Some((7, 8)));
        let everyone = RootSquash { anon: (7, 8), except: Vec::new() };
        assert_eq!(everyone.for_peer(ip("127.0.0.1")), Some((7, 8)));
    }
}
