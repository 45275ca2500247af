//! `nbdcopy` round trips: data in and out bit for bit, over one or several
//! connections, sparse sources, disk to disk.

mod common;

use common::*;

fn nbdcopy(args: &[&str]) {
    require_tool("nbdcopy");
    run(&mut cmd("nbdcopy", args), LONG_TIMEOUT).ok();
}

fn path_str(p: &std::path::Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn random_file_round_trip() {
    let tmp = scratch();
    let src = tmp.path().join("src.img");
    let back = tmp.path().join("back.img");
    random_file(&src, 128 * MIB);
    let d = Ramd::start(&["--size", "128M"]);
    nbdcopy(&[path_str(&src), d.uri()]);
    nbdcopy(&[d.uri(), path_str(&back)]);
    assert_eq!(sha256(&src), sha256(&back));
    let s = d.stats();
    assert_eq!(field(&s, "data_pages"), 128 * MIB / PAGE, "{s}");
    assert_accounting(&s);
}

#[test]
fn multiple_connections_round_trip() {
    let tmp = scratch();
    let src = tmp.path().join("src.img");
    let back = tmp.path().join("back.img");
    random_file(&src, 128 * MIB);
    let d = Ramd::start(&["--size", "128M"]);
    nbdcopy(&[
        "--connections=4",
        "--requests=16",
        "--request-size=262144",
        path_str(&src),
        d.uri(),
    ]);
    nbdcopy(&["--connections=4", "--requests=16", d.uri(), path_str(&back)]);
    assert_eq!(sha256(&src), sha256(&back));
}

#[test]
fn sparse_source_stays_sparse() {
    let tmp = scratch();
    let src = tmp.path().join("sparse.img");
    let back = tmp.path().join("back.img");
    // 64 MiB: zeros, 8 MiB of random data at 16 MiB, zeros.
    let mut buf = vec![0u8; (64 * MIB) as usize];
    Rng::new(11).fill(&mut buf[(16 * MIB) as usize..(24 * MIB) as usize]);
    write_file(&src, &buf);
    let d = Ramd::start(&["--size", "64M"]);
    nbdcopy(&[path_str(&src), d.uri()]);
    nbdcopy(&[d.uri(), path_str(&back)]);
    assert_same_file(&src, &back);
    let s = d.stats();
    assert_eq!(field(&s, "data_pages"), 8 * MIB / PAGE, "{s}");
    assert_accounting(&s);
    assert!(
        field(&s, "memory_used") < 9 * MIB,
        "zeros of a sparse copy cost memory: {s}"
    );
}

#[test]
fn disk_to_disk_over_unix_and_tcp() {
    let tmp = scratch();
    let src = tmp.path().join("src.img");
    let back = tmp.path().join("back.img");
    random_file(&src, 64 * MIB);
    let a = Ramd::start(&["--size", "64M", "--name", "a"]);
    let port = free_tcp_port().to_string();
    let b = Ramd::start(&[
        "--size",
        "64M",
        "--name",
        "b",
        "--listen",
        &format!("tcp:127.0.0.1:{port}"),
    ]);
    assert_eq!(b.uri(), format!("nbd://127.0.0.1:{port}/b"));
    nbdcopy(&[path_str(&src), a.uri()]);
    nbdcopy(&["--connections=2", a.uri(), b.uri()]);
    nbdcopy(&[b.uri(), path_str(&back)]);
    assert_eq!(sha256(&src), sha256(&back));
}
