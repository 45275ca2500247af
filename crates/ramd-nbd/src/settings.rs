//! NBD's settings: one group of a disk's flags (and so of its config
//! table's keys): where clients connect and how TLS guards them.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

#[derive(clap::Args, Debug, Clone)]
pub struct NbdArgs {
    /// Where NBD clients connect: unix:PATH, or tcp:[HOST:]PORT (HOST
    /// defaults to 127.0.0.1; an address beyond loopback, such as 0.0.0.0,
    /// needs --tls require or --insecure). Repeat it to serve the disk on
    /// several sockets at once. Default: unix:RUN_DIR/NAME.sock.
    #[arg(long, value_parser = parse_listen, value_name = "ADDR", conflicts_with = "mount")]
    pub listen: Vec<Listen>,

    /// Let --listen tcp: on an address beyond loopback serve NBD to
    /// clients without TLS: anyone who can reach it can read and write the
    /// disk.
    #[arg(long, conflicts_with = "mount")]
    pub insecure: bool,

    /// NBD over TLS (the protocol's STARTTLS, as nbdkit and qemu speak it):
    /// off; on (offered, a client may decline it and go on in plaintext);
    /// require (every option but STARTTLS is refused before TLS: the disk
    /// is never served in plaintext). Default: on with --tls-certificates,
    /// else off. The printed URI is nbds:// (nbds+unix://) when TLS is on.
    #[arg(long, value_parser = parse_tls, value_name = "MODE", conflicts_with = "mount")]
    pub tls: Option<TlsMode>,

    /// NBD TLS credentials: a directory holding server-cert.pem and
    /// server-key.pem (PEM), ca-cert.pem for --tls-verify-peer, and
    /// optionally ca-crl.pem: the layout nbdkit and qemu use.
    #[arg(long, value_name = "DIR", conflicts_with = "mount")]
    pub tls_certificates: Option<PathBuf>,

    /// NBD TLS: a client must present a certificate signed by the CA of
    /// ca-cert.pem in --tls-certificates (and not revoked in ca-crl.pem).
    #[arg(long, requires = "tls_certificates")]
    pub tls_verify_peer: bool,
}

impl NbdArgs {
    /// One setting by its config key, as text to compare (a remount
    /// checks that what it cannot change is unchanged); `None`: not a key
    /// of this group.
    pub fn setting(&self, key: &str) -> Option<String> {
        let v = match key {
            "listen" => format!("{:?}", self.listen),
            "insecure" => self.insecure.to_string(),
            "tls" => format!("{:?}", self.tls),
            "tls_certificates" => format!("{:?}", self.tls_certificates),
            "tls_verify_peer" => self.tls_verify_peer.to_string(),
            _ => return None,
        };
        Some(v)
    }

    /// `--tls`, or its default: on with certificates, else off.
    pub fn tls_mode(&self) -> TlsMode {
        self.tls.unwrap_or(match self.tls_certificates {
            Some(_) => TlsMode::On,
            None => TlsMode::Off,
        })
    }
}

/// `--tls`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    Off,
    On,
    Require,
}

impl std::fmt::Display for TlsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TlsMode::Off => "off",
            TlsMode::On => "on",
            TlsMode::Require => "require",
        })
    }
}

fn parse_tls(s: &str) -> Result<TlsMode, String> {
    match s {
        "off" => Ok(TlsMode::Off),
        "on" => Ok(TlsMode::On),
        "require" => Ok(TlsMode::Require),
        _ => Err(format!("invalid TLS mode {s:?}: use off, on or require")),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl Listen {
    /// A TCP address other than loopback (127.0.0.0/8, ::1, and
    /// ::ffff:127.x.x.x): other hosts may reach it.
    pub fn beyond_loopback(&self) -> bool {
        match self {
            Listen::Unix(_) => false,
            Listen::Tcp(a) => !a.ip().to_canonical().is_loopback(),
        }
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Unix(p) => write!(f, "unix:{}", p.display()),
            Listen::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

pub fn parse_listen(s: &str) -> Result<Listen, String> {
    if let Some(path) = s.strip_prefix("unix:") {
        if path.is_empty() {
            return Err("unix: needs a socket path, like unix:/run/ramd/disk.sock".into());
        }
        return Ok(Listen::Unix(PathBuf::from(path)));
    }
    if let Some(rest) = s.strip_prefix("tcp:") {
        if let Ok(port) = rest.parse::<u16>() {
            return Ok(Listen::Tcp(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                port,
            )));
        }
        return rest.parse::<SocketAddr>().map(Listen::Tcp).map_err(|_| {
            format!("invalid TCP address {rest:?}: use PORT, HOST:PORT or [IPV6]:PORT")
        });
    }
    Err(format!(
        "invalid listen address {s:?}: use unix:PATH or tcp:[HOST:]PORT"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(
            parse_listen("tcp:10809"),
            Ok(Listen::Tcp("127.0.0.1:10809".parse().unwrap()))
        );
        assert_eq!(
            parse_listen("tcp:0.0.0.0:1"),
            Ok(Listen::Tcp("0.0.0.0:1".parse().unwrap()))
        );
        assert_eq!(
            parse_listen("tcp:[::1]:5"),
            Ok(Listen::Tcp("[::1]:5".parse().unwrap()))
        );
        assert_eq!(
            parse_listen("unix:/x.sock"),
            Ok(Listen::Unix("/x.sock".into()))
        );
        let beyond = |s: &str| parse_listen(s).unwrap().beyond_loopback();
        assert!(beyond("tcp:0.0.0.0:1"));
        assert!(beyond("tcp:[::]:1"));
        assert!(beyond("tcp:192.0.2.7:1"));
        assert!(!beyond("tcp:1"));
        assert!(!beyond("tcp:127.3.4.5:1"));
        assert!(!beyond("tcp:[::1]:1"));
        assert!(!beyond("tcp:[::ffff:127.0.0.1]:1"));
        assert!(!beyond("unix:/x.sock"));
        assert!(parse_listen("tcp:host").is_err());
        assert!(parse_listen("unix:").is_err());
        assert!(parse_listen("/x.sock").is_err());
    }
}
