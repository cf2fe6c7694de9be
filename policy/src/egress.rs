//! Egress allow-lists: where a command's connections through the gateway's
//! egress proxy may go (`network = { allow = [...] }`). Pure: the proxy
//! parses requests and resolves names; this decides on the name, the port
//! and the addresses it resolved to.
//!
//! An entry is a destination and optional port:
//!
//! - `pypi.org` — that name; `*.github.com` — any name below `github.com`
//!   (not `github.com` itself);
//! - `10.0.0.0/8`, `127.0.0.1`, `[fd00::]/8`, `[::1]` — addresses: a
//!   connection to a literal address inside, and a name (allowed by a name
//!   entry) that resolves inside, even where the address is private;
//! - a port after a colon (`pypi.org:8080`, `[::1]:8080`, `10.0.0.0/8:22`),
//!   `:*` for any port; without one, 80 and 443.
//!
//! A name may resolve only to public addresses unless an address entry
//! covers the address (loopback, private, link-local, cloud metadata,
//! multicast and reserved ranges are not public). A literal address is
//! reached only through an address entry.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// A grant's egress allow-list, in the policy's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Egress {
    pub entries: Vec<Destination>,
}

/// One entry of an allow-list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub host: Host,
    pub ports: Ports,
    /// As the policy wrote it: the rule an audit entry names.
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// Exactly this name (lower case, no trailing dot).
    Name(String),
    /// Any name ending in this suffix (`.github.com`).
    Below(String),
    /// Addresses in this range.
    Addresses(IpNet),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ports {
    /// 80 and 443: plain HTTP and HTTPS.
    Web,
    One(u16),
    Any,
}

impl Ports {
    fn allow(self, port: u16) -> bool {
        match self {
            Self::Web => port == 80 || port == 443,
            Self::One(p) => p == port,
            Self::Any => true,
        }
    }
}

/// Why an entry could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("`{0}`: a port must be a number from 1 to 65535, or `*`")]
    Port(String),
    #[error("`{0}`: not a host name, `*.` and a name, an address or an address range")]
    Host(String),
    #[error("`{0}`: an IPv6 address goes in brackets, `[{0}]`")]
    Brackets(String),
}

/// Why a connection is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{host}:{port} is not in the grant's egress allow-list")]
    NotListed { host: String, port: u16 },
    #[error("`{0}` is not a valid host name")]
    BadName(String),
    #[error(
        "{host} resolves only to addresses that are not public ({addresses}); an address entry \
         in the allow-list would allow them"
    )]
    NotPublic { host: String, addresses: String },
}

impl Egress {
    /// Reads the entries of `allow = [...]`.
    pub fn parse<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<Self, EntryError> {
        let entries = entries
            .into_iter()
            .map(Destination::parse)
            .collect::<Result<_, _>>()?;
        Ok(Self { entries })
    }

    /// The entry that allows a connection to `host` (a name, or an address
    /// literal as a client wrote it) on `port`.
    pub fn allows(&self, host: &str, port: u16) -> Result<&Destination, Refusal> {
        let not_listed = || Refusal::NotListed {
            host: host.to_string(),
            port,
        };
        if let Some(addr) = parse_address(host) {
            return self
                .entries
                .iter()
                .find(|d| d.ports.allow(port) && d.covers(addr))
                .ok_or_else(not_listed);
        }
        let name = normalize_name(host).ok_or_else(|| Refusal::BadName(host.to_string()))?;
        self.entries
            .iter()
            .find(|d| {
                d.ports.allow(port)
                    && match &d.host {
                        Host::Name(n) => *n == name,
                        Host::Below(suffix) => name.ends_with(suffix.as_str()),
                        Host::Addresses(_) => false,
                    }
            })
            .ok_or_else(not_listed)
    }

    /// Of the addresses `host` resolved to, those a connection on `port`
    /// may use: public ones, and those an address entry covers. None is a
    /// refusal.
    pub fn usable(
        &self,
        host: &str,
        port: u16,
        resolved: &[IpAddr],
    ) -> Result<Vec<IpAddr>, Refusal> {
        let usable: Vec<IpAddr> = resolved
            .iter()
            .copied()
            .filter(|addr| {
                is_public(*addr)
                    || self
                        .entries
                        .iter()
                        .any(|d| d.ports.allow(port) && d.covers(*addr))
            })
            .collect();
        if usable.is_empty() {
            let addresses: Vec<String> = resolved.iter().map(IpAddr::to_string).collect();
            return Err(Refusal::NotPublic {
                host: host.to_string(),
                addresses: addresses.join(", "),
            });
        }
        Ok(usable)
    }
}

impl Destination {
    fn parse(text: &str) -> Result<Self, EntryError> {
        let err_host = || EntryError::Host(text.to_string());
        let (host, port) = split_port(text)?;
        let host = if let Some(inner) = host.strip_prefix('[') {
            // `[v6]` or `[v6]/len` or `[v6/len]`.
            let (addr, len) = match inner.split_once(']') {
                Some((addr, "")) => (addr, None),
                Some((addr, rest)) => (addr, Some(rest.strip_prefix('/').ok_or_else(err_host)?)),
                None => return Err(err_host()),
            };
            let (addr, len) = match (addr.split_once('/'), len) {
                (Some((addr, l)), None) => (addr, Some(l)),
                (None, len) => (addr, len),
                (Some(_), Some(_)) => return Err(err_host()),
            };
            let addr: Ipv6Addr = addr.parse().map_err(|_| err_host())?;
            Host::Addresses(net(IpAddr::V6(addr), len).ok_or_else(err_host)?)
        } else if let Some((addr, len)) = host.split_once('/') {
            let addr: Ipv4Addr = addr.parse().map_err(|_| err_host())?;
            Host::Addresses(net(IpAddr::V4(addr), Some(len)).ok_or_else(err_host)?)
        } else if let Ok(addr) = host.parse::<Ipv4Addr>() {
            Host::Addresses(IpNet::from(IpAddr::V4(addr)))
        } else if let Some(suffix) = host.strip_prefix("*.") {
            let suffix = normalize_name(suffix).ok_or_else(err_host)?;
            Host::Below(format!(".{suffix}"))
        } else {
            Host::Name(normalize_name(host).ok_or_else(err_host)?)
        };
        Ok(Self {
            host,
            ports: port,
            text: text.to_string(),
        })
    }

    fn covers(&self, addr: IpAddr) -> bool {
        match &self.host {
            Host::Addresses(net) => net.contains(&canonical(addr)),
            _ => false,
        }
    }
}

/// `host[:port]`, where a host in brackets may hold colons.
fn split_port(text: &str) -> Result<(&str, Ports), EntryError> {
    let (host, port) = if text.starts_with('[') {
        let close = text.find(']').map_or(text.len(), |i| i + 1);
        match text[close..].split_once(':') {
            Some((range, port)) => (&text[..close + range.len()], Some(port)),
            None => (text, None),
        }
    } else if text.matches(':').count() > 1 {
        return Err(EntryError::Brackets(text.to_string()));
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    let ports = match port {
        None => Ports::Web,
        Some("*") => Ports::Any,
        Some(port) => match port.parse::<u16>() {
            Ok(p) if p > 0 => Ports::One(p),
            _ => return Err(EntryError::Port(text.to_string())),
        },
    };
    Ok((host, ports))
}

fn net(addr: IpAddr, len: Option<&str>) -> Option<IpNet> {
    match len {
        None => Some(IpNet::from(addr)),
        Some(len) => IpNet::new(addr, len.parse().ok()?).ok().map(|n| n.trunc()),
    }
}

/// A host as a client writes it: `1.2.3.4`, `[::1]` or `::1`.
pub fn parse_address(host: &str) -> Option<IpAddr> {
    let inner = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    inner.parse().ok().map(canonical)
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

/// A DNS name in lower case without a trailing dot, when it is one:
/// labels of letters, digits, `-` and `_`, at most 253 bytes.
pub fn normalize_name(name: &str) -> Option<String> {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    (!name.is_empty() && name.len() <= 253 && name.split('.').all(label_ok)).then_some(name)
}

/// Whether `addr` is an ordinary address on the internet: not loopback,
/// private, shared (CGNAT), link-local (where clouds serve instance
/// metadata), documentation, benchmarking, multicast, reserved or
/// unspecified, and not an IPv6 form that embeds such an IPv4 address.
pub fn is_public(addr: IpAddr) -> bool {
    const V4: &[(u32, u8)] = &[
        (0x0000_0000, 8),  // "this network"
        (0x0a00_0000, 8),  // private
        (0x6440_0000, 10), // shared (CGNAT; Alibaba's metadata)
        (0x7f00_0000, 8),  // loopback
        (0xa9fe_0000, 16), // link-local (AWS, GCP, Azure metadata)
        (0xac10_0000, 12), // private
        (0xc000_0000, 24), // IETF protocol assignments
        (0xc000_0200, 24), // documentation
        (0xc058_6300, 24), // 6to4 relay anycast
        (0xc0a8_0000, 16), // private
        (0xc612_0000, 15), // benchmarking
        (0xc633_6400, 24), // documentation
        (0xcb00_7100, 24), // documentation
        (0xe000_0000, 4),  // multicast
        (0xf000_0000, 4),  // reserved, broadcast
    ];
    const V6: &[(u128, u8)] = &[
        (0, 127),                                        // unspecified, loopback
        (0x0000_0000_0000_0000_0000_ffff_0000_0000, 96), // IPv4-mapped
        (0x0064_ff9b_0000_0000_0000_0000_0000_0000, 96), // NAT64
        (0x0064_ff9b_0001_0000_0000_0000_0000_0000, 48), // local NAT64
        (0x0100_0000_0000_0000_0000_0000_0000_0000, 64), // discard
        (0x2001_0000_0000_0000_0000_0000_0000_0000, 23), // IETF (Teredo, …)
        (0x2001_0db8_0000_0000_0000_0000_0000_0000, 32), // documentation
        (0x2002_0000_0000_0000_0000_0000_0000_0000, 16), // 6to4
        (0xfc00_0000_0000_0000_0000_0000_0000_0000, 7), // unique local (AWS metadata fd00:ec2::254)
        (0xfe80_0000_0000_0000_0000_0000_0000_0000, 10), // link-local
        (0xfec0_0000_0000_0000_0000_0000_0000_0000, 10), // site-local
        (0xff00_0000_0000_0000_0000_0000_0000_0000, 8), // multicast
    ];
    match canonical(addr) {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            !V4.iter()
                .any(|&(net, len)| (bits ^ net).checked_shr(32 - u32::from(len)) == Some(0))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            !V6.iter()
                .any(|&(net, len)| (bits ^ net).checked_shr(128 - u32::from(len)) == Some(0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn egress(entries: &[&str]) -> Egress {
        Egress::parse(entries.iter().copied()).unwrap()
    }

    #[test]
    fn names_match_exactly_or_below_a_wildcard_on_web_ports_by_default() {
        let e = egress(&["pypi.org", "*.github.com:443", "files.example:*"]);
        assert_eq!(e.allows("pypi.org", 443).unwrap().text, "pypi.org");
        assert!(e.allows("PyPI.org.", 80).is_ok());
        assert!(e.allows("pypi.org", 8080).is_err());
        assert!(e.allows("evilpypi.org", 443).is_err());
        assert!(e.allows("api.github.com", 443).is_ok());
        assert!(e.allows("a.b.github.com", 443).is_ok());
        assert!(e.allows("github.com", 443).is_err());
        assert!(e.allows("api.github.com", 80).is_err());
        assert!(e.allows("x.notgithub.com", 443).is_err());
        assert!(e.allows("files.example", 22).is_ok());
        assert!(matches!(
            e.allows("bad name", 443),
            Err(Refusal::BadName(_))
        ));
    }

    #[test]
    fn literal_addresses_need_an_address_entry() {
        let e = egress(&["pypi.org", "127.0.0.0/8:*", "[::1]:8080", "[fd00::/8]"]);
        assert!(e.allows("151.101.0.223", 443).is_err());
        assert!(e.allows("127.0.0.1", 9).is_ok());
        assert!(e.allows("[::1]", 8080).is_ok());
        assert!(e.allows("::1", 8081).is_err());
        assert!(e.allows("[fd12::1]", 443).is_ok());
        assert!(e.allows("[::ffff:127.0.0.1]", 9).is_ok());
    }

    #[test]
    fn names_may_resolve_to_private_addresses_only_where_an_entry_covers_them() {
        let e = egress(&["pypi.org", "*.corp.example", "10.1.0.0/16:443"]);
        let public: IpAddr = "151.101.0.223".parse().unwrap();
        let private: IpAddr = "10.1.2.3".parse().unwrap();
        let metadata: IpAddr = "169.254.169.254".parse().unwrap();
        assert_eq!(
            e.usable("pypi.org", 443, &[metadata, public]).unwrap(),
            vec![public]
        );
        assert!(matches!(
            e.usable("pypi.org", 443, &[metadata]),
            Err(Refusal::NotPublic { .. })
        ));
        assert_eq!(
            e.usable("git.corp.example", 443, &[private]).unwrap(),
            vec![private]
        );
        assert!(e.usable("git.corp.example", 80, &[private]).is_err());
    }

    #[test]
    fn entries_that_are_not_destinations_are_refused_with_the_reason() {
        for (bad, want) in [
            ("pypi.org:0", "port"),
            ("pypi.org:http", "port"),
            ("::1", "brackets"),
            ("10.0.0.0/33", "host"),
            ("*.", "host"),
            ("a b", "host"),
            ("[::1", "host"),
            ("", "host"),
        ] {
            let err = Egress::parse([bad]).unwrap_err();
            let got = match err {
                EntryError::Port(_) => "port",
                EntryError::Host(_) => "host",
                EntryError::Brackets(_) => "brackets",
            };
            assert_eq!(got, want, "{bad}: {err}");
        }
    }

    #[test]
    fn public_means_not_local_private_metadata_or_reserved() {
        for private in [
            "127.0.0.1",
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "169.254.169.254",
            "100.100.100.200",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fd00:ec2::254",
            "fe80::1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "2002:a00:1::",
            "ff02::1",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in [
            "151.101.0.223",
            "8.8.8.8",
            "2a04:4e42::223",
            "::ffff:8.8.8.8",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }
}
