"""Several connections at once (the server advertises CAN_MULTI_CONN): what one
connection wrote and flushed, every other connection reads.

Usage: multi_conn.py URI N   (a fresh disk of at least N*8 MiB)
"""

import nbd
from nbdtest import MIB, check, connect, data, main, wait_all

REGION = 8 * MIB


def run(argv):
    uri, n = argv[0], int(argv[1])
    hs = [connect(uri) for _ in range(n)]
    check(all(h.can_multi_conn() for h in hs), "CAN_MULTI_CONN not advertised")
    # Interleave the queues of all connections before draining any.
    for i, h in enumerate(hs):
        for k in range(0, REGION, 256 * 1024):
            h.aio_pwrite(data("c%d:%d" % (i, k), 256 * 1024), i * REGION + k)
    for h in hs:
        wait_all(h)
    hs[0].flush()
    for j, h in enumerate(hs):
        for i in range(n):
            got = h.pread(REGION, i * REGION)
            for k in range(0, REGION, 256 * 1024):
                check(got[k:k + 256 * 1024] == data("c%d:%d" % (i, k), 256 * 1024),
                      "connection %d reads wrong data written by connection %d at %d"
                      % (j, i, i * REGION + k))
    for h in hs:
        h.shutdown()


main(run)
