//! Value parsers shared by the commands: every number and address on the
//! command line is checked here, so a bad one is a usage error (exit 2)
//! naming what is wrong, never a panic or a silent clamp.

use std::time::Duration;

/// The longest time any flag takes: a year. Longer is surely a mistake,
/// and `Duration` arithmetic stays far from overflow.
const MAX_SECS: f64 = 365.0 * 24.0 * 3600.0;

/// Seconds, as a plain number: finite, not negative, at most a year.
pub fn seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=MAX_SECS).contains(&v) => Ok(v),
        Ok(_) => Err(format!("{s:?}: seconds from 0 to {MAX_SECS} (a year)")),
        Err(_) => Err(format!("{s:?} is not a number of seconds")),
    }
}

/// Seconds above zero.
pub fn positive_seconds(s: &str) -> Result<f64, String> {
    match seconds(s)? {
        v if v > 0.0 => Ok(v),
        _ => Err(format!("{s:?}: must be more than 0 seconds")),
    }
}

/// An interval of at least 0.05 s (see [`seconds`]).
pub fn interval(s: &str) -> Result<Duration, String> {
    match seconds(s) {
        Ok(v) if v >= 0.05 => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!("{s:?}: an interval in seconds, from 0.05 to {MAX_SECS}")),
    }
}

/// A server address, `HOST:PORT` (a name or an IP address; IPv6 in
/// brackets).
pub fn server(s: &str) -> Result<String, String> {
    let bad = || format!("{s:?} is not HOST:PORT (e.g. 127.0.0.1:7420 or [::1]:7420)");
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    port.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(bad)?;
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => !host.is_empty() && host.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_'),
    };
    if host_ok { Ok(s.to_string()) } else { Err(bad()) }
}

/// Milliseconds of a lease: at least 100 (a shorter lease would expire
/// between renewals on a loaded machine).
pub fn lease_ms(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(v) if (100..=86_400_000).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: milliseconds from 100 to 86400000 (a day)")),
    }
}

/// A count of at least 1.
pub fn count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if v >= 1 => Ok(v),
        _ => Err(format!("{s:?}: a whole number, at least 1")),
    }
}

/// Threads of a server: 1 to 1024 (more is surely a mistake, and would
/// fail to start rather than serve).
pub fn threads(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if (1..=1024).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: threads from 1 to 1024")),
    }
}

/// A size in bytes: a whole number, with `K`, `M`, `G` or `T` after it
/// for KiB, MiB, GiB or TiB (`8G`, `512MiB`; `B` and `iB` allowed), at
/// least 1 MiB (less is surely a mistake).
pub fn bytes(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?}: a size of at least 1MiB, e.g. 8GiB, 512M or 1073741824");
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(digits);
    let shift = match unit {
        "" | "B" => 0,
        "K" | "k" | "KB" | "kB" | "KiB" => 10,
        "M" | "MB" | "MiB" => 20,
        "G" | "GB" | "GiB" => 30,
        "T" | "TB" | "TiB" => 40,
        _ => return Err(bad()),
    };
    let n: u64 = number.parse().map_err(|_| bad())?;
    n.checked_mul(1 << shift).filter(|&b| b >= 1 << 20).ok_or_else(bad)
}

/// A uid and gid, `UID:GID`, to serve root's requests as: neither root's
/// (that would squash nothing) nor -1 (4294967295, which Linux keeps to
/// mean "no id").
pub fn ids(s: &str) -> Result<(u32, u32), String> {
    let id = |v: &str| v.parse::<u32>().ok().filter(|&v| v != 0 && v != u32::MAX);
    let (uid, gid) = s.split_once(':').unzip();
    uid.and_then(id)
        .zip(gid.and_then(id))
        .ok_or_else(|| format!("{s:?}: UID:GID, two ids from 1 to 4294967294 (e.g. 65534:65534)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_numbers_are_refused_with_a_reason() {
        for bad in ["inf", "1e30", "nan", "-1", "", "x", "1e300"] {
            assert!(seconds(bad).is_err(), "{bad}");
            assert!(interval(bad).is_err(), "{bad}");
        }
        assert_eq!(seconds("2.5"), Ok(2.5));
        assert!(positive_seconds("0").is_err());
        assert!(interval("0.01").is_err());
        assert!(lease_ms("0").is_err() && lease_ms("99").is_err() && lease_ms("100").is_ok());
        assert!(count("0").is_err() && count("3").is_ok());
        assert!(threads("0").is_err() && threads("1025").is_err() && threads("1").is_ok() && threads("1024").is_ok());
        assert_eq!(ids("65534:65533"), Ok((65534, 65533)));
        assert_eq!((bytes("8G"), bytes("8GiB"), bytes("512MB")), (Ok(8 << 30), Ok(8 << 30), Ok(512 << 20)));
        assert_eq!((bytes("1048576"), bytes("1024k"), bytes("2T")), (Ok(1 << 20), Ok(1 << 20), Ok(2 << 40)));
        for bad in ["", "G", "1", "1048575", "1.5G", "-1G", "8X", "8 G", "8GiBs", "99999999999T", "1048576iB"] {
            assert!(bytes(bad).is_err(), "{bad}");
        }
        for bad in ["65534", "0:65534", "65534:0", "1:4294967295", ":1", "1:", "a:b", "1:2:3", "-1:5"] {
            assert!(ids(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn server_addresses() {
        for good in ["127.0.0.1:7420", "localhost:1", "[::1]:7420", "db-1.example.org:80"] {
            assert!(server(good).is_ok(), "{good}");
        }
        for bad in ["127.0.0.1", "x:port", ":7420", "a b:1", "[zz]:1", "h:0", "h:70000", "http://h:1"] {
            assert!(server(bad).is_err(), "{bad}");
        }
    }
}
