"""Option haggling: LIST, INFO, LIST_META_CONTEXT, GO, ABORT, block sizes.

Usage: options.py URI NAME   (URI may name any export; NAME is the disk)
"""

import nbd
from nbdtest import MIB, Failure, check, main


def opt_handle(uri):
    h = nbd.NBD()
    h.set_opt_mode(True)
    h.connect_uri(uri)
    check(h.aio_is_negotiating(), "option mode did not stop in negotiation")
    return h


def run(argv):
    uri, name = argv
    h = opt_handle(uri)

    names = []
    h.opt_list(lambda n, desc: names.append(n) or 0)
    check(name in names, "NBD_OPT_LIST gave %s, missing %r" % (names, name))

    for export in (name, ""):
        h.set_export_name(export)
        h.opt_info()
        check(h.get_size() > 0, "NBD_OPT_INFO %r: size %d" % (export, h.get_size()))
        check(h.get_block_size(nbd.SIZE_MINIMUM) == 1,
              "minimum block size %d" % h.get_block_size(nbd.SIZE_MINIMUM))
        check(h.get_block_size(nbd.SIZE_PREFERRED) == 4096,
              "preferred block size %d" % h.get_block_size(nbd.SIZE_PREFERRED))
        check(h.get_block_size(nbd.SIZE_MAXIMUM) == 32 * MIB,
              "maximum block size %d" % h.get_block_size(nbd.SIZE_MAXIMUM))

    h.set_export_name("no-such-export")
    try:
        h.opt_info()
    except nbd.Error:
        pass
    else:
        raise Failure("NBD_OPT_INFO for an unknown export succeeded")
    check(h.aio_is_negotiating(), "a refused NBD_OPT_INFO ended the negotiation")

    h.set_export_name(name)
    ctxs = []
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    n = h.opt_list_meta_context(lambda c: ctxs.append(c) or 0)
    check(n >= 1 and nbd.CONTEXT_BASE_ALLOCATION in ctxs,
          "NBD_OPT_LIST_META_CONTEXT gave %s" % ctxs)

    h.opt_go()
    check(h.aio_is_ready(), "NBD_OPT_GO did not reach transmission")
    check(h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION),
          "base:allocation not negotiated by SET_META_CONTEXT")
    check(h.get_structured_replies_negotiated(), "structured replies not negotiated")
    check(h.pread(4096, 0) == bytes(4096), "read after GO")
    h.shutdown()

    # ABORT ends the session cleanly.
    h = opt_handle(uri)
    h.opt_abort()
    check(h.aio_is_closed() or h.aio_is_dead(), "ABORT did not end the session")

    # An unknown export with GO is refused and leaves the handle negotiating.
    h = opt_handle(uri)
    h.set_export_name("no-such-export")
    try:
        h.opt_go()
    except nbd.Error:
        pass
    else:
        raise Failure("NBD_OPT_GO for an unknown export succeeded")
    h.set_export_name(name)
    h.opt_go()
    check(h.get_size() > 0, "GO after a refused GO")
    h.shutdown()


main(run)
