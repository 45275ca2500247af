"""base:allocation after writes, written zeros, zeroes, trims.

Usage: block_status.py URI   (a fresh, writable disk of at least 64 MiB)
"""

import nbd
from nbdtest import (DATA, HOLE_ZERO, MIB, PAGE, ZERO, check, connect, data,
                     expect_extents, extents, main)


def run(argv):
    h = connect(argv[0])
    size = h.get_size()
    check(h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION),
          "base:allocation was not negotiated")

    expect_extents(h, 0, size, [(size, HOLE_ZERO)], "fresh disk")

    h.pwrite(data(1, MIB), 0)                       # [0,1M)   data
    h.pwrite(bytes(MIB), MIB)                       # [1M,2M)  written zeros
    h.pwrite(data(2, MIB), 2 * MIB)                 # [2M,3M)  data, then
    h.zero(MIB, 2 * MIB, nbd.CMD_FLAG_NO_HOLE)      #          zeroed, no hole
    h.pwrite(data(3, MIB), 3 * MIB)                 # [3M,4M)  data, then
    h.trim(MIB, 3 * MIB)                            #          trimmed
    h.pwrite(b"\xab" * MIB, 4 * MIB)                # [4M,5M)  same-filled
    h.zero(MIB, 5 * MIB, nbd.CMD_FLAG_NO_HOLE)      # [5M,6M)  NO_HOLE on a hole
    expect_extents(h, 0, 8 * MIB, [
        (MIB, DATA),
        (2 * MIB, ZERO),
        (MIB, HOLE_ZERO),
        (MIB, DATA),
        (MIB, ZERO),
        (2 * MIB, HOLE_ZERO),
    ], "after write/zeros/zero NO_HOLE/trim/fill")
    check(h.pread(MIB, 4 * MIB) == b"\xab" * MIB, "same-filled page reads back")
    check(h.pread(3 * MIB, MIB) == bytes(3 * MIB), "zeroed/trimmed read as zeros")

    # Zero without NO_HOLE: reads zero; may or may not punch a hole.
    h.pwrite(data(4, MIB), 8 * MIB)
    h.zero(MIB, 8 * MIB)
    for start, ln, fl in extents(h, 8 * MIB, MIB):
        check(fl in (ZERO, HOLE_ZERO),
              "zero without NO_HOLE at %d+%d reports %d" % (start, ln, fl))

    # Page granularity: one 4 KiB data page in the middle of a hole.
    h.pwrite(data(5, PAGE), 10 * MIB + 3 * PAGE)
    expect_extents(h, 10 * MIB, MIB, [
        (3 * PAGE, HOLE_ZERO), (PAGE, DATA), (MIB - 4 * PAGE, HOLE_ZERO),
    ], "single page")

    # REQ_ONE: exactly one extent, starting at the offset asked for.
    got = []

    def cb(ctx, off, entries, err):
        got.append((ctx, off, list(entries)))
        return 0

    h.block_status(8 * MIB, 0, cb, nbd.CMD_FLAG_REQ_ONE)
    check(len(got) == 1 and got[0][0] == nbd.CONTEXT_BASE_ALLOCATION,
          "REQ_ONE: callbacks %s" % got)
    entries = got[0][2]
    check(len(entries) == 2 and entries[0] <= MIB and entries[1] == DATA,
          "REQ_ONE at 0 answered %s" % entries)

    # Past the last write, to the end of the disk: one hole.
    expect_extents(h, 16 * MIB, size - 16 * MIB, [(size - 16 * MIB, HOLE_ZERO)],
                   "untouched tail")

    # Trimming everything makes the whole disk a hole again.
    h.trim(size, 0)
    expect_extents(h, 0, size, [(size, HOLE_ZERO)], "after trimming everything")
    h.shutdown()


main(run)
