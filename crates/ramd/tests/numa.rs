//! NUMA placement seen from outside: `--numa-nodes`, `--numa-policy`, and
//! the pages per node that `ramd status` reports from the kernel's answer
//! (`move_pages`). This machine may have one node: placement is checked on
//! node 0 and every other node is refused; multi-node logic (nodemasks,
//! CPU sets, memoryless nodes) is unit-tested in ramd-store's `numa.rs`
//! against fake sysfs trees.

mod common;

use common::*;

/// The host's nodes with memory, from sysfs.
fn memory_nodes() -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/sys/devices/system/node").expect("sysfs node tree") {
        let e = e.unwrap();
        let Some(n) = e
            .file_name()
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let meminfo = std::fs::read_to_string(e.path().join("meminfo")).unwrap();
        if !meminfo.contains("MemTotal:          0 kB") {
            out.push(n);
        }
    }
    out.sort();
    out
}

fn pages_on(s: &serde_json::Value, node: u32) -> u64 {
    s["pages_per_node"][node.to_string()].as_u64().unwrap_or(0)
}

#[test]
fn pages_are_reported_on_the_node_they_are_bound_to() {
    let node = memory_nodes()[0];
    let nodes = node.to_string();
    for policy in ["bind", "preferred", "interleave"] {
        let d = Ramd::start(&[
            "--size",
            "64M",
            "--numa-nodes",
            &nodes,
            "--numa-policy",
            policy,
        ]);
        nbd_script("io.py", &[d.uri(), "write-random", "0", "16M", "3"]);
        let s = d.stats();
        assert_eq!(s["numa_nodes"], nodes.as_str(), "{s}");
        assert_eq!(s["numa_policy"], policy, "{s}");
        assert_eq!(field(&s, "pages_per_node_sample"), 1, "{s}");
        // The kernel's count covers at least the data; nothing elsewhere.
        assert!(pages_on(&s, node) >= 16 * MIB / PAGE, "{policy}: {s}");
        let per_node = s["pages_per_node"].as_object().unwrap();
        assert_eq!(per_node.len(), 1, "{policy}: pages off node {node}: {s}");
        let table = ramd_cmd(d.run_dir(), &["status"]).ok();
        assert!(
            table.contains(&format!(" {node}:{} ", pages_on(&s, node)))
                || table.contains(&format!(" {node}:")),
            "no NODES cell in:\n{table}"
        );
        nbd_script("io.py", &[d.uri(), "verify-random", "0", "16M", "3"]);
    }
    // Without --numa-nodes the kernel places pages where they fault: still
    // reported from its answer.
    let d = Ramd::start(&["--size", "64M"]);
    nbd_script("io.py", &[d.uri(), "write-random", "0", "8M", "4"]);
    let s = d.stats();
    assert!(s["numa_nodes"].is_null(), "{s}");
    let total: u64 = s["pages_per_node"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert!(total >= 8 * MIB / PAGE, "{s}");
}

#[test]
fn bad_placements_are_refused_at_start() {
    let missing = memory_nodes().last().unwrap() + 1;
    let run_dir = scratch();
    let missing_arg = missing.to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--numa-nodes", &missing_arg],
            "does not exist (this host's nodes: 0 (",
        ),
        (vec!["--numa-nodes", "0-"], "numactl syntax"),
        (vec!["--numa-nodes", "1-0"], "runs backwards"),
        (vec!["--numa-nodes", ""], "empty"),
        (
            vec!["--numa-policy", "sideways"],
            "valid: bind, preferred, interleave",
        ),
    ];
    for (extra, want) in cases {
        let mut args = vec!["--size", "16M"];
        args.extend(extra.iter().copied());
        match Ramd::try_start_in(run_dir.path(), &args) {
            Ok(_) => panic!("ramd serve {args:?} started"),
            Err((_, stderr)) => assert!(
                stderr.contains(want),
                "ramd serve {args:?}: {want:?} not in:\n{stderr}"
            ),
        }
    }
    // The same from a config file, naming the key.
    let conf = run_dir.path().join("ramd.toml");
    std::fs::write(
        &conf,
        format!("[disk.a]\nsize = \"16M\"\nnuma_nodes = \"{missing}\"\n"),
    )
    .unwrap();
    let out = ramd_cmd(run_dir.path(), &["up", "-c", conf.to_str().unwrap()]).failed();
    assert!(
        out.stderr
            .contains(&format!("node {missing} does not exist")),
        "{}",
        out.stderr
    );
}

/// AnonHugePages of /proc/PID/smaps_rollup, in bytes.
fn anon_huge_pages(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|k| k * 1024)
        .unwrap_or_else(|| panic!("no AnonHugePages in smaps_rollup:\n{text}"))
}

#[test]
fn huge_pages_back_the_arenas_only_when_asked() {
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .expect("this kernel has transparent huge pages");
    assert!(!thp.contains("[never]"), "THP is off on this host: {thp}");
    for (mode, want_huge) in [("never", false), ("madvise", true), ("always", true)] {
        let d = Ramd::start(&["--size", "64M", "--huge-pages", mode]);
        nbd_script("io.py", &[d.uri(), "write-random", "0", "32M", "5"]);
        let huge = anon_huge_pages(d.pid());
        if want_huge {
            assert!(huge >= 2 * MIB, "--huge-pages {mode}: AnonHugePages {huge}");
        } else {
            assert_eq!(huge, 0, "--huge-pages {mode}");
        }
        // Trimmed and idle, a huge page is split and goes back as well.
        let rss_start = d.rss();
        nbd_script("io.py", &[d.uri(), "trim", "0", "32M"]);
        wait_until(DECAY, "the trimmed pages to go back", || {
            d.rss() + 24 * MIB <= rss_start
        });
    }
    let run_dir = scratch();
    match Ramd::try_start_in(
        run_dir.path(),
        &["--size", "16M", "--huge-pages", "sometimes"],
    ) {
        Ok(_) => panic!("--huge-pages sometimes started"),
        Err((_, stderr)) => assert!(stderr.contains("valid: never, madvise, always"), "{stderr}"),
    }
}

const DECAY: std::time::Duration = std::time::Duration::from_secs(60);
