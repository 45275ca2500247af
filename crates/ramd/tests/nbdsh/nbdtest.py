"""Helpers shared by the nbdsh scripts (python3-libnbd).

The scripts run as `python3 SCRIPT.py URI [ARGS...]` with a python that can
`import nbd`; the Rust tests pick that interpreter (see common/mod.rs).
Every failed check raises, so the script exits non-zero with a message that
names the request and what came back.
"""

import errno
import os
import random
import sys

import nbd

MIB = 1 << 20
PAGE = 4096
HOLE_ZERO = nbd.STATE_HOLE | nbd.STATE_ZERO  # 3
ZERO = nbd.STATE_ZERO  # 2
DATA = 0


class Failure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def connect(uri, strict=False, meta=True):
    """A handle on URI. With strict=False, libnbd sends out-of-range and
    unadvertised requests as they are, so the *server* must refuse them."""
    h = nbd.NBD()
    if meta:
        h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_uri(uri)
    if not strict:
        h.set_strict_mode(0)
    return h


def errname(code):
    return errno.errorcode.get(code, str(code)) if code is not None else "None"


def errnum(e):
    """The numeric errno of an nbd.Error (its .errno is the symbolic name)."""
    return e.errnum


def expect_errno(want, what, fn, *args, **kw):
    """Calls fn; asserts it fails with errno `want` (an int or a set)."""
    wants = want if isinstance(want, (set, frozenset, tuple)) else {want}
    try:
        fn(*args, **kw)
    except nbd.Error as e:
        check(
            errnum(e) in wants,
            "%s: expected %s, got %s (%s)"
            % (what, "/".join(errname(w) for w in wants), errname(errnum(e)), e.string),
        )
        return e
    raise Failure(
        "%s: succeeded, expected %s" % (what, "/".join(errname(w) for w in wants))
    )


def data(seed, length):
    """Deterministic incompressible bytes."""
    return random.Random(seed).randbytes(length)


def extents(h, offset, length):
    """base:allocation extents covering [offset, offset+length), as a list of
    (start, length, flags), merged and clipped to the range."""
    out = []
    pos = offset
    end = offset + length
    while pos < end:
        got = []

        def cb(metacontext, off, entries, err):
            if metacontext == nbd.CONTEXT_BASE_ALLOCATION:
                got.append((off, list(entries)))
            return 0

        h.block_status(min(end - pos, 1 << 30), pos, cb)
        check(got, "block_status at %d returned no base:allocation extents" % pos)
        off, entries = got[0]
        check(off == pos, "block_status at %d answered for offset %d" % (pos, off))
        check(entries, "block_status at %d returned an empty extent list" % pos)
        for i in range(0, len(entries), 2):
            ln, fl = entries[i], entries[i + 1]
            check(ln > 0, "block_status at %d returned a zero-length extent" % pos)
            ln = min(ln, end - pos)
            if out and out[-1][2] == fl and out[-1][0] + out[-1][1] == pos:
                out[-1] = (out[-1][0], out[-1][1] + ln, fl)
            else:
                out.append((pos, ln, fl))
            pos += ln
            if pos >= end:
                break
    return out


def expect_extents(h, offset, length, want, what):
    """want: list of (length, flags) covering the range exactly."""
    got = extents(h, offset, length)
    exp = []
    pos = offset
    for ln, fl in want:
        exp.append((pos, ln, fl))
        pos += ln
    check(got == exp, "%s: block status\n  got  %s\n  want %s" % (what, got, exp))


def wait_all(h):
    while h.aio_in_flight() > 0:
        h.poll(-1)


def main(fn):
    """Runs fn(argv) and exits 1 with the failure message on a Failure."""
    try:
        fn(sys.argv[1:])
    except Failure as e:
        print("FAIL: %s" % e, file=sys.stderr)
        sys.exit(1)
    print("ok: %s" % os.path.basename(sys.argv[0]))
