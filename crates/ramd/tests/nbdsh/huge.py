"""The largest disk there is: 2^63-1 bytes (signed 64-bit offsets).

Usage: huge.py URI
"""

import errno

import nbd
from nbdtest import (DATA, HOLE_ZERO, PAGE, check, connect, data, expect_errno,
                     expect_extents, main)


def run(argv):
    h = connect(argv[0])
    size = h.get_size()
    check(size == 2**63 - 1, "size %d" % size)

    mid = 2**62
    blob = data(1, PAGE)
    h.pwrite(blob, mid)
    h.pwrite(b"tail", size - 4)
    h.pwrite(b"head", 0)
    check(h.pread(PAGE, mid) == blob, "page at 2^62")
    check(h.pread(4, size - 4) == b"tail", "last bytes")
    check(h.pread(1, size - 1) == b"l", "last byte")
    check(h.pread(4, 0) == b"head", "first bytes")
    expect_extents(h, mid - PAGE, 3 * PAGE,
                   [(PAGE, HOLE_ZERO), (PAGE, DATA), (PAGE, HOLE_ZERO)], "around 2^62")

    for off, n in [(size - 1, 2), (size, 1), (2**64 - 1, 1), (2**64 - PAGE, 2 * PAGE)]:
        where = "offset %d length %d" % (off, n)
        expect_errno(errno.EINVAL, "pread " + where, h.pread, n, off)
        expect_errno(errno.EINVAL, "trim " + where, h.trim, n, off)
        expect_errno(errno.ENOSPC, "pwrite " + where, h.pwrite, bytes(n), off)
        expect_errno(errno.ENOSPC, "zero " + where, h.zero, n, off)
        expect_errno(errno.EINVAL, "block_status " + where,
                     h.block_status, n, off, lambda *a: 0)

    # A 4 GiB - 1 trim in the middle of nowhere, and the page at 2^62.
    h.trim(2**32 - 1, mid + PAGE)
    h.trim(PAGE, mid)
    check(h.pread(PAGE, mid) == bytes(PAGE), "trimmed page at 2^62")
    h.shutdown()


main(run)
