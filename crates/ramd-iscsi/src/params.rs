//! Operational parameter negotiation (RFC 7143 §13): each key the initiator
//! offers gets the answer its result function gives against what ramd
//! offers, and the outcome lands in [`Params`].

/// The connection's and session's negotiated values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    pub header_digest: bool,
    pub data_digest: bool,
    pub max_connections: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    /// What the initiator receives at most per PDU (its declaration).
    pub initiator_mrdsl: u32,
    /// What ramd receives at most per PDU (ramd's declaration).
    pub target_mrdsl: u32,
    pub max_burst: u32,
    pub first_burst: u32,
    pub default_time2wait: u32,
    pub default_time2retain: u32,
    pub max_outstanding_r2t: u32,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
}

/// ramd's own offers.
pub const OUR_MRDSL: u32 = 256 * 1024;
pub const OUR_MAX_BURST: u32 = 16 * 1024 * 1024 - 1024;
pub const OUR_FIRST_BURST: u32 = 16 * 1024 * 1024 - 1024;
pub const OUR_MAX_CONNECTIONS: u32 = 8;
pub const OUR_MAX_OUTSTANDING_R2T: u32 = 16;

impl Default for Params {
    /// The RFC's defaults, which hold for keys nobody negotiates.
    fn default() -> Params {
        Params {
            header_digest: false,
            data_digest: false,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            initiator_mrdsl: 8192,
            target_mrdsl: 8192,
            max_burst: 262144,
            first_burst: 65536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
        }
    }
}

fn num(v: &str) -> Option<u64> {
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()
    } else {
        v.parse().ok()
    }
}

fn boolean(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

fn yn(b: bool) -> String {
    if b { "Yes" } else { "No" }.to_string()
}

/// The answer to one operational key, or `None` when the key is not an
/// operational one (the caller handles login-only keys). Updates `p`.
/// `leading` is false on a second connection of a session, where
/// session-wide keys are irrelevant.
pub fn negotiate(p: &mut Params, key: &str, val: &str, leading: bool) -> Option<String> {
    let range = |lo: u64, hi: u64| num(val).filter(|n| (lo..=hi).contains(n));
    let session_key = matches!(
        key,
        "MaxConnections"
            | "InitialR2T"
            | "ImmediateData"
            | "MaxBurstLength"
            | "FirstBurstLength"
            | "DefaultTime2Wait"
            | "DefaultTime2Retain"
            | "MaxOutstandingR2T"
            | "DataPDUInOrder"
            | "DataSequenceInOrder"
            | "ErrorRecoveryLevel"
    );
    if session_key && !leading {
        return Some("Irrelevant".into());
    }
    let ans = match key {
        "HeaderDigest" | "DataDigest" => {
            // List: the first of the initiator's choices that ramd has.
            let pick = val.split(',').find(|c| *c == "None" || *c == "CRC32C");
            match pick {
                Some(c) => {
                    let on = c == "CRC32C";
                    if key == "HeaderDigest" {
                        p.header_digest = on;
                    } else {
                        p.data_digest = on;
                    }
                    c.to_string()
                }
                None => "Reject".into(),
            }
        }
        "MaxConnections" => match range(1, 65535) {
            Some(n) => {
                p.max_connections = (n as u32).min(OUR_MAX_CONNECTIONS);
                p.max_connections.to_string()
            }
            None => "Reject".into(),
        },
        // OR: ramd offers No, so the initiator's value stands.
        "InitialR2T" => match boolean(val) {
            Some(b) => {
                p.initial_r2t = b;
                yn(b)
            }
            None => "Reject".into(),
        },
        // AND: ramd offers Yes.
        "ImmediateData" => match boolean(val) {
            Some(b) => {
                p.immediate_data = b;
                yn(b)
            }
            None => "Reject".into(),
        },
        // Declarative: the initiator states what it receives; ramd states
        // its own separately (in the login answer).
        "MaxRecvDataSegmentLength" => match range(512, (1 << 24) - 1) {
            Some(n) => {
                p.initiator_mrdsl = n as u32;
                return Some(OUR_MRDSL.to_string());
            }
            None => "Reject".into(),
        },
        "MaxBurstLength" => match range(512, (1 << 24) - 1) {
            Some(n) => {
                p.max_burst = (n as u32).min(OUR_MAX_BURST);
                p.first_burst = p.first_burst.min(p.max_burst);
                p.max_burst.to_string()
            }
            None => "Reject".into(),
        },
        "FirstBurstLength" => match range(512, (1 << 24) - 1) {
            Some(n) => {
                p.first_burst = (n as u32).min(OUR_FIRST_BURST).min(p.max_burst);
                p.first_burst.to_string()
            }
            None => "Reject".into(),
        },
        "DefaultTime2Wait" => match range(0, 3600) {
            Some(n) => {
                p.default_time2wait = (n as u32).max(2);
                p.default_time2wait.to_string()
            }
            None => "Reject".into(),
        },
        "DefaultTime2Retain" => match range(0, 3600) {
            // Minimum with ramd's 0: ERL 0 keeps nothing for reassignment.
            Some(_) => {
                p.default_time2retain = 0;
                "0".into()
            }
            None => "Reject".into(),
        },
        "MaxOutstandingR2T" => match range(1, 65535) {
            Some(n) => {
                p.max_outstanding_r2t = (n as u32).min(OUR_MAX_OUTSTANDING_R2T);
                p.max_outstanding_r2t.to_string()
            }
            None => "Reject".into(),
        },
        // OR with ramd's Yes: always Yes.
        "DataPDUInOrder" | "DataSequenceInOrder" => match boolean(val) {
            Some(_) => "Yes".into(),
            None => "Reject".into(),
        },
        "ErrorRecoveryLevel" => match range(0, 2) {
            Some(_) => "0".into(),
            None => "Reject".into(),
        },
        // Markers (RFC 3720, obsolete): AND with ramd's No.
        "IFMarker" | "OFMarker" => "No".into(),
        "OFMarkInt" | "IFMarkInt" => "Irrelevant".into(),
        _ => return None,
    };
    Some(ans)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_functions() {
        let mut p = Params::default();
        assert_eq!(
            negotiate(&mut p, "HeaderDigest", "CRC32C,None", true).unwrap(),
            "CRC32C"
        );
        assert!(p.header_digest);
        assert_eq!(
            negotiate(&mut p, "DataDigest", "None,CRC32C", true).unwrap(),
            "None"
        );
        assert_eq!(
            negotiate(&mut p, "DataDigest", "MD5", true).unwrap(),
            "Reject"
        );
        assert_eq!(
            negotiate(&mut p, "MaxBurstLength", "262144", true).unwrap(),
            "262144"
        );
        // FirstBurstLength never exceeds MaxBurstLength.
        assert_eq!(
            negotiate(&mut p, "FirstBurstLength", "1048576", true).unwrap(),
            "262144"
        );
        assert_eq!(
            negotiate(&mut p, "MaxRecvDataSegmentLength", "0x2000", true).unwrap(),
            OUR_MRDSL.to_string()
        );
        assert_eq!(p.initiator_mrdsl, 8192);
        assert_eq!(
            negotiate(&mut p, "MaxRecvDataSegmentLength", "1", true).unwrap(),
            "Reject"
        );
        assert_eq!(
            negotiate(&mut p, "ErrorRecoveryLevel", "2", true).unwrap(),
            "0"
        );
        assert_eq!(negotiate(&mut p, "InitialR2T", "No", true).unwrap(), "No");
        assert!(!p.initial_r2t);
        assert_eq!(
            negotiate(&mut p, "MaxOutstandingR2T", "64", true).unwrap(),
            OUR_MAX_OUTSTANDING_R2T.to_string()
        );
        assert_eq!(
            negotiate(&mut p, "InitialR2T", "Maybe", true).unwrap(),
            "Reject"
        );
        assert_eq!(
            negotiate(&mut p, "MaxBurstLength", "4096", false).unwrap(),
            "Irrelevant"
        );
        assert!(negotiate(&mut p, "X-foo", "1", true).is_none());
    }
}
