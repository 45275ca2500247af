//! The SCSI logical unit of a block disk: SPC-4/SBC-3 commands over a ramd
//! store. The iSCSI layer calls [`Lun::execute`] with a whole command (CDB
//! and all its Data-Out) and sends back the [`Reply`]; REPORT LUNS and
//! commands to a LUN that does not exist are the target's, answered by
//! [`report_luns`] and [`no_such_lun`].

use std::sync::Arc;

use ramd_store::Store;

/// SAM status codes.
pub mod status {
    pub const GOOD: u8 = 0x00;
    pub const CHECK_CONDITION: u8 = 0x02;
    pub const CONDITION_MET: u8 = 0x04;
    pub const BUSY: u8 = 0x08;
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    pub const TASK_SET_FULL: u8 = 0x28;
}

/// What a disk's LUN is, fixed for its life.
#[derive(Clone, Debug)]
pub struct LunConfig {
    /// 512 or 4096.
    pub block_size: u32,
    pub read_only: bool,
    /// Stable for the disk across restarts (derived from its name): the
    /// NAA/EUI designators of VPD page 0x83 come from it.
    pub id: u64,
    /// VPD page 0x80.
    pub serial: String,
    /// INQUIRY's product identification (16 bytes at most).
    pub product: String,
}

/// The I_T nexus a command came through, for reservations: the initiator
/// port (`<initiator name>,i,0x<ISID>`) and the relative target port id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Nexus {
    pub initiator_port: String,
    pub target_port_id: u16,
}

/// A finished command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// A [`status`] code.
    pub status: u8,
    /// Sense data (fixed format) with CHECK CONDITION, empty otherwise.
    pub sense: Vec<u8>,
    /// Data-In, already cut to the CDB's allocation/transfer length; the
    /// iSCSI layer cuts it further to the expected data transfer length and
    /// reports the residual.
    pub data_in: Vec<u8>,
    /// How many Data-Out bytes the CDB called for, so that the iSCSI layer
    /// can report a residual against the expected data transfer length.
    pub expected_out: usize,
}

/// One block disk as a SCSI logical unit.
pub struct Lun {
    store: Arc<Store>,
    cfg: LunConfig,
}

impl Lun {
    pub fn new(store: Arc<Store>, cfg: LunConfig) -> Lun {
        assert!(cfg.block_size == 512 || cfg.block_size == 4096);
        Lun { store, cfg }
    }

    pub fn config(&self) -> &LunConfig {
        &self.cfg
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Runs one command: `cdb` as received (the iSCSI layer passes its
    /// whole 16-byte field plus any extended CDB AHS), `data_out` every
    /// Data-Out byte the initiator sent for it.
    pub fn execute(&self, _nexus: &Nexus, _cdb: &[u8], _data_out: &[u8]) -> Reply {
        unimplemented!("the SCSI command set")
    }

    /// LUN RESET (and TARGET WARM RESET): what SAM says a logical unit
    /// reset clears (RESERVE/RELEASE reservations; persistent ones stay).
    pub fn reset(&self) {}

    /// The nexus's session ended: what it held that does not outlive it.
    pub fn nexus_lost(&self, _nexus: &Nexus) {}
}

/// REPORT LUNS for a target whose LUNs are `luns`.
pub fn report_luns(_luns: &[u64], _cdb: &[u8]) -> Reply {
    unimplemented!("REPORT LUNS")
}

/// A command addressed to a LUN the target does not have (INQUIRY answers
/// with peripheral qualifier 011b, the rest LOGICAL UNIT NOT SUPPORTED).
pub fn no_such_lun(_cdb: &[u8]) -> Reply {
    unimplemented!("commands to a missing LUN")
}
