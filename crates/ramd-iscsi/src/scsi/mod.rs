//! The SCSI logical unit of a block disk: SPC-4/SBC-3 commands over a ramd
//! store. The iSCSI layer calls [`Lun::execute`] with a whole command (CDB
//! and all its Data-Out) and sends back the [`Reply`]; REPORT LUNS and
//! commands to a LUN that does not exist are the target's, answered by
//! [`report_luns`] and [`no_such_lun`].
//!
//! What the iSCSI layer must know (besides the signatures):
//! - [`LunConfig::write_cache`]: set it when the disk is saved to an image,
//!   so that MODE SENSE reports a volatile write cache (WCE) and initiators
//!   send SYNCHRONIZE CACHE, which calls [`Store::flush`] (durable with
//!   `--flush persist`, as NBD FLUSH).
//! - `data_out` may be longer than the CDB asks for (an expected data
//!   transfer length above it): the extra bytes are ignored, except by
//!   WRITE SAME and COMPARE AND WRITE, which refuse a Data-Out of the wrong
//!   size. Shorter than the CDB asks for: WRITE(6/10/12/16) and WRITE AND
//!   VERIFY write what came and leave the rest of the range alone; the
//!   other commands that take Data-Out (WRITE SAME, COMPARE AND WRITE,
//!   UNMAP, VERIFY with BYTCHK, PERSISTENT RESERVE OUT) are refused with
//!   INVALID FIELD IN COMMAND INFORMATION UNIT and write nothing.
//!   Either way [`Reply::expected_out`] says what the CDB called for, so
//!   that the residual can be reported.
//! - REPORT LUNS (A0h) goes to [`report_luns`], never to a [`Lun`]; LUN
//!   numbers are encoded with [`encode_lun`] / [`decode_lun`].
//! - [`Lun::reset`] for LUN RESET and TARGET WARM RESET, [`Lun::nexus_lost`]
//!   when a session ends: both drop RESERVE(6/10) reservations; persistent
//!   reservations outlive both. PREEMPT AND ABORT does not abort the
//!   preempted nexuses' tasks (a command runs to completion inside
//!   `execute`, so there is nothing queued in the logical unit to abort).
//! - [`Lun::reset`] raises a unit attention (29h/03h) for every nexus the
//!   unit knows (it learns them from INQUIRY, TEST UNIT READY, READ
//!   CAPACITY and the like); nothing else does (a RAM disk has no media
//!   change, and reservation changes are not announced).

mod block;
pub mod fuzz;
mod inquiry;
mod mode;
mod opcodes;
mod pr;
pub mod sense;
#[cfg(test)]
mod tests;
mod ua;

use std::sync::Arc;
use std::time::Instant;

use parking_lot::RwLock;
use ramd_store::metrics::{IoMetrics, Op};
use ramd_store::Store;

use sense::Sense;

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
    /// Every command that would change the disk fails with DATA PROTECT,
    /// WRITE PROTECTED, and MODE SENSE sets WP.
    pub read_only: bool,
    /// The disk's identity, as 64 bits: the NAA and T10 vendor
    /// designators of VPD page 0x83 come from it (ramd gives 64 bits of
    /// the disk's UUID, kept in its image).
    pub id: u64,
    /// VPD page 0x80.
    pub serial: String,
    /// INQUIRY's product identification (16 bytes at most).
    pub product: String,
    /// The disk is saved to an image, so what is written is not durable
    /// until a flush: MODE SENSE's caching page reports WCE=1, and
    /// initiators send SYNCHRONIZE CACHE (and FUA), which call
    /// [`Store::flush`]. Without an image RAM is the medium: WCE=0.
    pub write_cache: bool,
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
    /// can report a residual against the expected data transfer length
    /// (set on CHECK CONDITION too, once the CDB's length was understood).
    pub expected_out: usize,
}

impl Reply {
    /// GOOD with `data_in` (cut to `alloc`, the CDB's allocation length).
    pub fn good(mut data_in: Vec<u8>, alloc: usize) -> Reply {
        data_in.truncate(alloc);
        Reply {
            status: status::GOOD,
            sense: Vec::new(),
            data_in,
            expected_out: 0,
        }
    }

    /// CHECK CONDITION with `sense`.
    pub fn check(sense: Sense) -> Reply {
        Reply {
            status: status::CHECK_CONDITION,
            sense: sense.encode(),
            data_in: Vec::new(),
            expected_out: 0,
        }
    }

    /// RESERVATION CONFLICT (no sense data).
    pub fn conflict() -> Reply {
        Reply {
            status: status::RESERVATION_CONFLICT,
            sense: Vec::new(),
            data_in: Vec::new(),
            expected_out: 0,
        }
    }
}

/// What a command handler returns: a reply, or the sense data of its
/// CHECK CONDITION.
type Outcome = Result<Reply, Sense>;

/// The most one READ/WRITE/VERIFY may move: the data buffer is allocated
/// whole, so this bounds what one command can make the daemon allocate.
/// 32 MiB: 65536 blocks of 512 bytes, which libiscsi's WRITE SAME tests
/// write in one command.
pub const MAX_TRANSFER_BYTES: u64 = 32 << 20;
/// The most one WRITE SAME may cover (it holds one `Change` throughout).
pub const MAX_WRITE_SAME_BYTES: u64 = 1 << 30;
/// The most blocks one UNMAP may cover, summed over its descriptors
/// (libiscsi calls more than 2^20 insanely big).
pub const MAX_UNMAP_BLOCKS: u32 = 1 << 20;
/// UNMAP block descriptors per command.
pub const MAX_UNMAP_DESCRIPTORS: u32 = 256;
/// COMPARE AND WRITE's NUMBER OF LOGICAL BLOCKS at most (ESXi uses 1).
pub const MAX_COMPARE_AND_WRITE: u8 = 128;
/// The store's page: the physical block, and the unmap granularity.
const PAGE: u32 = 4096;

/// One command being executed.
struct Cmd<'a> {
    nexus: &'a Nexus,
    /// Cut to the opcode's CDB length.
    cdb: &'a [u8],
    data: &'a [u8],
    /// See [`Reply::expected_out`].
    expected_out: usize,
}

/// One block disk as a SCSI logical unit.
pub struct Lun {
    store: Arc<Store>,
    cfg: LunConfig,
    /// Logical blocks on the disk.
    blocks: u64,
    /// log2 of the block size.
    shift: u32,
    /// COMPARE AND WRITE is atomic against every other write to the LUN:
    /// ESXi's ATS heartbeat and locks (VMFS) compare a sector and replace
    /// it, and a WRITE landing between the compare and the write would let
    /// two hosts both believe they own a lock. Writes take this shared (no
    /// contention among themselves), COMPARE AND WRITE exclusively. Taken
    /// after the store's `Change` (lock order: gate, frontend, shard).
    caw: RwLock<()>,
    pr: pr::Reservations,
    ua: ua::UnitAttention,
    /// Where each command's latency and bytes are recorded (`frontend="iscsi"`).
    metrics: Option<Arc<IoMetrics>>,
}

impl Lun {
    pub fn new(store: Arc<Store>, cfg: LunConfig) -> Lun {
        assert!(cfg.block_size == 512 || cfg.block_size == 4096);
        let shift = cfg.block_size.trailing_zeros();
        Lun {
            blocks: store.size() >> shift,
            store,
            cfg,
            shift,
            caw: RwLock::new(()),
            pr: pr::Reservations::default(),
            ua: ua::UnitAttention::default(),
            metrics: None,
        }
    }

    /// Records every command into `metrics` (`ramd status --json`'s `io`,
    /// `/metrics`).
    pub fn with_metrics(mut self, metrics: Arc<IoMetrics>) -> Lun {
        self.metrics = Some(metrics);
        self
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
    pub fn execute(&self, nexus: &Nexus, cdb: &[u8], data_out: &[u8]) -> Reply {
        let started = Instant::now();
        let mut cmd = Cmd {
            nexus,
            cdb,
            data: data_out,
            expected_out: 0,
        };
        let mut reply = match self.dispatch(&mut cmd) {
            Ok(r) => r,
            Err(s) => Reply::check(s),
        };
        reply.expected_out = cmd.expected_out;
        if let Some(m) = &self.metrics {
            let (op, bytes) = match cdb.first() {
                Some(0x08 | 0x28 | 0xa8 | 0x88) => (Op::Read, reply.data_in.len()),
                Some(0x0a | 0x2a | 0xaa | 0x8a | 0x2e | 0xae | 0x8e | 0x89) => {
                    (Op::Write, cmd.expected_out.min(data_out.len()))
                }
                Some(0x42) => (Op::Trim, 0),
                Some(0x41 | 0x93) => (Op::Zero, 0),
                Some(0x35 | 0x91) => (Op::Flush, 0),
                _ => (Op::Other, 0),
            };
            m.record(op, bytes as u64, started, reply.status == status::GOOD);
        }
        reply
    }

    /// LUN RESET (and TARGET WARM RESET): what SAM says a logical unit
    /// reset clears (RESERVE/RELEASE reservations; persistent ones stay).
    pub fn reset(&self) {
        self.pr.reset();
        self.ua.raise_all(ua::RESET_OCCURRED);
    }

    /// The nexus's session ended: what it held that does not outlive it
    /// (its RESERVE(6/10) reservation; persistent registrations stay).
    pub fn nexus_lost(&self, nexus: &Nexus) {
        self.pr.nexus_lost(nexus);
        self.ua.forget(nexus);
    }

    fn dispatch(&self, cmd: &mut Cmd) -> Outcome {
        let Some(&opcode) = cmd.cdb.first() else {
            return Err(sense::INVALID_OPCODE);
        };
        // A unit attention is reported to (and cleared by) the nexus's next
        // command but INQUIRY, REPORT LUNS and REQUEST SENSE (which returns
        // it as its data).
        if !matches!(opcode, 0x12 | 0xA0 | 0x03) {
            if let Some(s) = self.ua.take(cmd.nexus) {
                return Err(s);
            }
        }
        let len = opcodes::cdb_len(opcode);
        if cmd.cdb.len() < len {
            return Err(sense::invalid_cdb(cmd.cdb.len() as u16, None));
        }
        cmd.cdb = &cmd.cdb[..len];
        let Some(op) = opcodes::lookup(cmd.cdb) else {
            return Err(if opcodes::has_service_action(opcode) {
                sense::invalid_cdb(1, Some(4))
            } else {
                sense::INVALID_OPCODE
            });
        };
        // NACA: ramd does not support auto contingent allegiance.
        if cmd.cdb[len - 1] & 0x04 != 0 {
            return Err(sense::invalid_cdb(len as u16 - 1, Some(2)));
        }
        if matches!(op.access, opcodes::Access::Info | opcodes::Access::Meta) {
            self.ua.know(cmd.nexus);
        }
        if self.pr.conflicts(cmd.nexus, op.access) {
            return Ok(Reply::conflict());
        }
        let c = cmd.cdb;
        match opcode {
            0x00 => Ok(Reply::good(Vec::new(), 0)),
            0x03 => self.request_sense(cmd.nexus, c),
            0x08 => {
                let (lba, n) = rw6(c);
                self.read(cmd, lba, n, None)
            }
            0x0A => {
                let (lba, n) = rw6(c);
                self.write(cmd, lba, n, false, None)
            }
            0x12 => self.inquiry(c, cmd.nexus.target_port_id),
            0x16 | 0x56 => self.pr.reserve_legacy(cmd.nexus, c),
            0x17 | 0x57 => self.pr.release_legacy(cmd.nexus, c),
            0x1A | 0x5A => self.mode_sense(c),
            0x1B => Ok(Reply::good(Vec::new(), 0)),
            0x25 => self.read_capacity10(c),
            0x28 | 0xA8 | 0x88 => {
                let (lba, n) = lba_len(c);
                self.read(cmd, lba, n, Some(()))
            }
            0x2A | 0xAA | 0x8A => {
                let (lba, n) = lba_len(c);
                self.write(cmd, lba, n, c[1] & 0x08 != 0, Some(()))
            }
            0x2E | 0xAE | 0x8E => {
                let (lba, n) = lba_len(c);
                self.write_verify(cmd, lba, n)
            }
            0x2F | 0xAF | 0x8F => {
                let (lba, n) = lba_len(c);
                self.verify(cmd, lba, n)
            }
            // PRE-FETCH: the data is in memory already.
            0x34 | 0x90 => {
                let (lba, n) = lba_len(c);
                self.check_range(lba, n)?;
                Ok(Reply::good(Vec::new(), 0))
            }
            0x35 | 0x91 => {
                let (lba, n) = lba_len(c);
                self.sync_cache(lba, n)
            }
            0x41 | 0x93 => {
                let (lba, n) = lba_len(c);
                self.write_same(cmd, lba, n)
            }
            0x42 => self.unmap(cmd),
            0x5E => self.pr.report(c),
            0x5F => self.pr_out(cmd),
            0x89 => self.compare_and_write(cmd),
            0x9E if c[1] & 0x1F == 0x10 => self.read_capacity16(c),
            0x9E => self.get_lba_status(c),
            0xA3 => opcodes::report(c).map(|d| Reply::good(d, be32(&c[6..]) as usize)),
            // REPORT LUNS is the target's (see the module docs).
            _ => Err(sense::INVALID_OPCODE),
        }
    }

    /// `[lba, lba+n)` as a byte range, or LBA OUT OF RANGE.
    fn check_range(&self, lba: u64, n: u64) -> Result<(u64, u64), Sense> {
        match lba.checked_add(n) {
            Some(end) if end <= self.blocks => Ok((lba << self.shift, n << self.shift)),
            _ => Err(sense::LBA_OUT_OF_RANGE),
        }
    }

    fn sync_cache(&self, lba: u64, n: u64) -> Outcome {
        self.check_range(lba, n)?;
        self.store
            .flush()
            .map_err(|e| sense::from_store(&e, true))?;
        Ok(Reply::good(Vec::new(), 0))
    }

    fn pr_out(&self, cmd: &mut Cmd) -> Outcome {
        let len = be32(&cmd.cdb[5..]) as usize;
        cmd.expected_out = len;
        if cmd.data.len() < len {
            return Err(sense::INVALID_FIELD_IN_IU);
        }
        self.pr.out(cmd.nexus, cmd.cdb, &cmd.data[..len])
    }
}

/// READ(6)/WRITE(6): a 21-bit LBA and 0 meaning 256 blocks.
fn rw6(c: &[u8]) -> (u64, u64) {
    let lba = u64::from(c[1] & 0x1F) << 16 | u64::from(c[2]) << 8 | u64::from(c[3]);
    let n = if c[4] == 0 { 256 } else { u64::from(c[4]) };
    (lba, n)
}

/// The LOGICAL BLOCK ADDRESS and TRANSFER LENGTH (or NUMBER OF LOGICAL
/// BLOCKS) of a 10-, 12- or 16-byte CDB.
fn lba_len(c: &[u8]) -> (u64, u64) {
    match c.len() {
        10 => (be32(&c[2..]).into(), be16(&c[7..]).into()),
        12 => (be32(&c[2..]).into(), be32(&c[6..]).into()),
        _ => (be64(&c[2..]), be32(&c[10..]).into()),
    }
}

impl Lun {
    /// REQUEST SENSE: sense is returned with each CHECK CONDITION
    /// (autosense), so only a unit attention can be pending; else NO SENSE.
    fn request_sense(&self, n: &Nexus, c: &[u8]) -> Outcome {
        if c[1] & 0x01 != 0 {
            // DESC: descriptor-format sense data is not supported.
            return Err(sense::invalid_cdb(1, Some(0)));
        }
        let s = self
            .ua
            .take(n)
            .unwrap_or(Sense::new(sense::key::NO_SENSE, 0, 0));
        Ok(Reply::good(s.encode(), usize::from(c[4])))
    }
}

pub(crate) fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

pub(crate) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

pub(crate) fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

/// A LUN number as SAM's 8-byte LUN field: peripheral device addressing
/// below 256, flat space addressing below 16384 (the largest LUN this
/// target hands out; larger numbers are clamped to it).
pub fn encode_lun(lun: u64) -> [u8; 8] {
    let mut out = [0u8; 8];
    if lun < 256 {
        out[1] = lun as u8;
    } else {
        let l = lun.min(0x3FFF);
        out[0] = 0x40 | (l >> 8) as u8;
        out[1] = l as u8;
    }
    out
}

/// The LUN number an initiator addressed, or `None` for an addressing
/// method this target does not use (which then names no LUN).
pub fn decode_lun(field: [u8; 8]) -> Option<u64> {
    if field[2..] != [0; 6] {
        return None;
    }
    match field[0] >> 6 {
        0 if field[0] == 0 => Some(u64::from(field[1])),
        1 => Some(u64::from(field[0] & 0x3F) << 8 | u64::from(field[1])),
        _ => None,
    }
}

/// REPORT LUNS for a target whose LUNs are `luns`.
pub fn report_luns(luns: &[u64], cdb: &[u8]) -> Reply {
    if cdb.len() < 12 {
        return Reply::check(sense::invalid_cdb(cdb.len() as u16, None));
    }
    if cdb[11] & 0x04 != 0 {
        return Reply::check(sense::invalid_cdb(11, Some(2)));
    }
    // SELECT REPORT: 0 and 2 list every LUN, 1 the well-known ones (none).
    let listed: &[u64] = match cdb[2] {
        0x00 | 0x02 => luns,
        0x01 => &[],
        _ => return Reply::check(sense::invalid_cdb(2, None)),
    };
    let mut out = Vec::with_capacity(8 + 8 * listed.len());
    out.extend_from_slice(&((8 * listed.len()) as u32).to_be_bytes());
    out.extend_from_slice(&[0; 4]);
    for &l in listed {
        out.extend_from_slice(&encode_lun(l));
    }
    Reply::good(out, be32(&cdb[6..]) as usize)
}

/// A command addressed to a LUN the target does not have (INQUIRY answers
/// with peripheral qualifier 011b, the rest LOGICAL UNIT NOT SUPPORTED).
pub fn no_such_lun(cdb: &[u8]) -> Reply {
    match cdb.first() {
        Some(0x12) if cdb.len() >= 6 => {
            let alloc = usize::from(be16(&cdb[3..]));
            let data = if cdb[1] & 0x01 != 0 {
                vec![0x7F, cdb[2], 0, 0]
            } else {
                let mut d = vec![0u8; 36];
                d[0] = 0x7F;
                d[2] = 0x06;
                d[3] = 0x02;
                d[4] = 31;
                d
            };
            Reply::good(data, alloc)
        }
        // REQUEST SENSE reports the condition as its parameter data.
        Some(0x03) if cdb.len() >= 6 => {
            Reply::good(sense::LUN_NOT_SUPPORTED.encode(), usize::from(cdb[4]))
        }
        _ => Reply::check(sense::LUN_NOT_SUPPORTED),
    }
}
