//! Who is at the other end of a connection, when it is on this machine.
//!
//! The server trusts the ids a client sends with each namespace request,
//! as an NFS server trusts `AUTH_SYS` from the hosts it lets in (see
//! `squash`). That trust is the host's root's to give: a remote host's
//! users reach the server only through what its root set up (the token,
//! a mount). On the server's own machine, any user can open a connection
//! (no token is needed on loopback) and send whatever ids it likes, and
//! since `interlock mount` runs as any user through `fusermount3`, users
//! do. So a connection from this machine is asked of the kernel: the
//! owner of the client's socket (`sock_diag`, the lookup `ss` makes, one
//! exact lookup by the connection's addresses: O(1), once a connection).
//! If it is root or the server's own user, the client is trusted as
//! before; any other user's requests are served as that user
//! ([`LocalUser::apply`]), whatever ids they carry, and the
//! administrative requests (evicting a session, the changelog) are
//! refused to it. A connection whose socket the kernel cannot find on
//! this machine came from another host, unless it came over loopback
//! (its client closed its end already, or the lookup failed): that one
//! is served as nobody. A kernel that offers no `sock_diag` at all makes
//! the server trust every client as a remote one ([`owners_known`]).
//!
//! ```
//! use interlock_server::LocalUser;
//! use interlock_meta::Cred;
//!
//! let user = LocalUser { uid: 1000, gid: 1000, groups: vec![24, 1000] };
//! let mut cred = Cred { uid: 0, gid: 0, groups: vec![24, 27] };
//! user.apply(&mut cred);
//! assert_eq!(cred, Cred { uid: 1000, gid: 1000, groups: vec![24] });
//! ```

use std::net::{IpAddr, SocketAddr};

use interlock_proto::{Op, Reply};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketType, netlink};

/// A user of this machine, other than root and the server's own user,
/// with the groups the system's user database gives them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalUser {
    pub uid: u32,
    /// The primary group.
    pub gid: u32,
    /// Every group the user is in (the primary among them), sorted.
    pub groups: Vec<u32>,
}

impl LocalUser {
    /// The user that owns uid `uid`, with its groups from the user
    /// database (`getpwuid`, `getgrouplist`: NSS, which may be slow, so
    /// called once per connection, off the async workers). A uid the
    /// database does not know gets the group 65534 (nogroup) alone.
    pub fn of(uid: u32) -> LocalUser {
        let known = nix::unistd::User::from_uid(uid.into()).ok().flatten();
        let Some(user) = known else { return LocalUser::unknown(uid) };
        let gid = user.gid.as_raw();
        let mut groups: Vec<u32> = std::ffi::CString::new(user.name.into_bytes())
            .ok()
            .and_then(|name| nix::unistd::getgrouplist(&name, user.gid).ok())
            .map_or_else(|| vec![gid], |gs| gs.into_iter().map(|g| g.as_raw()).collect());
        groups.push(gid);
        groups.sort_unstable();
        groups.dedup();
        LocalUser { uid, gid, groups }
    }

    /// A user the user database does not know (or could not be asked
    /// about): the group 65534 (nogroup) alone.
    pub fn unknown(uid: u32) -> LocalUser {
        LocalUser { uid, gid: NOGROUP, groups: vec![NOGROUP] }
    }

    /// Serves a request as this user: its uid becomes the user's, and
    /// of the groups it names only those the user is in are kept (a
    /// primary group the user is not in becomes the user's own), so a
    /// process that switched to another of its groups (`newgrp`, `sg`)
    /// makes files in that group, as it would on a local disk.
    /// O(groups × log groups).
    pub fn apply(&self, cred: &mut interlock_meta::Cred) {
        let member = |g: &u32| self.groups.binary_search(g).is_ok();
        cred.uid = self.uid;
        if !member(&cred.gid) {
            cred.gid = self.gid;
        }
        cred.groups.retain(member);
    }
}

/// How a connection's requests are served, decided once when it opens:
/// as a local user ([`LocalUser`]), or with the ids they carry, root's
/// squashed where the server squashes this client's root (`squash`).
#[derive(Debug)]
pub(crate) struct ServedAs {
    pub user: Option<LocalUser>,
    pub squash: Option<(u32, u32)>,
}

impl ServedAs {
    /// The request as served, or the refusal of an administrative
    /// request (ending a session, the changelog, which names every file)
    /// from a local user. O(groups × log groups).
    pub fn admit(&self, op: Op) -> Result<Op, Reply> {
        match (op, &self.user, self.squash) {
            (Op::Meta { mut cred, op, once }, Some(user), _) => {
                user.apply(&mut cred);
                Ok(Op::Meta { cred, op, once })
            }
            (Op::Evict { .. } | Op::Changelog(_), Some(user), _) => Err(Reply::Denied(format!(
                "permission denied: uid {} is a user of the server's machine; only root or the server's own user may evict a session or use the changelog",
                user.uid
            ))),
            (Op::Meta { mut cred, op, once }, None, Some(anon)) => {
                cred.squash(anon);
                Ok(Op::Meta { cred, op, once })
            }
            (op, _, _) => Ok(op),
        }
    }
}

/// Who the client at `peer` is (`local` the server's end): root, the
/// server's own user or another host's client (`None`: trusted with the
/// ids it sends), or another user of this machine. A client on loopback
/// whose socket the kernel cannot name (it closed its end already, or
/// the lookup failed) is served as nobody (65534): it can only be local.
pub(crate) fn user_of(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    let found = owner(peer, local).unwrap_or_else(|e| {
        tracing::warn!(%peer, error = %e, "cannot ask the kernel who owns a client's socket");
        None
    });
    let uid = match found {
        Some(uid) => uid,
        None if peer.ip().to_canonical().is_loopback() => NOBODY,
        None => return None,
    };
    (uid != 0 && uid != nix::unistd::geteuid().as_raw()).then_some(uid)
}

/// Whether the kernel names the owner of a connection made here. Where
/// it cannot (no `sock_diag`: a kernel built without it, a sandbox that
/// does not offer it), every client is trusted as a remote host's is,
/// and the server says so at its start: serving root's own clients as
/// nobody would make the server unusable there. Makes one connection to
/// a port of its own on loopback.
pub(crate) fn owners_known() -> bool {
    let probe = || -> std::io::Result<bool> {
        let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))?;
        let client = std::net::TcpStream::connect(listener.local_addr()?)?;
        let (_, peer) = listener.accept()?;
        Ok(peer == client.local_addr()? && owner(peer, listener.local_addr()?)?.is_some())
    };
    probe().unwrap_or(false)
}

/// The user the user database calls nobody.
const NOBODY: u32 = 65534;

/// The group of users the user database does not know.
const NOGROUP: u32 = 65534;

/// Whom a connection from `peer` to the server's `local` address comes
/// from: `Some(uid)` of the client socket's owner if it is on this
/// machine, `None` if the kernel has no such socket here (another host;
/// a client on this machine that already closed its end is treated as
/// that too, which it can only do to itself).
///
/// Errors are the netlink socket's: the caller cannot tell who is there.
fn owner(peer: SocketAddr, local: SocketAddr) -> std::io::Result<Option<u32>> {
    let fd = rustix::net::socket(AddressFamily::NETLINK, SocketType::DGRAM, Some(netlink::SOCK_DIAG))?;
    rustix::net::sendto(&fd, &request(peer, local), SendFlags::empty(), &netlink::SocketAddrNetlink::new(0, 0))?;
    let mut reply = [0u8; 512];
    let (len, _) = rustix::net::recv(&fd, &mut reply, RecvFlags::empty())?;
    answer(&reply[..len.min(reply.len())])
}

/// `SOCK_DIAG_BY_FAMILY`, `NLMSG_ERROR`, `NLM_F_REQUEST`, `IPPROTO_TCP`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const IPPROTO_TCP: u8 = 6;
/// States whose diagnostics carry no owner (reported as 0): a socket in
/// `TIME_WAIT` and a connection not yet accepted (`NEW_SYN_RECV`).
const OWNERLESS_STATES: [u8; 2] = [6, 12];

/// A `sock_diag` request (`nlmsghdr`, then `inet_diag_req_v2`) for the
/// one TCP socket whose own address is `peer` and whose remote address
/// is `local`: the client's end of the connection, looked up exactly (no
/// dump). An IPv4 client reaching a server that listens on IPv6 is
/// looked up by its IPv4 addresses, where the kernel keeps it.
fn request(peer: SocketAddr, local: SocketAddr) -> Vec<u8> {
    let (src, dst) = (peer.ip().to_canonical(), local.ip().to_canonical());
    let family = if src.is_ipv4() && dst.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // `inet_diag_sockid` keeps 16 bytes an address: an IPv4 one first.
    let addr = |ip: IpAddr| match ip {
        IpAddr::V4(v4) if family == libc::AF_INET => {
            let mut out = [0u8; 16];
            out[..4].copy_from_slice(&v4.octets());
            out
        }
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    };
    let mut req = Vec::with_capacity(72);
    req.extend_from_slice(&72u32.to_ne_bytes());
    req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    req.extend_from_slice(&[0u8; 8]); // sequence number and port id
    req.extend_from_slice(&[family as u8, IPPROTO_TCP, 0, 0]);
    req.extend_from_slice(&u32::MAX.to_ne_bytes()); // any state
    req.extend_from_slice(&peer.port().to_be_bytes());
    req.extend_from_slice(&local.port().to_be_bytes());
    req.extend_from_slice(&addr(src));
    req.extend_from_slice(&addr(dst));
    req.extend_from_slice(&0u32.to_ne_bytes()); // any interface
    req.extend_from_slice(&[0xff; 8]); // no cookie to match
    req
}

/// The owner in a reply to [`request`]: its `inet_diag_msg`'s uid, or
/// `None` for "no such socket" (`ENOENT`) or a state that has no owner.
fn answer(reply: &[u8]) -> std::io::Result<Option<u32>> {
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "a short or unknown sock_diag reply");
    // The `N` bytes at `at`, as the kernel wrote them.
    fn at<const N: usize>(reply: &[u8], at: usize) -> Option<[u8; N]> {
        reply.get(at..at + N)?.try_into().ok()
    }
    let kind = u16::from_ne_bytes(at(reply, 4).ok_or_else(bad)?);
    if kind == NLMSG_ERROR {
        let errno = -i32::from_ne_bytes(at(reply, 16).ok_or_else(bad)?);
        return if errno == libc::ENOENT { Ok(None) } else { Err(std::io::Error::from_raw_os_error(errno)) };
    }
    if kind != SOCK_DIAG_BY_FAMILY {
        return Err(bad());
    }
    // After the 16-byte header: family, state, …; the uid 64 bytes in.
    let [state] = at(reply, 17).ok_or_else(bad)?;
    let uid = u32::from_ne_bytes(at(reply, 16 + 64).ok_or_else(bad)?);
    Ok((!OWNERLESS_STATES.contains(&state)).then_some(uid))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection to `to` from a socket of user 65534 (made on a
    /// thread of its own with that file-system uid) where the test runs
    /// as root, so that an owner read from the wrong bytes (zeros, say)
    /// shows; elsewhere of the test's own user. With the owner expected.
    fn connect_as_another(to: SocketAddr) -> (std::net::TcpStream, u32) {
        let euid = nix::unistd::geteuid().as_raw();
        let uid = if euid == 0 { NOBODY } else { euid };
        let client = std::thread::spawn(move || {
            nix::unistd::setfsuid(uid.into());
            std::net::TcpStream::connect(to)
        });
        (client.join().unwrap().unwrap(), uid)
    }

    /// The kernel names the owner of a client socket on this machine,
    /// over IPv4 and IPv6 (where the machine has it), and finds none for
    /// addresses no socket has.
    #[test]
    fn the_kernel_names_the_owner_of_a_local_client_socket() {
        for (at, nobody) in [("127.0.0.1:0", "127.0.0.1:1"), ("[::1]:0", "[::1]:1")] {
            let Ok(listener) = std::net::TcpListener::bind(at) else {
                eprintln!("SKIPPED {at}: cannot listen there");
                continue;
            };
            let (client, uid) = connect_as_another(listener.local_addr().unwrap());
            let (_server, peer) = listener.accept().unwrap();
            let local = listener.local_addr().unwrap();
            assert_eq!(peer, client.local_addr().unwrap());
            assert_eq!(owner(peer, local).unwrap(), Some(uid), "{at}");
            assert_eq!(owner(nobody.parse().unwrap(), local).unwrap(), None, "{at}");
        }
    }

    /// A client's end that closed first lingers in `TIME_WAIT`, where
    /// the kernel reports no owner (uid 0): it is no one's, not root's.
    #[test]
    fn a_client_end_in_time_wait_has_no_owner() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        let (client, _) = connect_as_another(local);
        let (mut server, peer) = listener.accept().unwrap();
        drop(client);
        std::io::Read::read_to_end(&mut server, &mut Vec::new()).unwrap();
        drop(server);
        // The client's end reaches TIME_WAIT once the server's FIN is in.
        let t = std::time::Instant::now();
        while owner(peer, local).unwrap().is_some() {
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "still owned");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// A connection to a server listening on IPv6 from an IPv4 client.
    #[test]
    fn a_v4_client_of_a_v6_listener_is_found() {
        let Ok(listener) = std::net::TcpListener::bind("[::]:0") else { return };
        let port = listener.local_addr().unwrap().port();
        let (_client, uid) = connect_as_another(SocketAddr::from(([127, 0, 0, 1], port)));
        let (server, peer) = listener.accept().unwrap();
        assert!(matches!(peer.ip(), IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some()), "{peer}");
        assert_eq!(owner(peer, server.local_addr().unwrap()).unwrap(), Some(uid));
    }

    #[test]
    fn a_local_user_is_served_with_its_own_ids_and_groups_only() {
        let user = LocalUser { uid: 1000, gid: 100, groups: vec![24, 100, 1000] };
        let served = |mut c: interlock_meta::Cred| {
            user.apply(&mut c);
            c
        };
        let root = interlock_meta::Cred { uid: 0, gid: 0, groups: vec![0, 24] };
        assert_eq!(served(root), interlock_meta::Cred { uid: 1000, gid: 100, groups: vec![24] });
        let newgrp = interlock_meta::Cred { uid: 1000, gid: 24, groups: vec![24, 100, 1000] };
        assert_eq!(served(newgrp.clone()), newgrp);
    }

    #[test]
    fn root_and_unknown_uids_get_groups_from_the_user_database() {
        let root = LocalUser::of(0);
        assert_eq!((root.uid, root.gid), (0, 0));
        assert!(root.groups.contains(&0));
        assert_eq!(LocalUser::of(3_999_999_999), LocalUser::unknown(3_999_999_999));
    }
}
