"""Scriptable I/O for tests that check the daemon between steps.

Usage: io.py URI OP ARGS... [, OP ARGS...]...
Sizes accept K/M/G suffixes. Ops (every request is at most 4 MiB):
  write-random OFF LEN SEED    deterministic incompressible data
  verify-random OFF LEN SEED   read back and compare
  write-byte OFF LEN BYTE      a same-filled range (BYTE e.g. 0xab)
  verify-byte OFF LEN BYTE
  trim OFF LEN
  zero OFF LEN FLAGS           FLAGS: '-' or a '+'-list of nohole, fast, fua
  flush
  fill-until-enospc OFF LEN SEED
                               1 MiB random writes from OFF until one fails;
                               the failure must be ENOSPC before LEN bytes;
                               prints 'written N' (bytes written before it)
"""

import errno
import sys

import nbd
from nbdtest import MIB, Failure, check, connect, data, errname, errnum, main

STEP = 4 * MIB


def num(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s[-1].upper() in mult:
        return int(s[:-1], 0) * mult[s[-1].upper()]
    return int(s, 0)


def pieces(off, length, step=STEP):
    pos = off
    while pos < off + length:
        n = min(step, off + length - pos)
        yield pos, n
        pos += n


def seeded(seed, pos, n):
    """Bytes [pos, pos+n) of the stream for `seed`: the same whatever the
    request boundaries used to write or read them."""
    first, last = pos // MIB, (pos + n - 1) // MIB
    blob = b"".join(data("%s:%d" % (seed, k), MIB) for k in range(first, last + 1))
    start = pos - first * MIB
    return blob[start:start + n]


def op_write_random(h, off, length, seed):
    for pos, n in pieces(num(off), num(length)):
        h.pwrite(seeded(seed, pos, n), pos)


def op_verify_random(h, off, length, seed):
    for pos, n in pieces(num(off), num(length)):
        check(h.pread(n, pos) == seeded(seed, pos, n),
              "data at %d+%d differs from seed %s" % (pos, n, seed))


def op_write_byte(h, off, length, byte):
    b = bytes([num(byte)])
    for pos, n in pieces(num(off), num(length)):
        h.pwrite(b * n, pos)


def op_verify_byte(h, off, length, byte):
    b = bytes([num(byte)])
    for pos, n in pieces(num(off), num(length)):
        check(h.pread(n, pos) == b * n, "data at %d+%d is not all %s" % (pos, n, byte))


def op_trim(h, off, length):
    for pos, n in pieces(num(off), num(length)):
        h.trim(n, pos)


def op_zero(h, off, length, flags):
    f = 0
    names = {"nohole": nbd.CMD_FLAG_NO_HOLE, "fast": nbd.CMD_FLAG_FAST_ZERO,
             "fua": nbd.CMD_FLAG_FUA}
    if flags != "-":
        for name in flags.split("+"):
            f |= names[name]
    for pos, n in pieces(num(off), num(length)):
        h.zero(n, pos, f)


def op_flush(h):
    h.flush()


def op_fill_until_enospc(h, off, length, seed):
    off, length = num(off), num(length)
    written = 0
    for pos, n in pieces(off, length, MIB):
        try:
            h.pwrite(seeded(seed, pos, n), pos)
        except nbd.Error as e:
            check(errnum(e) == errno.ENOSPC,
                  "write at %d failed with %s (%s), expected ENOSPC"
                  % (pos, errname(errnum(e)), e.string))
            print("written %d" % written)
            return
        written += n
    raise Failure("wrote %d bytes from %d without ENOSPC" % (written, off))


OPS = {
    "write-random": op_write_random,
    "verify-random": op_verify_random,
    "write-byte": op_write_byte,
    "verify-byte": op_verify_byte,
    "trim": op_trim,
    "zero": op_zero,
    "flush": op_flush,
    "fill-until-enospc": op_fill_until_enospc,
}


def run(argv):
    h = connect(argv[0])
    ops, cur = [], []
    for a in argv[1:]:
        if a == ",":
            ops.append(cur)
            cur = []
        else:
            cur.append(a)
    if cur:
        ops.append(cur)
    for op in ops:
        fn = OPS.get(op[0])
        check(fn is not None, "unknown op %s" % op[0])
        try:
            fn(h, *op[1:])
        except nbd.Error as e:
            raise Failure("%s: %s (%s)" % (" ".join(op), errname(errnum(e)), e.string))
    h.shutdown()


main(run)
