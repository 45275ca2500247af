//! NBD protocol behaviour through libnbd (scripts in tests/nbdsh/).

mod common;

use common::*;

#[test]
fn out_of_range_flags_and_request_sizes() {
    let mut d = Ramd::start(&["--size", "256M"]);
    nbd_script("edges.py", &[d.uri()]);
    d.assert_alive();
}

#[test]
fn block_status_after_write_trim_and_zero() {
    let d = Ramd::start(&["--size", "64M"]);
    nbd_script("block_status.py", &[d.uri()]);
}

#[test]
fn many_commands_in_flight() {
    let d = Ramd::start(&["--size", "128M"]);
    nbd_script("aio.py", &[d.uri()]);
}

#[test]
fn option_negotiation() {
    let d = Ramd::start(&["--size", "64M", "--name", "opts"]);
    nbd_script("options.py", &[d.uri(), "opts"]);
}

#[test]
fn read_only_export_refuses_writes_with_eperm() {
    let d = Ramd::start(&["--size", "64M", "--read-only"]);
    nbd_script("readonly.py", &[d.uri()]);
}

#[test]
fn multi_conn_connections_see_each_others_writes() {
    let d = Ramd::start(&["--size", "64M"]);
    nbd_script("multi_conn.py", &[d.uri(), "6"]);
}

#[test]
fn tcp_listener_serves_the_same_protocol() {
    let port = free_tcp_port();
    let d = Ramd::start(&[
        "--size",
        "64M",
        "--listen",
        &format!("tcp:127.0.0.1:{port}"),
    ]);
    assert_eq!(d.uri(), format!("nbd://127.0.0.1:{port}/ram0"));
    nbd_script("block_status.py", &[d.uri()]);
}

#[test]
fn one_request_thread_per_connection_is_still_correct() {
    let d = Ramd::start(&["--size", "128M", "--threads", "1"]);
    nbd_script("aio.py", &[d.uri()]);
    nbd_script("multi_conn.py", &[d.uri(), "4"]);
}

#[test]
fn the_largest_disk_2_pow_63_minus_1_bytes() {
    let d = Ramd::start(&["--size", "9223372036854775807"]);
    nbd_script("huge.py", &[d.uri()]);
    let s = d.stats();
    assert_eq!(field(&s, "size"), i64::MAX as u64, "{s}");
    assert!(field(&s, "data_pages") <= 4, "{s}");
    assert_accounting(&s);
}

#[test]
fn zero_length_reads_large_requests_and_old_newstyle_clients() {
    let mut d = Ramd::start(&["--size", "256M"]);
    nbd_script("conformance.py", &[d.uri()]);
    d.assert_alive();
}
