"""Many commands in flight on one connection, completed out of order.

Usage: aio.py URI   (a fresh, writable disk of at least 64 MiB)
"""

import random

import nbd
from nbdtest import MIB, PAGE, Failure, check, connect, data, main, wait_all


def run(argv):
    h = connect(argv[0])
    rnd = random.Random(42)
    region = 32 * MIB

    # 1. 512 writes of 4-256 KiB, random order, all queued before any reply.
    blocks = []
    pos = 0
    while pos < region:
        n = min(rnd.choice([4, 8, 64, 128, 256]) * 1024, region - pos)
        blocks.append((pos, n))
        pos += n
    rnd.shuffle(blocks)
    want = {}
    cookies = {}
    for i, (off, n) in enumerate(blocks):
        buf = data("w%d" % i, n)
        want[off] = buf
        flags = nbd.CMD_FLAG_FUA if i % 7 == 0 else 0
        cookies[h.aio_pwrite(buf, off, flags=flags)] = ("pwrite", off, n)
    check(h.aio_in_flight() > 1, "libnbd did not queue the writes")
    # Data under the pages that step 2 trims and zeroes.
    second = 40 * MIB
    under = data("under", 8 * MIB)
    for k in range(0, 8 * MIB, MIB):
        cookies[h.aio_pwrite(under[k:k + MIB], second + 16 * MIB + k)] = ("pwrite", k, MIB)
    cookies[h.aio_flush()] = ("flush", 0, 0)
    wait_all(h)
    for c, what in cookies.items():
        try:
            check(h.aio_command_completed(c), "%s not completed" % (what,))
        except nbd.Error as e:
            raise Failure("%s failed: %s" % (what, e))

    # 2. Reads of every block in another random order, mixed with writes,
    # trims and zeroes to a second region, all in flight together.
    rnd.shuffle(blocks)
    reads = []
    others = []
    gone = set()
    for i, (off, n) in enumerate(blocks):
        buf = nbd.Buffer(n)
        reads.append((h.aio_pread(buf, off), buf, off, n))
        if i % 4 == 0:
            o = second + (i // 4) * 64 * 1024
            others.append((h.aio_pwrite(data("x%d" % i, 64 * 1024), o), "pwrite", o))
        elif i % 4 == 1:
            o = second + 16 * MIB + (i // 4) * 2 * PAGE
            others.append((h.aio_trim(PAGE, o), "trim", o))
            gone.add(o)
        elif i % 4 == 2:
            o = second + 20 * MIB + (i // 4) * 2 * PAGE
            others.append((h.aio_zero(PAGE, o), "zero", o))
            gone.add(o)
    wait_all(h)
    for c, buf, off, n in reads:
        check(h.aio_command_completed(c), "read %d+%d not completed" % (off, n))
        check(buf.to_bytearray() == want[off],
              "aio read %d+%d returned wrong data" % (off, n))
    for c, what, off in others:
        check(h.aio_command_completed(c), "%s at %d not completed" % (what, off))

    # 3. The synchronous view agrees with everything the aio calls did.
    for i in range(0, len(blocks), 4):
        o = second + (i // 4) * 64 * 1024
        check(h.pread(64 * 1024, o) == data("x%d" % i, 64 * 1024),
              "aio write at %d did not land" % o)
    got = h.pread(8 * MIB, second + 16 * MIB)
    for k in range(0, 8 * MIB, PAGE):
        exp = bytes(PAGE) if second + 16 * MIB + k in gone else under[k:k + PAGE]
        check(got[k:k + PAGE] == exp,
              "page %d after aio trim/zero: wrong contents" % (second + 16 * MIB + k))
    h.shutdown()


main(run)
