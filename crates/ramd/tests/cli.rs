//! The command line: help everywhere, clear errors for bad input.

mod common;

use common::*;
use std::time::Duration;

/// A bad invocation must fail fast, so a daemon that starts serving by
/// mistake fails the test instead of hanging it.
const BAD_INPUT_TIMEOUT: Duration = Duration::from_secs(20);

fn ramd(args: &[&str]) -> Output {
    let dir = scratch();
    let mut c = cmd(ramd_bin(), ["--run-dir"]);
    c.arg(dir.path()).args(args);
    run(&mut c, BAD_INPUT_TIMEOUT)
}

/// Asserts `ramd ARGS` fails, prints no URI, and says something about
/// `needle` on stderr.
fn rejects(args: &[&str], needle: &str) {
    let out = ramd(args).failed();
    assert!(
        !out.stdout.contains("nbd"),
        "failed invocation printed a URI: {out:?}"
    );
    assert!(
        out.stderr.contains(needle),
        "error for {args:?} does not mention {needle:?}:\n{}",
        out.stderr
    );
}

#[test]
fn help_for_every_command() {
    let top = run_ok(&mut cmd(ramd_bin(), ["--help"]));
    for word in ["serve", "status"] {
        assert!(top.contains(word), "ramd --help lacks {word}:\n{top}");
    }
    let serve = run_ok(&mut cmd(ramd_bin(), ["serve", "--help"]));
    for opt in [
        "--size",
        "--name",
        "--listen",
        "--max-memory",
        "--read-only",
        "--threads",
        "--max-connections",
    ] {
        assert!(
            serve.contains(opt),
            "ramd serve --help lacks {opt}:\n{serve}"
        );
    }
    let status = run_ok(&mut cmd(ramd_bin(), ["status", "--help"]));
    assert!(
        status.contains("--json"),
        "ramd status --help lacks --json:\n{status}"
    );
}

#[test]
fn bad_sizes_are_rejected_naming_the_value() {
    // 2^63 bytes: one more than the largest offset qemu and the kernel take.
    for bad in [
        "abc",
        "0",
        "12Q",
        "-5",
        "1.5.3G",
        "99999999999999999999",
        "9223372036854775808",
    ] {
        rejects(&["serve", "--size", bad], bad);
    }
    rejects(&["serve", "--size", "64M", "--max-memory", "lots"], "lots");
    rejects(&["serve", "--size", "64M", "--max-memory", "0"], "max");
}

#[test]
fn missing_size_is_an_error() {
    rejects(&["serve"], "--size");
    // Said once: the disk's name is the context, not part of the message.
    let out = ramd(&["serve", "--name", "u"]).failed();
    assert!(
        out.stderr
            .contains("ramd: error: disk \"u\": a new disk needs a size: give --size SIZE"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stderr.matches("\"u\"").count(), 1, "{}", out.stderr);
}

#[test]
fn bad_listen_addresses_are_rejected() {
    rejects(
        &["serve", "--size", "16M", "--listen", "carrier-pigeon:1"],
        "carrier-pigeon",
    );
    rejects(
        &["serve", "--size", "16M", "--listen", "tcp:99999"],
        "99999",
    );
    rejects(
        &["serve", "--size", "16M", "--listen", "tcp:127.0.0.1:port"],
        "port",
    );
    rejects(
        &[
            "serve",
            "--size",
            "16M",
            "--listen",
            "unix:/nonexistent-ramd-dir/x.sock",
        ],
        "/nonexistent-ramd-dir/x.sock",
    );
}

#[test]
fn a_busy_tcp_port_is_reported() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    rejects(
        &[
            "serve",
            "--size",
            "16M",
            "--listen",
            &format!("tcp:127.0.0.1:{port}"),
        ],
        &port,
    );
}

#[test]
fn unknown_commands_and_options_are_rejected() {
    ramd(&["frobnicate"]).failed();
    ramd(&["serve", "--size", "16M", "--no-such-option"]).failed();
    ramd(&["status", "--no-such-option"]).failed();
}
