//! iSCSI's settings: one group of a disk's flags (and so of its config
//! table's keys): the portal, the LUN, the target's name and CHAP.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

#[derive(clap::Args, Debug, Clone)]
pub struct IscsiArgs {
    /// Serve the block disk as a LUN of the daemon's iSCSI target on this
    /// portal: [HOST:]PORT (HOST defaults to 127.0.0.1; an address beyond
    /// loopback needs --iscsi-chap or --iscsi-no-auth). Disks giving the
    /// same portal share it.
    #[arg(value_parser = parse_portal, value_name = "[HOST:]PORT", id = "iscsi", long = "iscsi", conflicts_with = "mount")]
    pub portal: Option<SocketAddr>,

    /// The disk's LUN number on the iSCSI target (0..=16383). Default: the
    /// lowest free one, in config order.
    #[arg(long, value_name = "N", requires = "iscsi", value_parser = clap::value_parser!(u16).range(0..16384))]
    pub iscsi_lun: Option<u16>,

    /// The iSCSI target's name, shared by all the daemon's disks.
    /// Default: iqn.2026-11.org.ramd:HOSTNAME.
    #[arg(long, value_name = "IQN", requires = "iscsi", value_parser = parse_iqn)]
    pub iscsi_target: Option<String>,

    /// CHAP that iSCSI initiators must pass: USER:SECRET (secret 12 to 255
    /// characters).
    #[arg(long, value_name = "USER:SECRET", requires = "iscsi", value_parser = parse_chap)]
    pub iscsi_chap: Option<(String, String)>,

    /// Mutual CHAP: the name and secret ramd answers an initiator's
    /// challenge with, USER:SECRET. Needs --iscsi-chap.
    #[arg(long, value_name = "USER:SECRET", requires = "iscsi_chap", value_parser = parse_chap)]
    pub iscsi_mutual_chap: Option<(String, String)>,

    /// Let an iSCSI portal beyond loopback serve without CHAP.
    #[arg(long, requires = "iscsi")]
    pub iscsi_no_auth: bool,

    /// Logical block size that SCSI initiators see: 512 or 4096.
    #[arg(long, default_value_t = 512, value_parser = parse_block_size, value_name = "BYTES", conflicts_with = "mount")]
    pub block_size: u32,
}

impl IscsiArgs {
    /// One setting by its config key, as text to compare (a remount
    /// checks that what it cannot change is unchanged); `None`: not a key
    /// of this group.
    pub fn setting(&self, key: &str) -> Option<String> {
        let v = match key {
            "iscsi" => format!("{:?}", self.portal),
            "iscsi_lun" => format!("{:?}", self.iscsi_lun),
            "iscsi_target" => format!("{:?}", self.iscsi_target),
            "iscsi_chap" => format!("{:?}", self.iscsi_chap),
            "iscsi_mutual_chap" => format!("{:?}", self.iscsi_mutual_chap),
            "iscsi_no_auth" => self.iscsi_no_auth.to_string(),
            "block_size" => self.block_size.to_string(),
            _ => return None,
        };
        Some(v)
    }
}

/// An iSCSI portal: PORT (on 127.0.0.1) or HOST:PORT.
fn parse_portal(s: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    s.parse::<SocketAddr>()
        .map_err(|_| format!("invalid iSCSI portal {s:?}: use PORT, HOST:PORT or [IPV6]:PORT"))
}

pub fn parse_iqn(s: &str) -> Result<String, String> {
    let ok = (s.starts_with("iqn.") || s.starts_with("eui.") || s.starts_with("naa."))
        && s.len() <= 223
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.' | ':'));
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "invalid iSCSI name {s:?}: use iqn.YYYY-MM.reversed.domain[:name], lower case, \
             at most 223 characters of a-z 0-9 - . :"
        ))
    }
}

fn parse_chap(s: &str) -> Result<(String, String), String> {
    match s.split_once(':') {
        Some((u, p)) if !u.is_empty() && (12..=255).contains(&p.len()) => {
            Ok((u.to_string(), p.to_string()))
        }
        _ => Err(
            "invalid CHAP setting: use USER:SECRET, the secret 12 to 255 characters \
             (what Windows' initiator requires)"
                .into(),
        ),
    }
}

fn parse_block_size(s: &str) -> Result<u32, String> {
    match s {
        "512" => Ok(512),
        "4096" => Ok(4096),
        _ => Err(format!("invalid block size {s:?}: use 512 or 4096")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iscsi_settings() {
        assert_eq!(parse_portal("3260"), Ok("127.0.0.1:3260".parse().unwrap()));
        assert_eq!(parse_portal("0.0.0.0:1"), Ok("0.0.0.0:1".parse().unwrap()));
        assert!(parse_portal("tcp:3260").is_err());
        assert!(parse_iqn("iqn.2026-11.org.ramd:box").is_ok());
        assert!(parse_iqn("IQN.X").is_err());
        assert!(parse_iqn("target").is_err());
        assert_eq!(
            parse_chap("u:123456789012"),
            Ok(("u".into(), "123456789012".into()))
        );
        assert!(parse_chap("u:short").is_err());
        assert!(parse_chap(":123456789012").is_err());
        assert_eq!(parse_block_size("4096"), Ok(4096));
        assert!(parse_block_size("1024").is_err());
    }
}
