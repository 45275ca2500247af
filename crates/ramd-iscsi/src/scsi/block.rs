//! SBC-3 commands on the medium: READ, WRITE, VERIFY, WRITE AND VERIFY,
//! WRITE SAME, UNMAP, COMPARE AND WRITE, READ CAPACITY, GET LBA STATUS.

use ramd_store::ExtentKind;

use super::sense::{self, invalid_cdb, invalid_param, Sense};
use super::{be16, be32, be64, Cmd, Lun, Outcome, Reply};
use super::{
    MAX_COMPARE_AND_WRITE, MAX_TRANSFER_BYTES, MAX_UNMAP_BLOCKS, MAX_UNMAP_DESCRIPTORS,
    MAX_WRITE_SAME_BYTES,
};

/// The CDB byte holding the TRANSFER LENGTH (or NUMBER OF LOGICAL BLOCKS),
/// for the field pointer of INVALID FIELD IN CDB.
fn length_byte(opcode: u8) -> u16 {
    match opcode >> 5 {
        0 => 4,
        1 | 2 => 7,
        5 => 6,
        _ => 10,
    }
}

/// How far GET LBA STATUS looks in one command: the store walks its
/// table chunk by chunk, so a whole multi-terabyte disk would take long;
/// the initiator asks again from where the answer stops.
const LBA_STATUS_SCAN_BYTES: u64 = 16 << 30;
/// WRITE SAME writes its pattern from a buffer this big at most.
const PATTERN_BYTES: u64 = 1 << 20;

impl Lun {
    pub(super) fn block_size(&self) -> u64 {
        1 << self.shift
    }

    /// RDPROTECT/WRPROTECT/VRPROTECT (byte 1, bits 7-5): the disk has no
    /// protection information, so anything but 0 is refused.
    fn no_protection(c: &[u8]) -> Result<(), Sense> {
        if c[1] & 0xE0 != 0 {
            return Err(invalid_cdb(1, Some(7)));
        }
        Ok(())
    }

    /// `n` blocks at `lba` for a command that moves them: in range and
    /// within the transfer limit.
    fn transfer(&self, c: &[u8], lba: u64, n: u64) -> Result<(u64, usize), Sense> {
        let (off, len) = self.check_range(lba, n)?;
        if len > MAX_TRANSFER_BYTES {
            return Err(invalid_cdb(length_byte(c[0]), None));
        }
        Ok((off, len as usize))
    }

    /// READ(6/10/12/16). `flags`: the CDB has a byte 1 of flags (all but
    /// READ(6)); DPO and FUA need nothing (memory is the medium).
    pub(super) fn read(&self, cmd: &mut Cmd, lba: u64, n: u64, flags: Option<()>) -> Outcome {
        if flags.is_some() {
            Self::no_protection(cmd.cdb)?;
        }
        let (off, len) = self.transfer(cmd.cdb, lba, n)?;
        let mut buf = vec![0u8; len];
        self.store
            .read(off, &mut buf)
            .map_err(|e| sense::from_store(&e, false))?;
        Ok(Reply::good(buf, len))
    }

    /// The checks every command that writes the disk makes after its CDB:
    /// the disk is writable, and the initiator sent the Data-Out.
    fn writable(&self, cmd: &mut Cmd, len: usize) -> Result<(), Sense> {
        cmd.expected_out = len;
        if self.cfg.read_only || self.store.standby() {
            return Err(sense::WRITE_PROTECTED);
        }
        if cmd.data.len() < len {
            return Err(sense::INVALID_FIELD_IN_IU);
        }
        Ok(())
    }

    /// WRITE(6/10/12/16). The hot path: one `Change`, the CAW lock shared,
    /// one store write; with FUA a flush once the `Change` is let go.
    pub(super) fn write(
        &self,
        cmd: &mut Cmd,
        lba: u64,
        n: u64,
        fua: bool,
        flags: Option<()>,
    ) -> Outcome {
        if flags.is_some() {
            Self::no_protection(cmd.cdb)?;
        }
        let (off, len) = self.transfer(cmd.cdb, lba, n)?;
        cmd.expected_out = len;
        if self.cfg.read_only || self.store.standby() {
            return Err(sense::WRITE_PROTECTED);
        }
        // Less Data-Out than the CDB asks for (an expected data transfer
        // length below it): what came is written, the rest of the range
        // is left alone and the iSCSI layer reports the residual (FCP-4's
        // first choice, which libiscsi's residual tests expect).
        let data = &cmd.data[..len.min(cmd.data.len())];
        if !data.is_empty() {
            let change = self.store.change();
            let _caw = self.caw.read();
            change
                .write(off, data)
                .map_err(|e| sense::from_store(&e, true))?;
        }
        if fua {
            self.flush()?;
        }
        Ok(Reply::good(Vec::new(), 0))
    }

    pub(super) fn flush(&self) -> Result<(), Sense> {
        self.store.flush().map_err(|e| sense::from_store(&e, true))
    }

    /// WRITE AND VERIFY(10/12/16): the write is the verification (the
    /// medium is memory: what was written reads back).
    pub(super) fn write_verify(&self, cmd: &mut Cmd, lba: u64, n: u64) -> Outcome {
        // BYTCHK is bit 1; bit 2 (SBC-4's second BYTCHK bit) is reserved here.
        if cmd.cdb[1] & 0x04 != 0 {
            return Err(invalid_cdb(1, Some(2)));
        }
        self.write(cmd, lba, n, false, Some(()))
    }

    /// VERIFY(10/12/16): BYTCHK 00 checks the medium (always readable),
    /// 01 compares the Data-Out with the blocks, 11 compares one block of
    /// Data-Out with each block.
    pub(super) fn verify(&self, cmd: &mut Cmd, lba: u64, n: u64) -> Outcome {
        Self::no_protection(cmd.cdb)?;
        let bytchk = (cmd.cdb[1] >> 1) & 0x03;
        let (off, len) = match bytchk {
            0 => {
                self.check_range(lba, n)?;
                return Ok(Reply::good(Vec::new(), 0));
            }
            1 | 3 => self.transfer(cmd.cdb, lba, n)?,
            _ => return Err(invalid_cdb(1, Some(2))),
        };
        let want = if bytchk == 1 {
            len
        } else {
            self.block_size() as usize
        };
        cmd.expected_out = if n == 0 { 0 } else { want };
        if len == 0 {
            return Ok(Reply::good(Vec::new(), 0));
        }
        if cmd.data.len() < want {
            return Err(sense::INVALID_FIELD_IN_IU);
        }
        let mut cur = vec![0u8; len];
        self.store
            .read(off, &mut cur)
            .map_err(|e| sense::from_store(&e, false))?;
        let expected = &cmd.data[..want];
        for (i, block) in cur.chunks(want).enumerate() {
            if let Some(j) = first_difference(block, expected) {
                return Err(sense::miscompare(i * want + j));
            }
        }
        Ok(Reply::good(Vec::new(), 0))
    }

    /// WRITE SAME(10/16): one block (or none, with NDOB) over `n` blocks,
    /// `n` = 0 meaning to the end of the disk. With UNMAP the range is
    /// deallocated (it reads zeros: LBPRZ); a zero block without UNMAP
    /// becomes allocated zeros.
    pub(super) fn write_same(&self, cmd: &mut Cmd, lba: u64, mut n: u64) -> Outcome {
        let c = cmd.cdb;
        Self::no_protection(c)?;
        if c[1] & 0x10 != 0 {
            // ANCHOR: anchored blocks are not supported (ANC_SUP=0).
            return Err(invalid_cdb(1, Some(4)));
        }
        if c[1] & 0x06 != 0 {
            // PBDATA, LBDATA: obsolete, not supported.
            return Err(invalid_cdb(1, Some(2)));
        }
        let ndob = c[1] & 0x01 != 0;
        if ndob && c[0] == 0x41 {
            return Err(invalid_cdb(1, Some(0)));
        }
        let unmap = c[1] & 0x08 != 0;
        if n == 0 {
            n = self
                .blocks
                .checked_sub(lba)
                .ok_or(sense::LBA_OUT_OF_RANGE)?;
        }
        if n << self.shift > MAX_WRITE_SAME_BYTES {
            return Err(invalid_cdb(length_byte(c[0]), None));
        }
        let (off, len) = self.check_range(lba, n)?;
        let bs = self.block_size() as usize;
        let want = if ndob { 0 } else { bs };
        self.writable(cmd, want)?;
        if cmd.data.len() != want {
            return Err(sense::INVALID_FIELD_IN_IU);
        }
        let block = &cmd.data[..want];
        let change = self.store.change();
        let _caw = self.caw.read();
        // UNMAP deallocates whatever the block holds: unmapped blocks read
        // zeros (LBPRZ), which is what initiators then expect.
        let r = if unmap {
            change.trim(off, len)
        } else if block.iter().all(|&b| b == 0) {
            change.zero(off, len, false)
        } else {
            let chunk = len.min(PATTERN_BYTES) as usize;
            let pattern: Vec<u8> = block.iter().copied().cycle().take(chunk).collect();
            let mut done = 0u64;
            let mut r = Ok(());
            while done < len && r.is_ok() {
                let step = (len - done).min(chunk as u64) as usize;
                r = change.write(off + done, &pattern[..step]);
                done += step as u64;
            }
            r
        };
        r.map_err(|e| sense::from_store(&e, true))?;
        Ok(Reply::good(Vec::new(), 0))
    }

    /// UNMAP: a parameter list of (LBA, count) descriptors, all checked
    /// before any is deallocated.
    pub(super) fn unmap(&self, cmd: &mut Cmd) -> Outcome {
        let c = cmd.cdb;
        if c[1] & 0x01 != 0 {
            // ANCHOR.
            return Err(invalid_cdb(1, Some(0)));
        }
        let plen = usize::from(be16(&c[7..]));
        if plen == 0 {
            return Ok(Reply::good(Vec::new(), 0));
        }
        if plen < 8 {
            cmd.expected_out = plen;
            return Err(sense::PARAM_LIST_LENGTH);
        }
        self.writable(cmd, plen)?;
        let p = &cmd.data[..plen];
        let bd_len = usize::from(be16(&p[2..]));
        let count = bd_len.min(plen - 8) / 16;
        if count > MAX_UNMAP_DESCRIPTORS as usize {
            return Err(invalid_param(2));
        }
        let mut total = 0u64;
        for i in 0..count {
            let d = &p[8 + 16 * i..];
            let (lba, n) = (be64(d), u64::from(be32(&d[8..])));
            self.check_range(lba, n)?;
            total += n;
            if total > u64::from(MAX_UNMAP_BLOCKS) {
                return Err(invalid_param(8 + 16 * i as u16 + 8));
            }
        }
        let change = self.store.change();
        let _caw = self.caw.read();
        for i in 0..count {
            let d = &p[8 + 16 * i..];
            let (off, len) = self.check_range(be64(d), u64::from(be32(&d[8..])))?;
            if len > 0 {
                change
                    .trim(off, len)
                    .map_err(|e| sense::from_store(&e, true))?;
            }
        }
        Ok(Reply::good(Vec::new(), 0))
    }

    /// COMPARE AND WRITE: compares the first half of the Data-Out with the
    /// blocks and, if equal, writes the second half, with every other
    /// write to the LUN kept out in between (see [`Lun::caw`]).
    pub(super) fn compare_and_write(&self, cmd: &mut Cmd) -> Outcome {
        let c = cmd.cdb;
        Self::no_protection(c)?;
        let fua = c[1] & 0x08 != 0;
        let n = c[13];
        if n > MAX_COMPARE_AND_WRITE {
            return Err(invalid_cdb(13, None));
        }
        let (off, len) = self.check_range(be64(&c[2..]), u64::from(n))?;
        let len = len as usize;
        self.writable(cmd, 2 * len)?;
        if n == 0 {
            // Nothing to compare; Data-Out with it means the initiator
            // meant more blocks than the one-byte field holds.
            if !cmd.data.is_empty() {
                return Err(invalid_cdb(13, None));
            }
            return Ok(Reply::good(Vec::new(), 0));
        }
        if cmd.data.len() != 2 * len {
            return Err(sense::INVALID_FIELD_IN_IU);
        }
        let (verify, write) = cmd.data.split_at(len);
        {
            let change = self.store.change();
            let _caw = self.caw.write();
            let mut cur = vec![0u8; len];
            self.store
                .read(off, &mut cur)
                .map_err(|e| sense::from_store(&e, false))?;
            if let Some(i) = first_difference(&cur, verify) {
                return Err(sense::miscompare(i));
            }
            change
                .write(off, write)
                .map_err(|e| sense::from_store(&e, true))?;
        }
        if fua {
            self.flush()?;
        }
        Ok(Reply::good(Vec::new(), 0))
    }

    /// READ CAPACITY(10): the last LBA, or FFFFFFFFh when it does not fit.
    pub(super) fn read_capacity10(&self, c: &[u8]) -> Outcome {
        if c[8] & 0x01 == 0 && be32(&c[2..]) != 0 {
            // The LOGICAL BLOCK ADDRESS needs PMI.
            return Err(invalid_cdb(2, None));
        }
        let last = self.blocks.saturating_sub(1).min(0xFFFF_FFFF) as u32;
        let mut d = Vec::with_capacity(8);
        d.extend_from_slice(&last.to_be_bytes());
        d.extend_from_slice(&(self.block_size() as u32).to_be_bytes());
        Ok(Reply::good(d, 8))
    }

    /// READ CAPACITY(16): thin (LBPME) and unmapped blocks read zeros
    /// (LBPRZ). One logical block per physical block: the store's 4 KiB
    /// page shows as the granularities of page B0h instead, since GET LBA
    /// STATUS answers per logical block (libiscsi's GET LBA STATUS tests
    /// assume descriptors aligned to physical blocks).
    pub(super) fn read_capacity16(&self, c: &[u8]) -> Outcome {
        let mut d = vec![0u8; 32];
        d[..8].copy_from_slice(&self.blocks.saturating_sub(1).to_be_bytes());
        d[8..12].copy_from_slice(&(self.block_size() as u32).to_be_bytes());
        d[14] = 0x80 | 0x40;
        Ok(Reply::good(d, be32(&c[10..]) as usize))
    }

    /// GET LBA STATUS: the store's holes are deallocated, its zero and
    /// data pages mapped.
    pub(super) fn get_lba_status(&self, c: &[u8]) -> Outcome {
        let lba = be64(&c[2..]);
        let alloc = be32(&c[10..]) as usize;
        if lba >= self.blocks {
            return Err(sense::LBA_OUT_OF_RANGE);
        }
        let max = (alloc.saturating_sub(8) / 16).clamp(1, 1024);
        let n = (self.blocks - lba).min(LBA_STATUS_SCAN_BYTES >> self.shift);
        let (off, len) = self.check_range(lba, n)?;
        let extents = self
            .store
            .extents(off, len, max)
            .map_err(|e| sense::from_store(&e, false))?;
        // (first LBA, blocks, provisioning status), Zero and Data merged.
        let mut runs: Vec<(u64, u64, u8)> = Vec::new();
        let mut at = lba;
        for e in extents {
            let status = u8::from(e.kind == ExtentKind::Hole);
            let blocks = e.length >> self.shift;
            match runs.last_mut() {
                Some(last) if last.2 == status => last.1 += blocks,
                _ => runs.push((at, blocks, status)),
            }
            at += blocks;
        }
        let mut d = Vec::with_capacity(8 + 16 * runs.len());
        d.extend_from_slice(&((4 + 16 * runs.len()) as u32).to_be_bytes());
        d.extend_from_slice(&[0; 4]);
        for (first, blocks, status) in runs {
            d.extend_from_slice(&first.to_be_bytes());
            d.extend_from_slice(&(blocks.min(u64::from(u32::MAX)) as u32).to_be_bytes());
            d.extend_from_slice(&[status, 0, 0, 0]);
        }
        Ok(Reply::good(d, alloc))
    }
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        return None;
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}
