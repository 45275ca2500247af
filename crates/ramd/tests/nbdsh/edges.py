"""Protocol edge cases: ranges, errnos, flags, request sizes.

Usage: edges.py URI   (a fresh, writable disk of at least 64 MiB)
"""

import errno

import nbd
from nbdtest import MIB, PAGE, check, connect, data, expect_errno, main


def run(argv):
    uri = argv[0]
    h = connect(uri)
    size = h.get_size()
    check(size >= 64 * MIB, "disk too small for this script: %d" % size)

    # Out of range: reads, trims and block status are EINVAL; writes and
    # write-zeroes are ENOSPC (NBD spec, "Error values").
    for off, n in [(size, PAGE), (size - PAGE, 2 * PAGE), (size + MIB, 1),
                   (2**63, PAGE), (2**64 - 512, 1024)]:
        where = "offset %d length %d (size %d)" % (off, n, size)
        expect_errno(errno.EINVAL, "pread " + where, h.pread, n, off)
        expect_errno(errno.EINVAL, "trim " + where, h.trim, n, off)
        expect_errno(errno.EINVAL, "block_status " + where,
                     h.block_status, n, off, lambda *a: 0)
        expect_errno(errno.ENOSPC, "pwrite " + where, h.pwrite, bytes(n), off)
        expect_errno(errno.ENOSPC, "zero " + where, h.zero, n, off)
        expect_errno(errno.ENOSPC, "zero NO_HOLE " + where, h.zero, n, off,
                     nbd.CMD_FLAG_NO_HOLE)

    # The connection survives all of that, and the last bytes are reachable.
    tail = data(1, PAGE)
    h.pwrite(tail, size - PAGE)
    check(h.pread(PAGE, size - PAGE) == tail, "last page did not read back")
    check(h.pread(1, size - 1) == tail[-1:], "last byte did not read back")

    # Minimum block size 1: unaligned I/O straddling pages.
    h.pwrite(b"abc", 4095)
    check(h.pread(8, 4092) == b"\0\0\0abc\0\0", "unaligned write straddling a page")
    base = data(2, 3 * PAGE)
    h.pwrite(base, MIB)
    h.pwrite(b"XYZ" * 1000, MIB + 1000)
    want = bytearray(base)
    want[1000:4000] = b"XYZ" * 1000
    check(h.pread(3 * PAGE, MIB) == bytes(want), "read-modify-write inside pages")

    # Partial trims and zeroes leave their neighbours alone.
    blob = data(3, 4 * PAGE)
    h.pwrite(blob, 2 * MIB)
    h.trim(100, 2 * MIB + 5000)
    got = h.pread(4 * PAGE, 2 * MIB)
    check(got[:5000] == blob[:5000] and got[5100:] == blob[5100:],
          "a 100-byte trim changed bytes outside its range")
    h.zero(3000, 2 * MIB + 6000)
    got = h.pread(4 * PAGE, 2 * MIB)
    check(got[6000:9000] == bytes(3000), "zeroed bytes do not read as zeros")
    check(got[:5000] == blob[:5000] and got[9000:] == blob[9000:],
          "a 3000-byte zero changed bytes outside its range")

    # FUA and flush.
    check(h.can_fua() and h.can_flush(), "server does not advertise FUA and FLUSH")
    fua = data(4, 64 * 1024)
    h.pwrite(fua, 3 * MIB, nbd.CMD_FLAG_FUA)
    h.flush()
    check(h.pread(len(fua), 3 * MIB) == fua, "FUA write did not read back")
    h.zero(PAGE, 3 * MIB, nbd.CMD_FLAG_FUA)
    h.trim(PAGE, 3 * MIB + PAGE, nbd.CMD_FLAG_FUA)
    check(h.pread(2 * PAGE, 3 * MIB) == bytes(2 * PAGE), "FUA zero/trim")

    # FAST_ZERO: a RAM disk zeroes fast, with or without NO_HOLE.
    check(h.can_fast_zero(), "server does not advertise FAST_ZERO")
    h.pwrite(data(5, MIB), 4 * MIB)
    h.zero(MIB // 2, 4 * MIB, nbd.CMD_FLAG_FAST_ZERO)
    h.zero(MIB // 2, 4 * MIB + MIB // 2,
           nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_NO_HOLE)
    check(h.pread(MIB, 4 * MIB) == bytes(MIB), "FAST_ZERO did not zero")

    # CACHE is accepted and changes nothing.
    check(h.can_cache(), "server does not advertise CACHE")
    h.cache(MIB, 0)
    h.cache(size, 0)
    check(h.pread(3, 4095) == b"abc", "CACHE changed data")

    # DF on a structured read: one chunk, same bytes.
    check(h.can_df(), "server does not advertise DF")
    check(h.pread(3 * PAGE, MIB, nbd.CMD_FLAG_DF) == bytes(want), "DF read")

    # A read spanning hole, data, hole reassembles correctly.
    h.trim(8 * MIB, 10 * MIB)
    h.pwrite(b"\x5a" * 10 + data(6, PAGE), 10 * MIB + PAGE)
    got = h.pread(4 * PAGE, 10 * MIB)
    check(got == bytes(PAGE) + b"\x5a" * 10 + data(6, PAGE) + bytes(2 * PAGE - 10),
          "read across hole/data/hole")

    # The advertised maximum (32 MiB) works both ways, and so does one page
    # more (a client that negotiated no block size may send it; ramd serves
    # up to 64 MiB, as nbdkit does). Past 64 MiB it is an error, not data
    # (libnbd itself refuses to send it; hostile.rs sends it raw), and the
    # connection stays usable.
    big = data(7, 32 * MIB)
    h.pwrite(big, 16 * MIB)
    check(h.pread(32 * MIB, 16 * MIB) == big, "32 MiB write/read")
    check(h.pread(32 * MIB + PAGE, 16 * MIB) == big + bytes(PAGE),
          "read of 32 MiB + 4 KiB")
    expect_errno({errno.EINVAL, errno.EOVERFLOW, errno.ERANGE},
                 "pread of 64 MiB + 4 KiB", h.pread, 64 * MIB + PAGE, 0)
    check(h.pread(3, 4095) == b"abc", "connection unusable after a refused read")

    # Effect-only commands may exceed the payload limit (spec: SHOULD NOT
    # disconnect); a RAM disk trims and zeroes any length.
    h.zero(48 * MIB, 8 * MIB)
    check(h.pread(PAGE, 8 * MIB) == bytes(PAGE), "48 MiB zero")
    h.trim(size, 0)
    check(h.pread(PAGE, size - PAGE) == bytes(PAGE), "trim of the whole disk")
    h.flush()
    h.shutdown()


main(run)
