"""A standby's reads while saves are applied: each read of the range must
see one save, never two mixed. The writer fills the range with one byte per
save; this reads it whole, one request at a time, until STOPFILE exists.

Usage: whole_saves.py URI LENGTH STOPFILE
Prints `reads N`, `patterns P1,P2,...` (the bytes seen, in order).
"""

import os

from nbdtest import check, connect, main


def run(argv):
    uri, length, stop = argv[0], int(argv[1]), argv[2]
    h = connect(uri)
    reads, seen = 0, []
    # One more read after the stop file: the last save is seen too.
    while True:
        last = os.path.exists(stop)
        buf = h.pread(length, 0)
        reads += 1
        first = buf[0]
        mixed = buf.count(first) != length
        if mixed:
            at = next(i for i, b in enumerate(buf) if b != first)
            check(False, "read %d mixes saves: byte 0 is %#x, byte %d is %#x"
                  % (reads, first, at, buf[at]))
        if not seen or seen[-1] != first:
            seen.append(first)
        if last:
            break
    h.shutdown()
    print("reads %d" % reads)
    print("patterns %s" % ",".join(str(p) for p in seen))


main(run)
