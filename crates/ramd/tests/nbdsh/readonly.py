"""A --read-only export: advertised read-only, writes refused with EPERM.

Usage: readonly.py URI [any]

With `any`, the disk may hold data (a standby's): the refused writes must
leave its first MiB as it was, instead of it reading zeros.
"""

import errno

import nbd
from nbdtest import MIB, PAGE, check, connect, expect_errno, expect_extents, main, HOLE_ZERO


def run(argv):
    h = connect(argv[0])
    fresh = argv[1:] != ["any"]
    size = h.get_size()
    check(h.is_read_only(), "export is not advertised read-only")
    before = h.pread(MIB, 0)
    if fresh:
        check(before == bytes(MIB), "a fresh read-only disk reads zeros")
    for what, fn, args in [
        ("pwrite", h.pwrite, (b"x" * PAGE, 0)),
        ("pwrite FUA", h.pwrite, (b"x" * PAGE, 0, nbd.CMD_FLAG_FUA)),
        ("trim", h.trim, (PAGE, 0)),
        ("zero", h.zero, (PAGE, 0)),
        ("zero NO_HOLE", h.zero, (PAGE, 0, nbd.CMD_FLAG_NO_HOLE)),
        ("zero FAST_ZERO", h.zero, (PAGE, 0, nbd.CMD_FLAG_FAST_ZERO)),
    ]:
        expect_errno(errno.EPERM, what + " on a read-only export", fn, *args)
    # Reads, block status and cache still work on the same connection.
    check(h.pread(MIB, 0) == before, "the refused writes changed the disk")
    if fresh:
        check(h.pread(PAGE, size - PAGE) == bytes(PAGE), "read after refused writes")
        expect_extents(h, 0, size, [(size, HOLE_ZERO)], "read-only disk")
    h.cache(MIB, 0)
    h.shutdown()


main(run)
