"""What third-party clients do that ramd once got wrong: zero-length
reads, requests past the advertised 32 MiB, clients without fixed newstyle.

Usage: conformance.py URI   (a fresh, writable disk of at least 128 MiB)
"""

import errno

import nbd
from nbdtest import MIB, check, connect, data, expect_errno, main


def zero_length_reads(uri):
    # Structured replies (libnbd's default) and simple replies: a read of
    # 0 bytes succeeds with no data, and the connection goes on.
    for structured in (True, False):
        h = nbd.NBD()
        h.set_request_structured_replies(structured)
        h.connect_uri(uri)
        h.set_strict_mode(0)  # libnbd would refuse to send a 0-byte read
        what = "structured" if structured else "simple"
        check(h.get_structured_replies_negotiated() == structured,
              "%s replies were not negotiated as asked" % what)
        for off in (0, 4096, 12345, h.get_size()):
            got = h.pread(0, off)
            check(got == b"", "%s: 0-byte read at %d returned %r" % (what, off, got))
            buf = nbd.Buffer(0)
            cookie = h.aio_pread(buf, off)
            while not h.aio_command_completed(cookie):
                h.poll(-1)
        h.pwrite(b"still here", 4096)
        check(h.pread(10, 4096) == b"still here", "%s: connection after 0-byte reads" % what)
        h.shutdown()


def large_requests(uri):
    # libnbd itself stops at 64 MiB (its MAX_REQUEST_SIZE), as nbdkit does;
    # ramd serves everything up to that whatever block size it advertised.
    h = connect(uri)
    size = h.get_size()
    check(size >= 128 * MIB, "disk too small for this script: %d" % size)
    for n in (32 * MIB + 1, 48 * MIB, 64 * MIB):
        blob = data(n, n)
        h.pwrite(blob, 7)
        check(h.pread(n, 7) == blob, "read back of a %d-byte write" % n)
    # Unaligned, across the end of what the last write touched.
    check(h.pread(64 * MIB, 100) == blob[93:] + bytes(93),
          "64 MiB read at an odd offset")
    # Past 64 MiB the client refuses before anything is sent.
    expect_errno({errno.ERANGE, errno.EINVAL}, "pread of 64 MiB + 1",
                 h.pread, 64 * MIB + 1, 0)
    h.shutdown()


def old_newstyle_client(uri):
    # A client that does not set NBD_FLAG_C_FIXED_NEWSTYLE can only send
    # NBD_OPT_EXPORT_NAME; with and without NO_ZEROES (124 zero bytes).
    for flags in (0, nbd.HANDSHAKE_FLAG_NO_ZEROES):
        h = nbd.NBD()
        h.set_handshake_flags(flags)
        h.connect_uri(uri)
        check(h.get_protocol() == "newstyle",
              "flags %d: protocol %s, expected plain newstyle" % (flags, h.get_protocol()))
        check(not h.get_structured_replies_negotiated(),
              "structured replies without fixed newstyle")
        check(h.get_size() >= 128 * MIB, "size %d" % h.get_size())
        blob = data(flags + 100, 3 * 4096)
        h.pwrite(blob, MIB + 1)
        check(h.pread(len(blob), MIB + 1) == blob, "flags %d: read back" % flags)
        h.flush()
        h.shutdown()


def run(argv):
    uri = argv[0]
    zero_length_reads(uri)
    large_requests(uri)
    old_newstyle_client(uri)


main(run)
