//! The logical unit from annotated CDB bytes: what goes in, what status,
//! sense and data come out.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ramd_store::{Store, StoreConfig};

use super::*;

const MIB: u64 = 1 << 20;

fn store(size: u64, max_memory: Option<u64>) -> Arc<Store> {
    let mut cfg = StoreConfig::new(size);
    cfg.host_reserve = 0;
    cfg.warm_pool = 0;
    cfg.max_memory = max_memory;
    Arc::new(Store::new(cfg).unwrap())
}

fn config(block_size: u32) -> LunConfig {
    LunConfig {
        block_size,
        read_only: false,
        id: 0x0123_4567_89AB_CDEF,
        serial: "disk0".into(),
        product: "ramd disk".into(),
        write_cache: false,
    }
}

fn lun(block_size: u32) -> Lun {
    Lun::new(store(4 * MIB, None), config(block_size))
}

fn nexus(name: &str) -> Nexus {
    Nexus {
        initiator_port: format!("iqn.2026-11.test:{name},i,0x00023d000001"),
        target_port_id: 1,
    }
}

fn run(lun: &Lun, cdb: &[u8], data: &[u8]) -> Reply {
    lun.execute(&nexus("a"), cdb, data)
}

fn good(r: &Reply) {
    assert_eq!(r.status, status::GOOD, "sense {:02x?}", r.sense);
}

/// CHECK CONDITION with this sense key, ASC and ASCQ.
fn check(r: &Reply, key: u8, asc: u8, ascq: u8) {
    assert_eq!(r.status, status::CHECK_CONDITION, "{r:?}");
    assert_eq!(
        (r.sense[2], r.sense[12], r.sense[13]),
        (key, asc, ascq),
        "{:02x?}",
        r.sense
    );
}

fn invalid_field(r: &Reply, byte: u16) {
    check(r, 0x05, 0x24, 0x00);
    assert_eq!(r.sense[15] & 0xC0, 0xC0, "SKSV and C/D");
    assert_eq!(u16::from_be_bytes([r.sense[16], r.sense[17]]), byte);
}

fn write10(lba: u32, blocks: u16) -> [u8; 10] {
    let l = lba.to_be_bytes();
    let n = blocks.to_be_bytes();
    [0x2A, 0, l[0], l[1], l[2], l[3], 0, n[0], n[1], 0]
}

fn read10(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = write10(lba, blocks);
    c[0] = 0x28;
    c
}

fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x88;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

#[test]
fn standard_inquiry() {
    let l = lun(512);
    // INQUIRY, EVPD 0, page 0, allocation length 255.
    let r = run(&l, &[0x12, 0x00, 0x00, 0x00, 0xFF, 0x00], &[]);
    good(&r);
    let d = &r.data_in;
    assert_eq!(d.len(), 96);
    assert_eq!(d[0], 0x00, "qualifier 0, direct access");
    assert_eq!(d[2], 0x06, "SPC-4");
    assert_eq!(d[3] & 0x0F, 0x02, "response data format 2");
    assert_eq!(usize::from(d[4]), d.len() - 5, "additional length");
    assert_eq!(d[7] & 0x02, 0x02, "CMDQUE");
    assert_eq!(&d[8..16], b"RAMD    ");
    assert_eq!(&d[16..32], b"ramd disk       ");
    assert_eq!(&d[58..60], &[0x00, 0xA0], "SAM-5");
    assert_eq!(&d[64..66], &[0x04, 0xC0], "SBC-3");
    // Allocation length 5: cut.
    let r = run(&l, &[0x12, 0x00, 0x00, 0x00, 0x05, 0x00], &[]);
    assert_eq!(r.data_in.len(), 5);
    // EVPD 0 with a page code: INVALID FIELD IN CDB, byte 2.
    let r = run(&l, &[0x12, 0x00, 0x80, 0x00, 0xFF, 0x00], &[]);
    invalid_field(&r, 2);
    // An unknown VPD page.
    let r = run(&l, &[0x12, 0x01, 0xC7, 0x00, 0xFF, 0x00], &[]);
    invalid_field(&r, 2);
}

#[test]
fn vital_product_data() {
    let l = lun(4096);
    let vpd = |page: u8| {
        let r = run(&l, &[0x12, 0x01, page, 0x01, 0x00, 0x00], &[]);
        good(&r);
        assert_eq!(r.data_in[1], page);
        assert_eq!(usize::from(be16(&r.data_in[2..])), r.data_in.len() - 4);
        r.data_in
    };
    assert_eq!(&vpd(0x00)[4..], &[0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2]);
    assert_eq!(&vpd(0x80)[4..], b"disk0");
    let id = vpd(0x83);
    // NAA locally assigned, from the id: the same on every run.
    assert_eq!(&id[4..8], &[0x01, 0x03, 0x00, 0x08]);
    assert_eq!(
        &id[8..16],
        &[0x31, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF]
    );
    // T10 vendor id, then the relative target port (1).
    assert_eq!(&id[16..20], &[0x02, 0x01, 0x00, 24]);
    assert_eq!(&id[20..28], b"RAMD    ");
    assert_eq!(&id[44..52], &[0x51, 0x94, 0, 4, 0, 0, 0, 1]);
    let bl = vpd(0xB0);
    assert_eq!(bl.len(), 64);
    assert_eq!(bl[5], MAX_COMPARE_AND_WRITE);
    assert_eq!(be16(&bl[6..]), 1, "granularity: one 4 KiB block");
    assert_eq!(be32(&bl[8..]), (MAX_TRANSFER_BYTES / 4096) as u32);
    assert_eq!(be32(&bl[20..]), MAX_UNMAP_BLOCKS);
    assert_eq!(be32(&bl[24..]), MAX_UNMAP_DESCRIPTORS);
    assert_eq!(be64(&bl[36..]), MAX_WRITE_SAME_BYTES / 4096);
    assert_eq!(be16(&vpd(0xB1)[4..]), 1, "non-rotating");
    assert_eq!(&vpd(0xB2)[4..8], &[0x00, 0xE4, 0x02, 0x00]);
}

#[test]
fn read_capacity_at_both_block_sizes() {
    for bs in [512u32, 4096] {
        let l = lun(bs);
        let blocks = 4 * MIB / u64::from(bs);
        // READ CAPACITY(10).
        let r = run(&l, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
        good(&r);
        assert_eq!(be32(&r.data_in) as u64, blocks - 1);
        assert_eq!(be32(&r.data_in[4..]), bs);
        // READ CAPACITY(16), allocation length 32.
        let r = run(
            &l,
            &[0x9E, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
            &[],
        );
        good(&r);
        assert_eq!(be64(&r.data_in), blocks - 1);
        assert_eq!(be32(&r.data_in[8..]), bs);
        assert_eq!(r.data_in[13], 0, "one logical block per physical block");
        assert_eq!(r.data_in[14] & 0xC0, 0xC0, "LBPME, LBPRZ");
        // A LOGICAL BLOCK ADDRESS without PMI.
        let r = run(&l, &[0x25, 0, 0, 0, 0, 1, 0, 0, 0, 0], &[]);
        invalid_field(&r, 2);
    }
    // Past 2^32 blocks READ CAPACITY(10) says FFFFFFFFh.
    let l = Lun::new(store(4 << 40, None), config(512));
    let r = run(&l, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(&r.data_in[..4], &[0xFF; 4]);
}

#[test]
fn write_and_read_back_at_both_block_sizes() {
    for bs in [512usize, 4096] {
        let l = lun(bs as u32);
        let data: Vec<u8> = (0..3 * bs).map(|i| (i % 251) as u8).collect();
        let r = run(&l, &write10(5, 3), &data);
        good(&r);
        assert_eq!(r.expected_out, 3 * bs);
        let r = run(&l, &read10(5, 3), &[]);
        good(&r);
        assert_eq!(r.data_in, data);
        let r = run(&l, &read16(6, 1), &[]);
        assert_eq!(r.data_in, &data[bs..2 * bs]);
        // READ(12) and WRITE(12) with FUA and DPO.
        let w12 = [0xAA, 0x18, 0, 0, 0, 9, 0, 0, 0, 1, 0, 0];
        good(&run(&l, &w12, &data[..bs]));
        let r = run(&l, &[0xA8, 0x10, 0, 0, 0, 9, 0, 0, 0, 1, 0, 0], &[]);
        assert_eq!(r.data_in, &data[..bs]);
        // READ(6): LBA 5, transfer length 0 means 256 blocks.
        let r = run(&l, &[0x08, 0x00, 0x00, 0x05, 0x00, 0x00], &[]);
        good(&r);
        assert_eq!(r.data_in.len(), 256 * bs);
        assert_eq!(&r.data_in[..3 * bs], &data[..]);
        // WRITE(6) of one block at LBA 1.
        good(&run(&l, &[0x0A, 0x00, 0x00, 0x01, 0x01, 0x00], &data[..bs]));
        // Zero blocks: nothing moves.
        let r = run(&l, &read10(0, 0), &[]);
        good(&r);
        assert!(r.data_in.is_empty());
    }
}

#[test]
fn out_of_range_and_bad_cdbs_are_refused() {
    let l = lun(512);
    let last = (4 * MIB / 512 - 1) as u32;
    good(&run(&l, &read10(last, 1), &[]));
    // Two blocks from the last LBA: LBA OUT OF RANGE.
    check(&run(&l, &read10(last, 2), &[]), 0x05, 0x21, 0x00);
    // Zero blocks one past the end, and at LBA 2^64-1 (no overflow).
    check(&run(&l, &read10(last + 2, 0), &[]), 0x05, 0x21, 0x00);
    check(&run(&l, &read16(u64::MAX, 2), &[]), 0x05, 0x21, 0x00);
    check(&run(&l, &write10(last, 2), &[0; 1024]), 0x05, 0x21, 0x00);
    // More than the maximum transfer: INVALID FIELD IN CDB at the length.
    let big = Lun::new(store(64 * MIB, None), config(512));
    invalid_field(&run(&big, &read16(0, 0x1_0001), &[]), 10);
    // RDPROTECT: no protection information.
    let mut c = read10(0, 1);
    c[1] = 0x20;
    invalid_field(&run(&l, &c, &[]), 1);
    // An unknown opcode, an empty and a short CDB, NACA.
    check(&run(&l, &[0xFF; 16], &[]), 0x05, 0x20, 0x00);
    check(&run(&l, &[], &[]), 0x05, 0x20, 0x00);
    check(&run(&l, &[0x28, 0, 0], &[]), 0x05, 0x24, 0x00);
    invalid_field(&run(&l, &[0x00, 0, 0, 0, 0, 0x04], &[]), 5);
    // An unknown service action of SERVICE ACTION IN(16).
    invalid_field(
        &run(
            &l,
            &[0x9E, 0x1F, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            &[],
        ),
        1,
    );
    // Every single-byte opcode with a zeroed CDB and some data: no panic.
    for op in 0..=255u8 {
        let mut c = [0u8; 16];
        c[0] = op;
        let r = run(&l, &c, &[0x5A; 600]);
        assert!(
            matches!(r.status, status::GOOD | status::CHECK_CONDITION),
            "{op:#x}"
        );
    }
}

#[test]
fn a_short_data_out_writes_what_came() {
    let l = lun(512);
    good(&run(&l, &write10(0, 2), &[b'a'; 1024]));
    // Two blocks called for, 200 bytes sent: those are written.
    let r = run(&l, &write10(0, 2), &[b'b'; 200]);
    good(&r);
    assert_eq!(r.expected_out, 1024, "for the residual");
    let d = run(&l, &read10(0, 2), &[]).data_in;
    assert_eq!(&d[..200], &[b'b'; 200]);
    assert_eq!(&d[200..], &[b'a'; 824]);
    // None sent: nothing written.
    good(&run(&l, &write10(0, 2), &[]));
    // UNMAP with a short parameter list is refused.
    let r = run(&l, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &[0; 8]);
    check(&r, 0x05, 0x0E, 0x03);
    assert_eq!(r.expected_out, 24);
    good(&run(&l, &write10(0, 2), &[b'a'; 1024]));
    // More than called for: the rest is ignored.
    good(&run(&l, &write10(0, 1), &[b'c'; 10000]));
    let d = run(&l, &read10(0, 2), &[]).data_in;
    assert_eq!(&d[..512], &[b'c'; 512]);
    assert_eq!(&d[512..], &[b'a'; 512]);
}

#[test]
fn read_only_disk_is_write_protected() {
    let mut cfg = config(512);
    cfg.read_only = true;
    let l = Lun::new(store(4 * MIB, None), cfg);
    good(&run(&l, &read10(0, 1), &[]));
    check(&run(&l, &write10(0, 1), &[1; 512]), 0x07, 0x27, 0x00);
    // WRITE SAME(16) with UNMAP, UNMAP.
    let ws = [0x93, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0];
    check(&run(&l, &ws, &[0; 512]), 0x07, 0x27, 0x00);
    let mut list = vec![0, 22, 0, 16, 0, 0, 0, 0];
    list.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0]);
    check(
        &run(&l, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &list),
        0x07,
        0x27,
        0x00,
    );
    // MODE SENSE(6) sets WP in the device-specific parameter.
    let r = run(&l, &[0x1A, 0x08, 0x3F, 0x00, 0xFF, 0x00], &[]);
    good(&r);
    assert_eq!(r.data_in[2] & 0x80, 0x80);
}

#[test]
fn a_full_disk_reports_space_allocation_failed() {
    // 64 MiB disk, memory for a few MiB of pages.
    let l = Lun::new(store(64 * MIB, Some(4 * MIB)), config(4096));
    let data: Vec<u8> = (0..MIB as usize).map(|i| (i % 199 + 1) as u8).collect();
    let mut full = None;
    for i in 0..64u32 {
        let r = run(&l, &write10(i * 256, 256), &data);
        if r.status != status::GOOD {
            full = Some(r);
            break;
        }
    }
    let r = full.expect("the budget ran out");
    // DATA PROTECT, SPACE ALLOCATION FAILED WRITE PROTECT.
    check(&r, 0x07, 0x27, 0x07);
    // Unmapping gives room back: writes work again.
    let ws = [0x93, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x40, 0, 0, 0];
    good(&run(&l, &ws, &[0; 4096]));
    good(&run(&l, &write10(0, 256), &data));
}

#[test]
fn write_same_unmap_and_lba_status() {
    for bs in [512usize, 4096] {
        let l = lun(bs as u32);
        let per_page = 4096 / bs;
        good(&run(
            &l,
            &write10(0, (64 * per_page) as u16),
            &vec![7; 64 * 4096],
        ));
        // GET LBA STATUS from LBA 0, allocation length 24: one mapped run.
        let gls = |lba: u64| {
            let mut c = [0u8; 16];
            c[0] = 0x9E;
            c[1] = 0x12;
            c[2..10].copy_from_slice(&lba.to_be_bytes());
            c[13] = 255;
            let r = run(&l, &c, &[]);
            good(&r);
            let d = r.data_in;
            let n = (be32(&d) as usize - 4) / 16;
            (0..n)
                .map(|i| {
                    let e = &d[8 + 16 * i..];
                    (be64(e), be32(&e[8..]), e[12])
                })
                .collect::<Vec<_>>()
        };
        let total = (4 * MIB) as u32 / bs as u32;
        let mapped = (64 * per_page) as u32;
        assert_eq!(
            gls(0),
            vec![(0, mapped, 0), (u64::from(mapped), total - mapped, 1)]
        );
        // WRITE SAME(10), UNMAP, zero block, pages 8..16: deallocated.
        let (lba, n) = ((8 * per_page) as u32, (8 * per_page) as u16);
        let l4 = lba.to_be_bytes();
        let n2 = n.to_be_bytes();
        let ws10 = [0x41, 0x08, l4[0], l4[1], l4[2], l4[3], 0, n2[0], n2[1], 0];
        good(&run(&l, &ws10, &vec![0; bs]));
        let s = gls(0);
        assert_eq!(s[0], (0, lba, 0));
        assert_eq!(s[1], (u64::from(lba), u32::from(n), 1));
        assert_eq!(run(&l, &read10(lba, n), &[]).data_in, vec![0; 8 * 4096]);
        // A pattern: every block the same.
        let mut plain = ws10;
        plain[1] = 0;
        let block: Vec<u8> = (0..bs).map(|i| i as u8 | 1).collect();
        good(&run(&l, &plain, &block));
        assert_eq!(
            run(&l, &read10(lba, n), &[]).data_in,
            block.repeat(n as usize)
        );
        // With UNMAP the blocks are deallocated whatever the data block holds.
        good(&run(&l, &ws10, &block));
        assert_eq!(gls(u64::from(lba))[0], (u64::from(lba), u32::from(n), 1));
        assert_eq!(run(&l, &read10(lba, n), &[]).data_in, vec![0; 8 * 4096]);
        // Zero blocks without UNMAP stay mapped.
        good(&run(&l, &plain, &vec![0; bs]));
        assert_eq!(gls(u64::from(lba))[0], (u64::from(lba), mapped - lba, 0));
        // Data-Out of the wrong size, ANCHOR, WRITE SAME(16) with NDOB.
        check(&run(&l, &ws10, &vec![0; 2 * bs]), 0x05, 0x0E, 0x03);
        let mut anchor = ws10;
        anchor[1] = 0x18;
        invalid_field(&run(&l, &anchor, &vec![0; bs]), 1);
        let ndob = [0x93, 0x09, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0];
        let r = run(&l, &ndob, &[]);
        good(&r);
        assert_eq!(r.expected_out, 0);
        // Zero blocks means to the end of the disk; past the end: out of range.
        let to_end = [0x93, 0x08, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0];
        good(&run(&l, &to_end, &vec![0; bs]));
        let mut past = to_end;
        past[2..10].copy_from_slice(&u64::from(total + 1).to_be_bytes());
        check(&run(&l, &past, &vec![0; bs]), 0x05, 0x21, 0x00);
    }
}

#[test]
fn unmap_parameter_lists() {
    let l = lun(4096);
    good(&run(&l, &write10(0, 16), &[9; 16 * 4096]));
    // UNMAP data length 22, block descriptor data length 16: LBA 2, 3 blocks.
    let list = [
        0x00, 0x16, 0x00, 0x10, 0, 0, 0, 0, // header
        0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 0, // descriptor
    ];
    let unmap = |len: u8, data: &[u8]| run(&l, &[0x42, 0, 0, 0, 0, 0, 0, 0, len, 0], data);
    let r = unmap(24, &list);
    good(&r);
    assert_eq!(r.expected_out, 24);
    let d = run(&l, &read10(0, 6), &[]).data_in;
    assert_eq!(&d[..2 * 4096], &[9; 2 * 4096][..]);
    assert_eq!(&d[2 * 4096..5 * 4096], &[0; 3 * 4096][..]);
    assert_eq!(&d[5 * 4096..], &[9; 4096][..]);
    // A parameter list length of 0 does nothing; 1 to 7 is an error.
    good(&unmap(0, &[]));
    check(&unmap(4, &list[..4]), 0x05, 0x1A, 0x00);
    // A descriptor past the end: LBA OUT OF RANGE.
    let mut bad = list;
    bad[8..16].copy_from_slice(&1023u64.to_be_bytes());
    check(&unmap(24, &bad), 0x05, 0x21, 0x00);
    // ANCHOR.
    invalid_field(&run(&l, &[0x42, 1, 0, 0, 0, 0, 0, 0, 24, 0], &list), 1);
    // Too many descriptors: INVALID FIELD IN PARAMETER LIST.
    let n = MAX_UNMAP_DESCRIPTORS as usize + 1;
    let mut many = vec![0u8; 8 + 16 * n];
    many[2..4].copy_from_slice(&((16 * n) as u16).to_be_bytes());
    let r = run(
        &l,
        &[
            0x42,
            0,
            0,
            0,
            0,
            0,
            0,
            (many.len() >> 8) as u8,
            many.len() as u8,
            0,
        ],
        &many,
    );
    check(&r, 0x05, 0x26, 0x00);
}

#[test]
fn verify_compares_and_reports_the_offset() {
    let l = lun(512);
    let data: Vec<u8> = (0..1024).map(|i| (i % 7) as u8).collect();
    good(&run(&l, &write10(10, 2), &data));
    // VERIFY(10), BYTCHK 01b: compare two blocks.
    let v = [0x2F, 0x02, 0, 0, 0, 10, 0, 0, 2, 0];
    let r = run(&l, &v, &data);
    good(&r);
    assert_eq!(r.expected_out, 1024);
    let mut other = data.clone();
    other[700] ^= 0xFF;
    let r = run(&l, &v, &other);
    // MISCOMPARE, MISCOMPARE DURING VERIFY OPERATION, INFORMATION = 700.
    check(&r, 0x0E, 0x1D, 0x00);
    assert_eq!(r.sense[0], 0xF0, "VALID");
    assert_eq!(be32(&r.sense[3..]), 700);
    // BYTCHK 00b: no data, no compare.
    let r = run(&l, &[0x2F, 0, 0, 0, 0, 10, 0, 0, 2, 0], &[]);
    good(&r);
    assert_eq!(r.expected_out, 0);
    // VERIFY(16) out of range; VERIFY(12) with BYTCHK 10b (reserved).
    let mut v16 = [0u8; 16];
    v16[0] = 0x8F;
    v16[2..10].copy_from_slice(&8192u64.to_be_bytes());
    v16[13] = 1;
    check(&run(&l, &v16, &[]), 0x05, 0x21, 0x00);
    invalid_field(
        &run(&l, &[0xAF, 0x04, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0], &[]),
        1,
    );
    // WRITE AND VERIFY(16) writes.
    let mut wv = [0u8; 16];
    wv[0] = 0x8E;
    wv[1] = 0x02;
    wv[13] = 1;
    good(&run(&l, &wv, &[3; 512]));
    assert_eq!(run(&l, &read10(0, 1), &[]).data_in, vec![3; 512]);
}

fn caw(lba: u64, old: &[u8], new: &[u8]) -> ([u8; 16], Vec<u8>) {
    let mut c = [0u8; 16];
    c[0] = 0x89;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[13] = (old.len() / 512) as u8;
    (c, [old, new].concat())
}

#[test]
fn compare_and_write() {
    let l = lun(512);
    good(&run(&l, &write10(3, 1), &[1; 512]));
    let (c, d) = caw(3, &[1; 512], &[2; 512]);
    let r = run(&l, &c, &d);
    good(&r);
    assert_eq!(r.expected_out, 1024);
    assert_eq!(run(&l, &read10(3, 1), &[]).data_in, vec![2; 512]);
    // The block no longer matches: MISCOMPARE at byte 0, nothing written.
    let r = run(&l, &c, &d);
    check(&r, 0x0E, 0x1D, 0x00);
    assert_eq!(be32(&r.sense[3..]), 0);
    assert_eq!(run(&l, &read10(3, 1), &[]).data_in, vec![2; 512]);
    // Data-Out of the wrong size.
    check(
        &run(&l, &c, &d[..1536.min(d.len()) - 512]),
        0x05,
        0x0E,
        0x03,
    );
    check(
        &run(&l, &c, &[d.clone(), d.clone()].concat()),
        0x05,
        0x0E,
        0x03,
    );
    // No blocks: nothing to do, unless Data-Out came with it.
    let mut none = c;
    none[13] = 0;
    good(&run(&l, &none, &[]));
    invalid_field(&run(&l, &none, &d), 13);
    // More blocks than MAXIMUM COMPARE AND WRITE LENGTH.
    let mut many = c;
    many[13] = MAX_COMPARE_AND_WRITE + 1;
    invalid_field(&run(&l, &many, &[]), 13);
}

#[test]
fn compare_and_write_is_atomic_against_other_writes() {
    // Two threads add one to a counter in block 0 with COMPARE AND WRITE,
    // retrying on miscompare; a third hammers block 1 (the same 4 KiB page)
    // with WRITE. No increment may be lost.
    let l = Arc::new(lun(512));
    let block = |v: u64| {
        let mut b = vec![0u8; 512];
        b[..8].copy_from_slice(&v.to_be_bytes());
        b
    };
    good(&run(&l, &write10(0, 1), &block(0)));
    const EACH: u64 = 300;
    let done = Arc::new(AtomicUsize::new(0));
    let adders: Vec<_> = (0..2)
        .map(|t| {
            let l = l.clone();
            let done = done.clone();
            std::thread::spawn(move || {
                let me = nexus(&format!("t{t}"));
                let mut added = 0;
                while added < EACH {
                    let cur = l.execute(&me, &read10(0, 1), &[]).data_in;
                    let v = be64(&cur);
                    let (c, d) = caw(0, &cur, &block(v + 1));
                    let r = l.execute(&me, &c, &d);
                    match r.status {
                        status::GOOD => added += 1,
                        _ => assert_eq!(r.sense[2], 0x0E, "only miscompares"),
                    }
                }
                done.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    let writer = {
        let l = l.clone();
        let done = done.clone();
        std::thread::spawn(move || {
            let me = nexus("w");
            let mut i = 0u8;
            while done.load(Ordering::SeqCst) < 2 {
                i = i.wrapping_add(1);
                good(&l.execute(&me, &write10(1, 1), &[i; 512]));
            }
            i
        })
    };
    for a in adders {
        a.join().unwrap();
    }
    let last = writer.join().unwrap();
    assert_eq!(be64(&run(&l, &read10(0, 1), &[]).data_in), 2 * EACH);
    assert_eq!(run(&l, &read10(1, 1), &[]).data_in, vec![last; 512]);
}

#[test]
fn synchronize_cache_and_fua_flush_the_store() {
    let s = store(4 * MIB, None);
    let flushes = Arc::new(AtomicUsize::new(0));
    let f = flushes.clone();
    s.set_flush_hook(Box::new(move || {
        f.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }));
    let mut cfg = config(4096);
    cfg.write_cache = true;
    let l = Lun::new(s, cfg);
    // SYNCHRONIZE CACHE(10) of the whole disk, then (16).
    good(&run(&l, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]));
    good(&run(
        &l,
        &[0x91, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        &[],
    ));
    assert_eq!(flushes.load(Ordering::SeqCst), 2);
    // WRITE(10) with FUA flushes, without it does not.
    let mut w = write10(0, 1);
    good(&run(&l, &w, &[1; 4096]));
    assert_eq!(flushes.load(Ordering::SeqCst), 2);
    w[1] = 0x08;
    good(&run(&l, &w, &[1; 4096]));
    assert_eq!(flushes.load(Ordering::SeqCst), 3);
    // The caching page says WCE.
    let r = run(&l, &[0x1A, 0x08, 0x08, 0x00, 0xFF, 0x00], &[]);
    good(&r);
    assert_eq!(&r.data_in[4..6], &[0x08, 0x12]);
    assert_eq!(r.data_in[6] & 0x04, 0x04);
    // Out of range.
    check(
        &run(&l, &[0x35, 0, 0, 0, 4, 0, 0, 0, 1, 0], &[]),
        0x05,
        0x21,
        0x00,
    );
}

#[test]
fn mode_sense() {
    let l = lun(512);
    // MODE SENSE(6), all pages, current values, allocation length 255.
    let r = run(&l, &[0x1A, 0x00, 0x3F, 0x00, 0xFF, 0x00], &[]);
    good(&r);
    let d = &r.data_in;
    assert_eq!(usize::from(d[0]), d.len() - 1, "mode data length");
    assert_eq!(d[2], 0x10, "DPOFUA, not WP");
    assert_eq!(d[3], 8, "one short block descriptor");
    assert_eq!(be32(&d[4..]), 8192, "blocks");
    assert_eq!(be32(&d[8..]), 512, "block length");
    // Caching (8+20), control (12), informational exceptions (12).
    assert_eq!(d.len(), 4 + 8 + 20 + 12 + 12);
    assert_eq!((d[12], d[32], d[44]), (0x08, 0x0A, 0x1C));
    assert_eq!(d[13], 0x12);
    assert_eq!(d[14] & 0x04, 0, "no write cache without an image");
    // MODE SENSE(10), LLBAA, control page only.
    let r = run(&l, &[0x5A, 0x10, 0x0A, 0, 0, 0, 0, 0, 0xFF, 0], &[]);
    good(&r);
    let d = &r.data_in;
    assert_eq!(usize::from(be16(d)), d.len() - 2);
    assert_eq!(d[4] & 1, 1, "LONGLBA");
    assert_eq!(be16(&d[6..]), 16);
    assert_eq!(be64(&d[8..]), 8192);
    assert_eq!(&d[24..26], &[0x0A, 0x0A]);
    // DBD, changeable values: nothing changes.
    let r = run(&l, &[0x1A, 0x08, 0x48, 0x00, 0xFF, 0x00], &[]);
    good(&r);
    assert_eq!(r.data_in[3], 0);
    assert!(r.data_in[6..].iter().all(|&b| b == 0));
    // Truncated to the allocation length.
    assert_eq!(run(&l, &[0x1A, 0, 0x3F, 0, 4, 0], &[]).data_in.len(), 4);
    // Saved values, an unknown page, an unknown subpage.
    check(
        &run(&l, &[0x1A, 0, 0xC8, 0, 0xFF, 0], &[]),
        0x05,
        0x39,
        0x00,
    );
    invalid_field(&run(&l, &[0x1A, 0, 0x19, 0, 0xFF, 0], &[]), 2);
    invalid_field(&run(&l, &[0x1A, 0, 0x08, 0x01, 0xFF, 0], &[]), 3);
}

#[test]
fn report_supported_operation_codes() {
    let l = lun(512);
    // All commands, no timeouts.
    let r = run(
        &l,
        &[0xA3, 0x0C, 0x00, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0],
        &[],
    );
    good(&r);
    assert_eq!(be32(&r.data_in) as usize, 8 * opcodes::OPS.len());
    // With timeout descriptors (RCTD): 20 bytes each, CTDP set.
    let r = run(
        &l,
        &[0xA3, 0x0C, 0x80, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0],
        &[],
    );
    assert_eq!(be32(&r.data_in) as usize, 20 * opcodes::OPS.len());
    assert_eq!(r.data_in[4 + 5] & 0x02, 0x02);
    // One command: WRITE(10) is supported and takes DPO and FUA.
    let r = run(
        &l,
        &[0xA3, 0x0C, 0x01, 0x2A, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0],
        &[],
    );
    good(&r);
    assert_eq!(r.data_in[1] & 0x07, 0x03);
    assert_eq!(be16(&r.data_in[2..]), 10);
    assert_eq!(r.data_in[4], 0x2A);
    assert_eq!(r.data_in[5] & 0x18, 0x18);
    // Not supported (MODE SELECT(6)).
    let r = run(
        &l,
        &[0xA3, 0x0C, 0x01, 0x15, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0],
        &[],
    );
    assert_eq!(r.data_in[1] & 0x07, 0x01);
    // READ CAPACITY(16) by opcode alone: it has service actions.
    invalid_field(
        &run(
            &l,
            &[0xA3, 0x0C, 0x01, 0x9E, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0],
            &[],
        ),
        2,
    );
    let r = run(
        &l,
        &[0xA3, 0x0C, 0x02, 0x9E, 0, 0x10, 0, 0, 0xFF, 0xFF, 0, 0],
        &[],
    );
    assert_eq!(r.data_in[1] & 0x07, 0x03);
    assert_eq!(be16(&r.data_in[2..]), 16);
}

#[test]
fn request_sense_tur_start_stop_prefetch() {
    let l = lun(512);
    good(&run(&l, &[0x00, 0, 0, 0, 0, 0], &[]));
    let r = run(&l, &[0x03, 0, 0, 0, 18, 0], &[]);
    good(&r);
    assert_eq!(r.data_in.len(), 18);
    assert_eq!((r.data_in[0], r.data_in[2], r.data_in[12]), (0x70, 0, 0));
    invalid_field(&run(&l, &[0x03, 1, 0, 0, 18, 0], &[]), 1);
    good(&run(&l, &[0x1B, 0, 0, 0, 1, 0], &[]));
    good(&run(&l, &[0x34, 0, 0, 0, 0, 0, 0, 0, 8, 0], &[]));
    check(
        &run(&l, &[0x34, 0, 0, 0, 0x20, 0, 0, 0, 1, 0], &[]),
        0x05,
        0x21,
        0x00,
    );
}

/// PERSISTENT RESERVE OUT with a 24-byte parameter list.
fn prout(sa: u8, kind: u8, key: u64, sa_key: u64) -> ([u8; 10], Vec<u8>) {
    let mut p = vec![0u8; 24];
    p[..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    ([0x5F, sa, kind, 0, 0, 0, 0, 0, 24, 0], p)
}

fn pr(l: &Lun, who: &Nexus, sa: u8, kind: u8, key: u64, sa_key: u64) -> u8 {
    let (c, p) = prout(sa, kind, key, sa_key);
    let r = l.execute(who, &c, &p);
    if r.status == status::CHECK_CONDITION {
        panic!("PR OUT {sa}: sense {:02x?}", r.sense);
    }
    r.status
}

fn prin(l: &Lun, who: &Nexus, sa: u8) -> Vec<u8> {
    let r = l.execute(who, &[0x5E, sa, 0, 0, 0, 0, 0, 0x10, 0, 0], &[]);
    good(&r);
    r.data_in
}

#[test]
fn persistent_reservations_across_two_nexuses() {
    const REGISTER: u8 = 0;
    const RESERVE: u8 = 1;
    const RELEASE: u8 = 2;
    const CLEAR: u8 = 3;
    const PREEMPT: u8 = 4;
    const REGISTER_IGNORE: u8 = 6;
    const WE: u8 = 1;
    const EA_RO: u8 = 6;
    let l = lun(512);
    let (a, b, c) = (nexus("a"), nexus("b"), nexus("c"));
    let read = |who: &Nexus| l.execute(who, &read10(0, 1), &[]).status;
    let write = |who: &Nexus| l.execute(who, &write10(0, 1), &[0; 512]).status;
    use status::{GOOD, RESERVATION_CONFLICT as CONFLICT};

    assert_eq!(pr(&l, &a, REGISTER, 0, 0, 0xA), GOOD);
    assert_eq!(pr(&l, &b, REGISTER_IGNORE, 0, 0, 0xB), GOOD);
    // Registering again with a wrong key: conflict.
    assert_eq!(pr(&l, &b, REGISTER, 0, 0x99, 0xBB), CONFLICT);
    // READ KEYS: generation 2, two keys.
    let keys = prin(&l, &a, 0);
    assert_eq!(be32(&keys), 2);
    assert_eq!(be32(&keys[4..]), 16);
    assert_eq!((be64(&keys[8..]), be64(&keys[16..])), (0xA, 0xB));
    // A reserves WRITE EXCLUSIVE: B reads, B's writes conflict.
    assert_eq!(pr(&l, &a, RESERVE, WE, 0xA, 0), GOOD);
    assert_eq!(pr(&l, &b, RESERVE, WE, 0xB, 0), CONFLICT);
    assert_eq!((read(&b), write(&b)), (GOOD, CONFLICT));
    assert_eq!((read(&a), write(&a)), (GOOD, GOOD));
    let res = prin(&l, &b, 1);
    assert_eq!(be32(&res[4..]), 16);
    assert_eq!(be64(&res[8..]), 0xA);
    assert_eq!(res[21], WE);
    // RELEASE with another type: INVALID RELEASE OF PERSISTENT RESERVATION.
    let (cdb, p) = prout(RELEASE, EA_RO, 0xA, 0);
    check(&l.execute(&a, &cdb, &p), 0x05, 0x26, 0x04);
    // B preempts A with EXCLUSIVE ACCESS, REGISTRANTS ONLY: A is gone.
    assert_eq!(pr(&l, &b, PREEMPT, EA_RO, 0xB, 0xA), GOOD);
    assert_eq!((read(&a), write(&a)), (CONFLICT, CONFLICT));
    assert_eq!(
        pr(&l, &a, RESERVE, WE, 0xA, 0),
        CONFLICT,
        "A is no longer registered"
    );
    // A registers again: a registrant may read and write.
    assert_eq!(pr(&l, &a, REGISTER, 0, 0, 0xAA), GOOD);
    assert_eq!((read(&a), write(&a)), (GOOD, GOOD));
    assert_eq!((read(&c), write(&c)), (CONFLICT, CONFLICT));
    // INQUIRY and TEST UNIT READY are always allowed.
    good(&l.execute(&c, &[0x12, 0, 0, 0, 36, 0], &[]));
    good(&l.execute(&c, &[0x00, 0, 0, 0, 0, 0], &[]));
    // READ FULL STATUS: B holds it, through target port 1, with its TransportID.
    let full = prin(&l, &a, 3);
    let first = &full[8..];
    assert_eq!(be64(first), 0xB);
    assert_eq!((first[12], first[13]), (1, EA_RO));
    assert_eq!(be16(&first[18..]), 1);
    let id_len = be32(&first[20..]) as usize;
    assert_eq!(&first[24..26], &[0x45, 0x00]);
    let name = &first[28..24 + id_len];
    assert!(name.starts_with(b"iqn.2026-11.test:b,i,0x00023d000001\0"));
    // Reservations survive a LUN reset and the session's end.
    l.reset();
    l.nexus_lost(&b);
    // (C, which sent INQUIRY, first hears of the reset.)
    check(
        &l.execute(&c, &[0x00, 0, 0, 0, 0, 0], &[]),
        0x06,
        0x29,
        0x03,
    );
    assert_eq!(write(&c), CONFLICT);
    // CLEAR: everything goes.
    assert_eq!(pr(&l, &a, CLEAR, 0, 0xAA, 0), GOOD);
    assert_eq!((read(&c), write(&c)), (GOOD, GOOD));
    assert_eq!(be32(&prin(&l, &a, 0)[4..]), 0);
    // REPORT CAPABILITIES: every type, no APTPL.
    let caps = prin(&l, &a, 2);
    assert_eq!(&caps[..8], &[0, 8, 0x10, 0x80, 0xEA, 0x01, 0, 0]);
    // APTPL is refused; a parameter list of the wrong length too.
    let (cdb, mut p) = prout(REGISTER, 0, 0, 5);
    p[20] = 0x01;
    check(&l.execute(&a, &cdb, &p), 0x05, 0x26, 0x00);
    let (mut cdb, p) = prout(REGISTER, 0, 0, 5);
    cdb[8] = 20;
    check(&l.execute(&a, &cdb, &p[..20]), 0x05, 0x1A, 0x00);
}

#[test]
fn all_registrants_reservation() {
    let l = lun(512);
    let (a, b, c) = (nexus("a"), nexus("b"), nexus("c"));
    use status::{GOOD, RESERVATION_CONFLICT as CONFLICT};
    assert_eq!(pr(&l, &a, 0, 0, 0, 1), GOOD);
    assert_eq!(pr(&l, &b, 0, 0, 0, 2), GOOD);
    // WRITE EXCLUSIVE, ALL REGISTRANTS: key 0 in READ RESERVATION.
    assert_eq!(pr(&l, &a, 1, 7, 1, 0), GOOD);
    let res = prin(&l, &a, 1);
    assert_eq!((be64(&res[8..]), res[21]), (0, 7));
    let write = |who: &Nexus| l.execute(who, &write10(0, 1), &[0; 512]).status;
    assert_eq!((write(&a), write(&b), write(&c)), (GOOD, GOOD, CONFLICT));
    // A leaves: B still holds it.
    assert_eq!(pr(&l, &a, 0, 0, 1, 0), GOOD);
    assert_eq!((write(&a), write(&b)), (CONFLICT, GOOD));
    // B leaves: nobody is left, the reservation goes.
    assert_eq!(pr(&l, &b, 0, 0, 2, 0), GOOD);
    assert_eq!(write(&c), GOOD);
    assert_eq!(be32(&prin(&l, &a, 1)[4..]), 0);
}

#[test]
fn reserve_release_6_and_10() {
    let l = lun(512);
    let (a, b) = (nexus("a"), nexus("b"));
    use status::{GOOD, RESERVATION_CONFLICT as CONFLICT};
    let mode_sense = |who: &Nexus| l.execute(who, &[0x1A, 0, 0x3F, 0, 0xFF, 0], &[]).status;
    assert_eq!(l.execute(&a, &[0x16, 0, 0, 0, 0, 0], &[]).status, GOOD);
    assert_eq!(l.execute(&b, &[0x16, 0, 0, 0, 0, 0], &[]).status, CONFLICT);
    assert_eq!((mode_sense(&a), mode_sense(&b)), (GOOD, CONFLICT));
    assert_eq!(l.execute(&b, &[0x00, 0, 0, 0, 0, 0], &[]).status, CONFLICT);
    good(&l.execute(&b, &[0x12, 0, 0, 0, 36, 0], &[]));
    // RELEASE from B does nothing.
    good(&l.execute(&b, &[0x17, 0, 0, 0, 0, 0], &[]));
    assert_eq!(mode_sense(&b), CONFLICT);
    // PERSISTENT RESERVE OUT conflicts too.
    let (c, p) = prout(0, 0, 0, 7);
    assert_eq!(l.execute(&b, &c, &p).status, CONFLICT);
    // A's session ends: released.
    l.nexus_lost(&a);
    assert_eq!(mode_sense(&b), GOOD);
    // RESERVE(10) by B, LUN reset releases it.
    good(&l.execute(&b, &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]));
    assert_eq!(mode_sense(&a), CONFLICT);
    l.reset();
    assert_eq!(mode_sense(&a), GOOD);
    // B, which sent INQUIRY, hears of the reset once.
    assert_eq!(mode_sense(&b), status::CHECK_CONDITION);
    // RELEASE(10) by the holder.
    good(&l.execute(&a, &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]));
    good(&l.execute(&a, &[0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]));
    assert_eq!(mode_sense(&b), GOOD);
}

#[test]
fn report_luns_and_missing_luns() {
    // REPORT LUNS, allocation length 64: LUNs 0, 1 and 300 (flat space).
    let r = report_luns(&[0, 1, 300], &[0xA0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0]);
    good(&r);
    assert_eq!(be32(&r.data_in), 24);
    assert_eq!(&r.data_in[8..16], &[0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&r.data_in[16..24], &[0, 1, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&r.data_in[24..32], &[0x41, 0x2C, 0, 0, 0, 0, 0, 0]);
    assert_eq!(decode_lun([0x41, 0x2C, 0, 0, 0, 0, 0, 0]), Some(300));
    assert_eq!(decode_lun([0, 1, 0, 0, 0, 0, 0, 0]), Some(1));
    assert_eq!(decode_lun([0xC0, 1, 0, 0, 0, 0, 0, 0]), None);
    // Cut to the allocation length; a bad SELECT REPORT.
    let r = report_luns(&[0, 1], &[0xA0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 0, 0]);
    assert_eq!(r.data_in.len(), 12);
    invalid_field(
        &report_luns(&[0], &[0xA0, 0, 0x07, 0, 0, 0, 0, 0, 0, 64, 0, 0]),
        2,
    );
    // INQUIRY to a missing LUN: peripheral qualifier 011b, type 1Fh.
    let r = no_such_lun(&[0x12, 0, 0, 0, 0xFF, 0]);
    good(&r);
    assert_eq!(r.data_in[0], 0x7F);
    // Anything else: LOGICAL UNIT NOT SUPPORTED.
    check(&no_such_lun(&read10(0, 1)), 0x05, 0x25, 0x00);
    check(&no_such_lun(&[]), 0x05, 0x25, 0x00);
}

#[test]
fn a_reset_is_reported_once_to_every_known_nexus() {
    let l = lun(512);
    let (a, b, c) = (nexus("a"), nexus("b"), nexus("c"));
    let tur = |who: &Nexus| l.execute(who, &[0x00, 0, 0, 0, 0, 0], &[]);
    // A and B have attached (TEST UNIT READY, INQUIRY); C only reads.
    good(&tur(&a));
    good(&l.execute(&b, &[0x12, 0, 0, 0, 36, 0], &[]));
    good(&l.execute(&c, &read10(0, 1), &[]));
    l.reset();
    // A: UNIT ATTENTION, BUS DEVICE RESET FUNCTION OCCURRED, once.
    check(&tur(&a), 0x06, 0x29, 0x03);
    good(&tur(&a));
    // B: INQUIRY does not report it; REQUEST SENSE returns and clears it.
    good(&l.execute(&b, &[0x12, 0, 0, 0, 36, 0], &[]));
    let r = l.execute(&b, &[0x03, 0, 0, 0, 18, 0], &[]);
    good(&r);
    assert_eq!(
        (r.data_in[2], r.data_in[12], r.data_in[13]),
        (0x06, 0x29, 0x03)
    );
    good(&tur(&b));
    // C was never known.
    good(&l.execute(&c, &read10(0, 1), &[]));
    // A nexus that goes away takes its pending condition with it.
    l.reset();
    l.nexus_lost(&a);
    good(&l.execute(&a, &read10(0, 1), &[]));
    check(&l.execute(&b, &read10(0, 1), &[]), 0x06, 0x29, 0x03);
}
