//! Malformed and hostile clients, spoken to byte by byte over the Unix
//! socket. After each, the daemon must still be alive and serve others.

mod common;

use common::wire::*;
use common::*;
use std::io::Write;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// The daemon is alive, a normal client gets the right size, and a full
/// round of handshake + read over the raw protocol works.
fn assert_serves(d: &mut Ramd, size: u64) {
    d.assert_alive();
    require_tool("nbdinfo");
    let out = run_ok(&mut cmd("nbdinfo", ["--size", d.uri()]));
    assert_eq!(out.trim(), size.to_string(), "nbdinfo --size");
    let (mut r, got) = Raw::transmission(d, d.name());
    assert_eq!(got, size);
    r.request(0, CMD_READ, 1, 0, 4096);
    let (err, cookie, data) = r.simple_reply(4096);
    assert_eq!((err, cookie, data.len()), (0, 1, 4096));
    r.request(0, CMD_DISC, 2, 0, 0);
    r.expect_hangup("after NBD_CMD_DISC");
}

fn start() -> Ramd {
    Ramd::start(&["--size", "64M", "--name", "victim"])
}

#[test]
fn bad_option_magic_is_a_clean_disconnect() {
    let mut d = start();
    let mut r = Raw::negotiating(&d);
    let mut m = Vec::new();
    m.extend_from_slice(b"IHAVEOPX");
    m.extend_from_slice(&OPT_GO.to_be_bytes());
    m.extend_from_slice(&0u32.to_be_bytes());
    r.send_lossy(&m);
    r.expect_hangup("bad option magic");
    assert_serves(&mut d, 64 * MIB);
}

#[test]
fn unknown_client_flags_and_garbage_are_disconnected() {
    let mut d = start();
    let mut r = Raw::connect(&d);
    r.send_lossy(&0xffff_ffffu32.to_be_bytes());
    r.expect_hangup("unknown client flags");

    let mut r = Raw::connect(&d);
    let mut junk = vec![0u8; 64 * 1024];
    Rng::new(99).fill(&mut junk);
    r.send_lossy(&junk);
    r.expect_hangup("64 KiB of random bytes");

    // Garbage before even reading the greeting.
    let mut s = UnixStream::connect(d.socket_path()).unwrap();
    s.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
    let _ = s.write_all(&junk[..1000]);
    let mut r = Raw { s };
    r.expect_hangup("garbage before the greeting");
    assert_serves(&mut d, 64 * MIB);
}

#[test]
fn option_with_huge_length_is_refused_without_allocating_it() {
    let mut d = start();
    let rss_before = d.rss();
    let mut r = Raw::negotiating(&d);
    let mut m = Vec::new();
    m.extend_from_slice(&IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&OPT_GO.to_be_bytes());
    m.extend_from_slice(&0xffff_fff0u32.to_be_bytes());
    m.extend_from_slice(&[0u8; 64]);
    r.send_lossy(&m);
    r.s.shutdown(Shutdown::Write).unwrap();
    let got = r.expect_hangup("option with a 4 GiB length");
    if got.len() >= 20 {
        let ty = u32::from_be_bytes(got[12..16].try_into().unwrap());
        assert!(
            ty & REP_ERR != 0,
            "huge option answered with reply type {ty:#x}"
        );
    }
    assert!(
        d.rss() < rss_before + 256 * MIB,
        "RSS grew from {rss_before} to {} after a 4 GiB option length",
        d.rss()
    );
    assert_serves(&mut d, 64 * MIB);
}

#[test]
fn bad_options_get_errors_and_negotiation_continues() {
    let mut d = start();
    let mut r = Raw::negotiating(&d);
    // Unknown option.
    r.send_opt(0x4242, b"hello");
    let (opt, ty, _) = r.opt_reply();
    assert_eq!((opt, ty), (0x4242, REP_ERR_UNSUP), "unknown option");
    // NBD_OPT_GO whose data is too short to hold a name length.
    r.send_opt(OPT_GO, &[0, 0]);
    let (opt, ty, _) = r.opt_reply();
    assert_eq!((opt, ty), (OPT_GO, REP_ERR_INVALID), "truncated NBD_OPT_GO");
    // NBD_OPT_GO whose name length runs past the option's data.
    let mut bad = go_data("victim");
    bad[3] = 200;
    r.send_opt(OPT_GO, &bad);
    let (opt, ty, _) = r.opt_reply();
    assert_eq!(
        (opt, ty),
        (OPT_GO, REP_ERR_INVALID),
        "NBD_OPT_GO name overruns"
    );
    // Unknown export.
    r.send_opt(OPT_GO, &go_data("no-such-disk"));
    let (opt, ty, _) = r.opt_reply();
    assert_eq!((opt, ty), (OPT_GO, REP_ERR_UNKNOWN), "unknown export");
    // And now a good one on the same connection.
    r.send_opt(OPT_GO, &go_data("victim"));
    loop {
        let (opt, ty, data) = r.opt_reply();
        assert_eq!(opt, OPT_GO);
        if ty == REP_ACK {
            break;
        }
        assert_eq!(ty, REP_INFO, "good NBD_OPT_GO: {ty:#x} {data:?}");
    }
    r.request(0, CMD_READ, 5, 4096, 512);
    assert_eq!(r.simple_reply(512), (0, 5, vec![0u8; 512]));
    assert_serves(&mut d, 64 * MIB);
}

#[test]
fn export_name_for_an_unknown_export_closes_the_connection() {
    let mut d = start();
    let mut r = Raw::negotiating(&d);
    r.send_opt(OPT_EXPORT_NAME, b"no-such-disk");
    r.expect_hangup("NBD_OPT_EXPORT_NAME of an unknown export");
    // The classic way in still works for the real name.
    let mut r = Raw::negotiating(&d);
    r.send_opt(OPT_EXPORT_NAME, b"victim");
    let mut h = [0u8; 10];
    r.read_exact(&mut h);
    assert_eq!(u64::from_be_bytes(h[0..8].try_into().unwrap()), 64 * MIB);
    r.request(0, CMD_READ, 9, 0, 4096);
    assert_eq!(r.simple_reply(4096), (0, 9, vec![0u8; 4096]));
    assert_serves(&mut d, 64 * MIB);
}

#[test]
fn truncated_requests_then_disconnect() {
    let mut d = start();
    // Half a request header.
    let (mut r, _) = Raw::transmission(&d, "victim");
    r.send(&REQUEST_MAGIC.to_be_bytes());
    r.send(&[0u8; 6]);
    drop(r);
    // A write header promising 64 KiB, then 1000 bytes, then hang up.
    let (mut r, _) = Raw::transmission(&d, "victim");
    r.request(0, CMD_WRITE, 3, 0, 64 * 1024);
    r.send(&[0xee; 1000]);
    drop(r);
    // Half-closed: the server sees EOF mid-payload and must hang up.
    let (mut r, _) = Raw::transmission(&d, "victim");
    r.request(0, CMD_WRITE, 4, 0, 64 * 1024);
    r.send(&[0xee; 1000]);
    r.s.shutdown(Shutdown::Write).unwrap();
    r.expect_hangup("EOF in a write payload");
    assert_serves(&mut d, 64 * MIB);
}

#[test]
fn unknown_command_gets_einval_and_the_connection_keeps_working() {
    let mut d = start();
    let (mut r, _) = Raw::transmission(&d, "victim");
    r.request(0, 0x42, 77, 0, 4096);
    assert_eq!(
        r.simple_reply(0),
        (EINVAL, 77, vec![]),
        "unknown command 0x42"
    );
    r.request(0, 0xffff, 78, 0, 0);
    assert_eq!(
        r.simple_reply(0),
        (EINVAL, 78, vec![]),
        "unknown command 0xffff"
    );
    r.request(0, CMD_READ, 79, 0, 4096);
    assert_eq!(r.simple_reply(4096), (0, 79, vec![0u8; 4096]), "read after");
    assert_serves(&mut d, 64 * MIB);
}

#[test]
fn unknown_command_flag_gets_einval() {
    let mut d = start();
    let (mut r, _) = Raw::transmission(&d, "victim");
    r.request(0x8000, CMD_READ, 11, 0, 4096);
    assert_eq!(r.simple_reply(4096).0, EINVAL, "READ with flag 0x8000");
    r.request(0, CMD_READ, 12, 0, 4096);
    assert_eq!(r.simple_reply(4096), (0, 12, vec![0u8; 4096]), "read after");
    assert_serves(&mut d, 64 * MIB);
}

#[test]
fn bad_request_magic_disconnects() {
    let mut d = start();
    let (mut r, _) = Raw::transmission(&d, "victim");
    let mut m = vec![0xde, 0xad, 0xbe, 0xef];
    m.extend_from_slice(&[0u8; 24]);
    r.send_lossy(&m);
    r.expect_hangup("bad request magic");
    assert_serves(&mut d, 64 * MIB);
}

#[test]
fn oversized_requests_are_refused() {
    let mut d = Ramd::start(&["--size", "128M", "--name", "victim"]);
    // A read one page over the 64 MiB limit (nbdkit's): an error, and the
    // connection stays usable (there is no payload to skip).
    let (mut r, _) = Raw::transmission(&d, "victim");
    r.request(0, CMD_READ, 21, 0, (64 * MIB + PAGE) as u32);
    let (err, cookie, _) = r.simple_reply(0);
    assert_eq!(cookie, 21);
    assert!(
        err == EINVAL || err == EOVERFLOW,
        "read of 64 MiB + 4 KiB: error {err}"
    );
    r.request(0, CMD_READ, 22, 0, 4096);
    assert_eq!(r.simple_reply(4096), (0, 22, vec![0u8; 4096]));

    // A write one byte over the limit, payload and all: the payload is
    // skipped, the write refused, and the next request is served.
    let n = 64 * MIB + 1;
    r.request(0, CMD_WRITE, 24, 0, n as u32);
    r.send(&vec![0x5a; n as usize]);
    let (err, cookie, _) = r.simple_reply(0);
    assert_eq!((err, cookie), (EINVAL, 24), "write of 64 MiB + 1");
    r.request(0, CMD_READ, 25, 0, 4096);
    assert_eq!(
        r.simple_reply(4096),
        (0, 25, vec![0u8; 4096]),
        "nothing landed"
    );

    // A 1 GiB write header with no payload: refused with an error reply or
    // a hangup, never buffered; the server must not wait for the gigabyte.
    let rss_before = d.rss();
    let (mut r, _) = Raw::transmission(&d, "victim");
    r.request(0, CMD_WRITE, 23, 0, (GIB) as u32);
    r.send_lossy(&[0x11; 4096]);
    r.s.shutdown(Shutdown::Write).unwrap();
    let got = r.expect_hangup("1 GiB write");
    if got.len() >= 16 {
        let err = u32::from_be_bytes(got[4..8].try_into().unwrap());
        assert!(
            [EINVAL, ENOSPC, EOVERFLOW].contains(&err),
            "1 GiB write answered with error {err}"
        );
    }
    assert!(
        d.rss() < rss_before + 256 * MIB,
        "RSS grew by a huge write header"
    );
    assert_serves(&mut d, 128 * MIB);
    // Nothing of it landed.
    qemu_io(d.uri(), &["read -P 0 0 64k".into()]);
}

#[test]
fn requests_up_to_64_mib_are_served() {
    // Clients that negotiated no block size may go past the advertised
    // 32 MiB; nbdkit serves up to 64 MiB, and so does ramd.
    let d = Ramd::start(&["--size", "160M", "--name", "victim"]);
    let (mut r, _) = Raw::transmission(&d, "victim");
    let n = 64 * MIB as usize;
    let mut data = vec![0u8; n];
    Rng::new(7).fill(&mut data);
    r.request(0, CMD_WRITE, 31, 3 * MIB, n as u32);
    r.send(&data);
    assert_eq!(r.simple_reply(0), (0, 31, vec![]), "64 MiB write");
    r.request(0, CMD_READ, 32, 3 * MIB, n as u32);
    let (err, cookie, got) = r.simple_reply(n);
    assert_eq!((err, cookie), (0, 32), "64 MiB read");
    assert!(got == data, "64 MiB read back differs");
    r.request(0, CMD_DISC, 33, 0, 0);
    r.expect_hangup("after NBD_CMD_DISC");
}

#[test]
fn client_without_fixed_newstyle_is_served_with_export_name() {
    let mut d = start();
    // Client flags 0: no FIXED_NEWSTYLE, no NO_ZEROES.
    let mut r = Raw::connect(&d);
    r.send(&0u32.to_be_bytes());
    // Any option but EXPORT_NAME is refused, and negotiation goes on.
    r.send_opt(OPT_GO, &go_data("victim"));
    let (opt, ty, _) = r.opt_reply();
    assert_eq!((opt, ty), (OPT_GO, REP_ERR_INVALID));
    r.send_opt(OPT_EXPORT_NAME, b"victim");
    let mut reply = [0u8; 8 + 2 + 124];
    r.read_exact(&mut reply);
    assert_eq!(u64::from_be_bytes(reply[..8].try_into().unwrap()), 64 * MIB);
    assert!(reply[10..].iter().all(|&b| b == 0), "124 reserved zeroes");
    r.request(0, CMD_WRITE, 1, 8192, 4);
    r.send(b"ramd");
    assert_eq!(r.simple_reply(0), (0, 1, vec![]));
    r.request(0, CMD_READ, 2, 8190, 8);
    assert_eq!(r.simple_reply(8), (0, 2, b"\0\0ramd\0\0".to_vec()));
    r.request(0, CMD_DISC, 3, 0, 0);
    r.expect_hangup("after NBD_CMD_DISC");
    assert_serves(&mut d, 64 * MIB);
}

#[test]
fn flush_with_nonzero_length_or_offset_is_einval() {
    let mut d = start();
    let (mut r, _) = Raw::transmission(&d, "victim");
    for (cookie, off, len) in [(1, 0, 4096), (2, 4096, 0), (3, 0, 1)] {
        r.request(0, CMD_FLUSH, cookie, off, len);
        assert_eq!(
            r.simple_reply(0),
            (EINVAL, cookie, vec![]),
            "flush {off} {len}"
        );
    }
    r.request(0, CMD_FLUSH, 4, 0, 0);
    assert_eq!(r.simple_reply(0), (0, 4, vec![]));
    assert_serves(&mut d, 64 * MIB);
}

#[test]
fn idle_and_half_open_clients_do_not_block_others() {
    let mut d = start();
    let mut idle = Vec::new();
    for _ in 0..4 {
        // Connected, never reads the greeting.
        idle.push(UnixStream::connect(d.socket_path()).unwrap());
    }
    let mut waiting = Vec::new();
    for _ in 0..4 {
        // Read the greeting, never answer.
        waiting.push(Raw::connect(&d));
    }
    let mut parked = Vec::new();
    for _ in 0..4 {
        // In transmission, a request header sent, the payload never.
        let (mut r, _) = Raw::transmission(&d, "victim");
        r.request(0, CMD_WRITE, 1, 0, 4096);
        r.send(&[1u8; 100]);
        parked.push(r);
    }
    nbd_script(
        "io.py",
        &[
            d.uri(),
            "write-random",
            "1M",
            "8M",
            "4",
            ",",
            "verify-random",
            "1M",
            "8M",
            "4",
        ],
    );
    assert_serves(&mut d, 64 * MIB);
    drop((idle, waiting, parked));
    assert_serves(&mut d, 64 * MIB);
}

#[test]
fn connection_churn_leaves_nothing_behind() {
    let mut d = start();
    for i in 0..150u64 {
        match i % 3 {
            0 => drop(UnixStream::connect(d.socket_path()).unwrap()),
            1 => drop(Raw::negotiating(&d)),
            _ => {
                let (mut r, _) = Raw::transmission(&d, "victim");
                r.request(0, CMD_READ, i, 0, 512);
                assert_eq!(r.simple_reply(512).0, 0);
            }
        }
    }
    assert_serves(&mut d, 64 * MIB);
    wait_until(Duration::from_secs(10), "connections to drop to 0", || {
        field(&d.stats(), "connections") == 0
    });
}

/// Queues `n` reads of 32 MiB without reading any reply.
fn flood_reads(r: &mut Raw, n: u64) {
    for i in 0..n {
        r.request(0, CMD_READ, 1000 + i, (i % 2) * 32 * MIB, (32 * MIB) as u32);
    }
}

#[test]
fn a_client_that_never_reads_replies_does_not_block_others() {
    let mut d = start();
    let (mut stuck, _) = Raw::transmission(&d, "victim");
    flood_reads(&mut stuck, 16);
    nbd_script(
        "io.py",
        &[
            d.uri(),
            "write-random",
            "0",
            "16M",
            "5",
            ",",
            "verify-random",
            "0",
            "16M",
            "5",
        ],
    );
    assert_serves(&mut d, 64 * MIB);
    drop(stuck);
    wait_until(
        Duration::from_secs(20),
        "the stuck client to be dropped",
        || field(&d.stats(), "connections") == 0,
    );
    assert_serves(&mut d, 64 * MIB);
}

#[test]
fn a_client_vanishing_mid_reply_is_harmless() {
    let mut d = start();
    for _ in 0..4 {
        let (mut r, _) = Raw::transmission(&d, "victim");
        flood_reads(&mut r, 8);
        let mut first = [0u8; 100];
        r.read_exact(&mut first); // the server is sending
        drop(r);
    }
    assert_serves(&mut d, 64 * MIB);
    wait_until(Duration::from_secs(20), "connections to drop to 0", || {
        field(&d.stats(), "connections") == 0
    });
}

#[test]
fn sigterm_with_a_stuck_client_still_stops_cleanly() {
    let mut d = start();
    let (mut stuck, _) = Raw::transmission(&d, "victim");
    flood_reads(&mut stuck, 16);
    let idle = Raw::connect(&d); // mid-handshake
    let (sock, ctl) = (d.socket_path(), d.ctl_path());
    d.stop();
    assert!(!sock.exists() && !ctl.exists(), "sockets left behind");
    drop((stuck, idle));
}

#[test]
fn block_status_without_a_negotiated_context_is_einval() {
    let mut d = start();
    let (mut r, _) = Raw::transmission(&d, "victim");
    r.request(0, CMD_BLOCK_STATUS, 31, 0, 4096);
    assert_eq!(r.simple_reply(0), (EINVAL, 31, vec![]), "BLOCK_STATUS");
    r.request(0, CMD_READ, 32, 0, 4096);
    assert_eq!(r.simple_reply(4096), (0, 32, vec![0u8; 4096]), "read after");
    assert_serves(&mut d, 64 * MIB);
}

#[test]
fn structured_reply_option_with_data_is_invalid() {
    let mut d = start();
    let mut r = Raw::negotiating(&d);
    r.send_opt(OPT_STRUCTURED_REPLY, b"junk");
    let (opt, ty, _) = r.opt_reply();
    assert_eq!((opt, ty), (OPT_STRUCTURED_REPLY, REP_ERR_INVALID));
    r.send_opt(OPT_STRUCTURED_REPLY, b"");
    let (opt, ty, _) = r.opt_reply();
    assert_eq!((opt, ty), (OPT_STRUCTURED_REPLY, REP_ACK));
    assert_serves(&mut d, 64 * MIB);
}

#[test]
fn pipelined_requests_are_answered_with_their_own_cookies() {
    let mut d = start();
    let (mut r, _) = Raw::transmission(&d, "victim");
    let block = |i: u64| {
        let mut b = vec![0u8; 16 * 1024];
        Rng::new(i).fill(&mut b);
        b
    };
    // Region B (at 8 MiB) written and acknowledged first.
    for i in 0..32u64 {
        r.request(0, CMD_WRITE, i, 8 * MIB + i * 64 * 1024, 16 * 1024);
        r.send(&block(100 + i));
        assert_eq!(r.simple_reply(0), (0, i, vec![]));
    }
    // Then 32 writes to region A and 32 reads of region B, interleaved and
    // sent by another thread without waiting for replies (a client that sent
    // everything before reading anything could deadlock against the socket
    // buffers). The server may answer in any order.
    let mut sender = Raw {
        s: r.s.try_clone().unwrap(),
    };
    let sending = std::thread::spawn(move || {
        for i in 0..32u64 {
            sender.request(0, CMD_WRITE, 0x1000 + i, i * 64 * 1024, 16 * 1024);
            sender.send(&block(i));
            sender.request(0, CMD_READ, 0x2000 + i, 8 * MIB + i * 64 * 1024, 16 * 1024);
        }
    });
    let mut writes_done = std::collections::HashSet::new();
    let mut reads_done = std::collections::HashSet::new();
    for _ in 0..64 {
        // Only a read's reply carries data: the cookie says which it is.
        let mut h = [0u8; 16];
        r.read_exact(&mut h);
        let (err, cookie) = reply_header(&h);
        assert_eq!(err, 0, "request {cookie:#x} failed");
        match cookie {
            0x1000..=0x101f => assert!(writes_done.insert(cookie), "{cookie:#x} twice"),
            0x2000..=0x201f => {
                assert!(reads_done.insert(cookie), "{cookie:#x} twice");
                let mut data = vec![0u8; 16 * 1024];
                r.read_exact(&mut data);
                let i = cookie - 0x2000;
                assert!(data == block(100 + i), "read {i} returned other data");
            }
            _ => panic!("reply with unknown cookie {cookie:#x}"),
        }
    }
    assert_eq!((writes_done.len(), reads_done.len()), (32, 32));
    sending.join().unwrap();
    // Every acknowledged write reads back.
    for i in 0..32u64 {
        r.request(0, CMD_READ, 0x3000 + i, i * 64 * 1024, 16 * 1024);
        assert_eq!(r.simple_reply(16 * 1024), (0, 0x3000 + i, block(i)));
    }
    assert_serves(&mut d, 64 * MIB);
}

#[test]
fn disconnect_completes_requests_in_flight() {
    let mut d = start();
    let (mut r, _) = Raw::transmission(&d, "victim");
    let mut payload = vec![0u8; 256 * 1024];
    Rng::new(77).fill(&mut payload);
    for i in 0..8u64 {
        r.request(0, CMD_WRITE, 40 + i, i * 256 * 1024, payload.len() as u32);
        r.send(&payload);
    }
    r.request(0, CMD_DISC, 50, 0, 0);
    // Every write is answered before the server hangs up.
    let got = r.expect_hangup("NBD_CMD_DISC after 8 writes");
    assert_eq!(
        got.len(),
        8 * 16,
        "replies before the hangup: {} bytes",
        got.len()
    );
    for reply in got.chunks(16) {
        assert_eq!(reply_header(reply).0, 0);
    }
    let (mut r, _) = Raw::transmission(&d, "victim");
    for i in 0..8u64 {
        r.request(0, CMD_READ, 60 + i, i * 256 * 1024, payload.len() as u32);
        let (err, cookie, data) = r.simple_reply(payload.len());
        assert_eq!((err, cookie), (0, 60 + i));
        assert!(
            data == payload,
            "write {i} did not land before the disconnect"
        );
    }
    assert_serves(&mut d, 64 * MIB);
}
