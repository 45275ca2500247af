//! NUMA placement of a disk's page memory (RedHawk's per-disk nodemask) and
//! the kernel's count of its pages per node (RedHawk's pagestat).
//!
//! The topology is read from a sysfs tree (`/sys/devices/system/node` on a
//! host; tests point [`Topology::read`] at a fake one): which nodes exist,
//! their CPUs and their memory. A [`Placement`] is checked against it at
//! start (nodes that do not exist or have no memory, a preferred policy with
//! several nodes), then probed once with a real `mbind`, so a policy the
//! kernel refuses fails before any client. Arenas are `mbind`-ed as they are
//! mapped, before their first touch (`pool.rs`); threads serving the disk
//! run on its nodes' CPUs ([`Placement::pin_current_thread`], inherited by
//! every thread they start).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::error::{Error, Result};
use crate::sys::PAGE_SIZE;

/// Highest node number accepted (the kernel's usual MAX_NUMNODES is 1024).
const MAX_NODE: u32 = 1023;
/// Pages asked about per `move_pages` call, and at most this many samples
/// for one status.
const PAGESTAT_BATCH: usize = 4096;
const PAGESTAT_SAMPLES: usize = 64 * 1024;

/// How the kernel is told to place pages on the disk's nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum NumaPolicy {
    /// Only on these nodes (ENOSPC-like faults never fall back elsewhere).
    #[default]
    Bind,
    /// On this one node while it has memory, elsewhere after.
    Preferred,
    /// Round-robin over these nodes, page by page.
    Interleave,
}

impl NumaPolicy {
    pub fn parse(s: &str) -> std::result::Result<NumaPolicy, String> {
        match s {
            "bind" => Ok(NumaPolicy::Bind),
            "preferred" => Ok(NumaPolicy::Preferred),
            "interleave" => Ok(NumaPolicy::Interleave),
            _ => Err(format!(
                "unknown NUMA policy {s:?} (valid: bind, preferred, interleave)"
            )),
        }
    }

    fn mode(self) -> libc::c_int {
        match self {
            NumaPolicy::Bind => libc::MPOL_BIND,
            NumaPolicy::Preferred => libc::MPOL_PREFERRED,
            NumaPolicy::Interleave => libc::MPOL_INTERLEAVE,
        }
    }
}

impl std::fmt::Display for NumaPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NumaPolicy::Bind => "bind",
            NumaPolicy::Preferred => "preferred",
            NumaPolicy::Interleave => "interleave",
        })
    }
}

/// A list in numactl's syntax (`0-1,3`), as a set of numbers.
pub fn parse_list(s: &str) -> std::result::Result<BTreeSet<u32>, String> {
    let bad = |why: &str| format!("bad node list {s:?}: {why} (numactl syntax: 0-1,3)");
    let mut out = BTreeSet::new();
    if s.trim().is_empty() {
        return Err(bad("empty"));
    }
    for part in s.trim().split(',') {
        let num = |t: &str| -> std::result::Result<u32, String> {
            let t = t.trim();
            t.parse::<u32>()
                .ok()
                .filter(|&n| n <= MAX_NODE)
                .ok_or_else(|| bad(&format!("{t:?} is not a node number 0..={MAX_NODE}")))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(bad(&format!("range {a}-{b} runs backwards")));
                }
                out.extend(a..=b);
            }
            None => {
                out.insert(num(part)?);
            }
        }
    }
    Ok(out)
}

/// One node of the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub cpus: BTreeSet<u32>,
    /// MemTotal of the node, in bytes (0: a memoryless node).
    pub mem_total: u64,
}

/// The host's nodes, read from sysfs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    pub nodes: BTreeMap<u32, Node>,
}

impl Topology {
    /// The host's own (`/sys/devices/system/node`).
    pub fn host() -> Result<Topology> {
        Topology::read(Path::new("/sys/devices/system/node"))
    }

    /// Every `nodeN` directory under `root`: `cpulist` and `meminfo`'s
    /// MemTotal. A machine without NUMA support has no such tree: then it
    /// is one node 0 with every CPU and all memory.
    pub fn read(root: &Path) -> Result<Topology> {
        let mut nodes = BTreeMap::new();
        let Ok(dir) = std::fs::read_dir(root) else {
            return Ok(Topology::single());
        };
        for e in dir.flatten() {
            let name = e.file_name();
            let Some(n) = name
                .to_str()
                .and_then(|n| n.strip_prefix("node"))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let path = e.path();
            let read = |f: &str| {
                std::fs::read_to_string(path.join(f)).map_err(|e| Error::file(path.join(f), e))
            };
            let cpulist = read("cpulist")?;
            let cpus = match cpulist.trim() {
                "" => BTreeSet::new(),
                l => parse_list_any(l).map_err(|why| {
                    Error::Invalid(format!("{}: {why}", path.join("cpulist").display()))
                })?,
            };
            let meminfo = read("meminfo")?;
            let mem_total = meminfo
                .lines()
                .find_map(|l| l.split_once("MemTotal:").map(|(_, v)| v))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map_or(0, |k| k * 1024);
            nodes.insert(n, Node { cpus, mem_total });
        }
        if nodes.is_empty() {
            return Ok(Topology::single());
        }
        Ok(Topology { nodes })
    }

    fn single() -> Topology {
        let cpus =
            (0..std::thread::available_parallelism().map_or(1, |n| n.get()) as u32).collect();
        let mem_total = crate::sys::mem_total().unwrap_or(0);
        Topology {
            nodes: BTreeMap::from([(0, Node { cpus, mem_total })]),
        }
    }

    /// Nodes that have memory: the default set of a placement.
    pub fn memory_nodes(&self) -> BTreeSet<u32> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.mem_total > 0)
            .map(|(&id, _)| id)
            .collect()
    }
}

/// CPU lists are numactl lists too, but may name CPUs beyond MAX_NODE.
fn parse_list_any(s: &str) -> std::result::Result<BTreeSet<u32>, String> {
    let mut out = BTreeSet::new();
    for part in s.split(',') {
        let num = |t: &str| {
            t.trim()
                .parse::<u32>()
                .map_err(|_| format!("bad CPU list {s:?}"))
        };
        match part.split_once('-') {
            Some((a, b)) => out.extend(num(a)?..=num(b)?),
            None => {
                out.insert(num(part)?);
            }
        }
    }
    Ok(out)
}

/// Where a disk's page memory goes, checked against a topology.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub policy: NumaPolicy,
    pub nodes: BTreeSet<u32>,
    /// The CPUs of those nodes.
    pub cpus: BTreeSet<u32>,
}

impl Placement {
    /// `nodes` (default: every node with memory) under `policy`, checked
    /// against `topo`: every error names the node and what is wrong.
    pub fn new(
        policy: NumaPolicy,
        nodes: Option<&BTreeSet<u32>>,
        topo: &Topology,
    ) -> Result<Placement> {
        let have = || {
            topo.nodes
                .iter()
                .map(|(id, n)| format!("{id} ({})", crate::units::human(n.mem_total)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let nodes = match nodes {
            Some(n) => n.clone(),
            None => topo.memory_nodes(),
        };
        for id in &nodes {
            match topo.nodes.get(id) {
                None => {
                    return Err(Error::Invalid(format!(
                        "--numa-nodes: node {id} does not exist (this host's nodes: {})",
                        have()
                    )))
                }
                Some(n) if n.mem_total == 0 => {
                    return Err(Error::Invalid(format!(
                        "--numa-nodes: node {id} has no memory (this host's nodes: {})",
                        have()
                    )))
                }
                Some(_) => {}
            }
        }
        if nodes.is_empty() {
            return Err(Error::Invalid("--numa-nodes: no node with memory".into()));
        }
        if policy == NumaPolicy::Preferred && nodes.len() > 1 {
            return Err(Error::Invalid(format!(
                "--numa-policy preferred takes one node, not {} (as numactl --preferred): \
                 use bind or interleave for several",
                nodes.len()
            )));
        }
        let cpus = nodes
            .iter()
            .flat_map(|id| topo.nodes[id].cpus.iter().copied())
            .collect();
        Ok(Placement {
            policy,
            nodes,
            cpus,
        })
    }

    /// `mbind`'s mode, nodemask (one bit per node, in longs) and maxnode.
    /// The kernel reads `maxnode - 1` bits (libnuma passes one more than
    /// the mask's bits too).
    pub fn mbind_args(&self) -> (libc::c_int, Vec<libc::c_ulong>, libc::c_ulong) {
        let bits = libc::c_ulong::BITS;
        let highest = self.nodes.iter().next_back().copied().unwrap_or(0);
        let mut mask = vec![0 as libc::c_ulong; (highest / bits) as usize + 1];
        for &n in &self.nodes {
            mask[(n / bits) as usize] |= 1 << (n % bits);
        }
        let maxnode = (mask.len() as libc::c_ulong) * bits as libc::c_ulong + 1;
        (self.policy.mode(), mask, maxnode)
    }

    /// Applies the policy to `len` bytes at `addr` (not touched yet).
    pub(crate) fn bind(&self, addr: *mut libc::c_void, len: usize) -> std::io::Result<()> {
        let (mode, mask, maxnode) = self.mbind_args();
        // SAFETY: mbind only sets the policy of our own mapping; the mask
        // outlives the call and holds maxnode - 1 bits.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                addr,
                len as libc::c_ulong,
                mode as libc::c_ulong,
                mask.as_ptr(),
                maxnode,
                0 as libc::c_uint,
            )
        };
        match rc {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    }

    /// Binds a probe mapping once: a policy the kernel refuses (no
    /// `mbind` in a container, a node it will not use) fails here, at start.
    pub fn probe(&self) -> Result<()> {
        let p = crate::sys::map_anonymous(PAGE_SIZE, 0)
            .map_err(|err| Error::Os {
                what: "mmap of a NUMA probe page",
                err,
            })?
            .as_ptr()
            .cast::<libc::c_void>();
        let r = self.bind(p, PAGE_SIZE);
        // SAFETY: ours, untouched.
        unsafe { libc::munmap(p, PAGE_SIZE) };
        r.map_err(|e| {
            Error::Invalid(format!(
                "--numa-policy {} on nodes {}: the kernel refuses it (mbind: {e})",
                self.policy,
                list_text(&self.nodes)
            ))
        })
    }

    /// Runs the calling thread (and every thread it starts later) on the
    /// CPUs of the disk's nodes. A node without CPUs leaves it as it is.
    pub fn pin_current_thread(&self) -> std::io::Result<()> {
        if self.cpus.is_empty() {
            return Ok(());
        }
        // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET stays in it
        // for CPUs below CPU_SETSIZE, which we check.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &c in &self.cpus {
                if (c as usize) < libc::CPU_SETSIZE as usize {
                    libc::CPU_SET(c as usize, &mut set);
                }
            }
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// Memory `nodes` could give (MemFree plus file pages and reclaimable
/// slab: what MemAvailable counts, without its watermarks) and their
/// MemTotal, together, in bytes, from the host's sysfs; `None` if a node's
/// meminfo cannot be read.
pub(crate) fn nodes_memory(nodes: &BTreeSet<u32>) -> Option<(u64, u64)> {
    let (mut free, mut total) = (0, 0);
    for n in nodes {
        let text =
            std::fs::read_to_string(format!("/sys/devices/system/node/node{n}/meminfo")).ok()?;
        let field = |key: &str| {
            text.lines()
                .find_map(|l| l.split_once(key).map(|(_, v)| v))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|k| k * 1024)
        };
        free += field("MemFree:")?
            + field("Active(file):").unwrap_or(0)
            + field("Inactive(file):").unwrap_or(0)
            + field("SReclaimable:").unwrap_or(0);
        total += field("MemTotal:")?;
    }
    Some((free, total))
}

/// `0-1,3` from a set.
pub fn list_text(set: &BTreeSet<u32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut it = set.iter().copied().peekable();
    while let Some(a) = it.next() {
        let mut b = a;
        while it.peek() == Some(&(b + 1)) {
            b = it.next().expect("peeked");
        }
        out.push(if a == b {
            a.to_string()
        } else {
            format!("{a}-{b}")
        });
    }
    out.join(",")
}

/// Resident pages per node of the ranges `[base, base + len)`, as the
/// kernel answers `move_pages` with no target nodes. Above
/// `PAGESTAT_SAMPLES` pages every n-th page is asked and the counts are
/// scaled (the second value says so: 1 = every page).
pub(crate) fn pages_per_node(ranges: &[(usize, usize)]) -> (BTreeMap<u32, u64>, u64) {
    let total: usize = ranges.iter().map(|&(_, len)| len / PAGE_SIZE).sum();
    let step = total.div_ceil(PAGESTAT_SAMPLES).max(1);
    let addrs: Vec<*mut libc::c_void> = sample(ranges, step)
        .into_iter()
        .map(|a| a as *mut libc::c_void)
        .collect();
    let mut out = BTreeMap::new();
    let mut status = vec![0 as libc::c_int; PAGESTAT_BATCH];
    for batch in addrs.chunks(PAGESTAT_BATCH) {
        // SAFETY: with nodes NULL, move_pages moves nothing: it writes each
        // page's node (or -errno: not present, not mapped) into `status`,
        // which has room for the batch.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_move_pages,
                0 as libc::pid_t,
                batch.len() as libc::c_ulong,
                batch.as_ptr(),
                std::ptr::null::<libc::c_int>(),
                status.as_mut_ptr(),
                0 as libc::c_int,
            )
        };
        if rc != 0 {
            continue;
        }
        count_nodes(&status[..batch.len()], step as u64, &mut out);
    }
    (out, step as u64)
}

/// Every `step`-th page of `ranges` taken end to end, not the first of each
/// range: arenas fill from their start, so those would all be resident and
/// overstate a sparse tail.
fn sample(ranges: &[(usize, usize)], step: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut seen = 0;
    for &(base, len) in ranges {
        let pages = len / PAGE_SIZE;
        let mut i = (step - seen % step) % step;
        while i < pages {
            out.push(base + i * PAGE_SIZE);
            i += step;
        }
        seen += pages;
    }
    out
}

/// Adds `weight` per page to its node; negative answers (page not
/// resident) count nowhere.
fn count_nodes(status: &[libc::c_int], weight: u64, out: &mut BTreeMap<u32, u64>) {
    for &s in status {
        if s >= 0 {
            *out.entry(s as u32).or_default() += weight;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `/sys/devices/system/node`: (node, cpulist, MemTotal kB).
    fn fake(nodes: &[(u32, &str, u64)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for &(n, cpus, kb) in nodes {
            let d = dir.path().join(format!("node{n}"));
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("cpulist"), format!("{cpus}\n")).unwrap();
            std::fs::write(
                d.join("meminfo"),
                format!("Node {n} MemTotal:       {kb} kB\nNode {n} MemFree:        1 kB\n"),
            )
            .unwrap();
        }
        // Files beside the node directories, as on a host.
        std::fs::write(dir.path().join("possible"), "0-3\n").unwrap();
        std::fs::create_dir(dir.path().join("power")).unwrap();
        dir
    }

    fn set(v: &[u32]) -> BTreeSet<u32> {
        v.iter().copied().collect()
    }

    #[test]
    fn lists_parse_as_numactl_writes_them() {
        assert_eq!(parse_list("0-1,3").unwrap(), set(&[0, 1, 3]));
        assert_eq!(parse_list(" 2 ").unwrap(), set(&[2]));
        assert_eq!(parse_list("1,1,0-1").unwrap(), set(&[0, 1]));
        for bad in ["", "1-", "-1", "3-1", "a", "0,,1", "1024", "0-2000", "1.5"] {
            let e = parse_list(bad).unwrap_err();
            assert!(e.contains("numactl syntax"), "{bad:?}: {e}");
        }
        assert_eq!(list_text(&set(&[0, 1, 3, 5, 6, 7])), "0-1,3,5-7");
        assert_eq!(parse_list(&list_text(&set(&[4, 9]))).unwrap(), set(&[4, 9]));
    }

    #[test]
    fn topologies_of_one_two_and_four_nodes() {
        let one = fake(&[(0, "0-1", 4 << 20)]);
        let t = Topology::read(one.path()).unwrap();
        assert_eq!(t.nodes.len(), 1);
        assert_eq!(t.nodes[&0].cpus, set(&[0, 1]));
        assert_eq!(t.nodes[&0].mem_total, 4 << 30);

        let two = fake(&[(0, "0-3", 8 << 20), (1, "4-7", 8 << 20)]);
        let t = Topology::read(two.path()).unwrap();
        assert_eq!(t.memory_nodes(), set(&[0, 1]));
        let p = Placement::new(NumaPolicy::Bind, Some(&set(&[1])), &t).unwrap();
        assert_eq!(p.cpus, set(&[4, 5, 6, 7]));
        assert_eq!(p.mbind_args(), (libc::MPOL_BIND, vec![0b10], 65));

        // Node 2 has CPUs but no memory (as a CPU-only socket or a CXL
        // node before onlining); node 3 memory but no CPUs.
        let four = fake(&[
            (0, "0-1", 4 << 20),
            (1, "2-3", 4 << 20),
            (2, "4-5", 0),
            (3, "", 4 << 20),
        ]);
        let t = Topology::read(four.path()).unwrap();
        assert_eq!(t.memory_nodes(), set(&[0, 1, 3]));
        // The default: every node with memory.
        let p = Placement::new(NumaPolicy::Interleave, None, &t).unwrap();
        assert_eq!(p.nodes, set(&[0, 1, 3]));
        assert_eq!(p.mbind_args(), (libc::MPOL_INTERLEAVE, vec![0b1011], 65));
        assert_eq!(p.cpus, set(&[0, 1, 2, 3]));
        // A memory-only node leaves threads where they are.
        let p = Placement::new(NumaPolicy::Preferred, Some(&set(&[3])), &t).unwrap();
        assert!(p.cpus.is_empty());
        assert_eq!(p.mbind_args(), (libc::MPOL_PREFERRED, vec![0b1000], 65));

        let e = Placement::new(NumaPolicy::Bind, Some(&set(&[2])), &t).unwrap_err();
        assert!(e.to_string().contains("node 2 has no memory"), "{e}");
        let e = Placement::new(NumaPolicy::Bind, Some(&set(&[0, 7])), &t).unwrap_err();
        assert!(e.to_string().contains("node 7 does not exist"), "{e}");
        assert!(
            e.to_string().contains("0 (4G), 1 (4G), 2 (0B), 3 (4G)"),
            "{e}"
        );
        let e = Placement::new(NumaPolicy::Preferred, Some(&set(&[0, 1])), &t).unwrap_err();
        assert!(e.to_string().contains("preferred takes one node"), "{e}");
    }

    #[test]
    fn high_node_numbers_need_more_mask_words() {
        let t = Topology {
            nodes: BTreeMap::from([
                (
                    1,
                    Node {
                        cpus: set(&[0]),
                        mem_total: 1,
                    },
                ),
                (
                    70,
                    Node {
                        cpus: set(&[1]),
                        mem_total: 1,
                    },
                ),
            ]),
        };
        let p = Placement::new(NumaPolicy::Bind, None, &t).unwrap();
        assert_eq!(p.mbind_args(), (libc::MPOL_BIND, vec![0b10, 1 << 6], 129));
    }

    #[test]
    fn counting_pages_per_node() {
        let mut out = BTreeMap::new();
        count_nodes(&[0, 1, 1, -libc::ENOENT, 3, -libc::EFAULT], 4, &mut out);
        assert_eq!(out, BTreeMap::from([(0, 4), (1, 8), (3, 4)]));
    }

    #[test]
    fn pinning_a_thread_sets_its_cpus() {
        let topo = Topology::host().unwrap();
        let first = *topo.memory_nodes().iter().next().unwrap();
        let p = Placement::new(NumaPolicy::Bind, Some(&set(&[first])), &topo).unwrap();
        let got = std::thread::spawn(move || {
            p.pin_current_thread().unwrap();
            // A thread started now inherits the set.
            std::thread::spawn(|| {
                // SAFETY: sched_getaffinity fills the set we pass.
                unsafe {
                    let mut s: libc::cpu_set_t = std::mem::zeroed();
                    assert_eq!(
                        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut s),
                        0
                    );
                    (0..libc::CPU_SETSIZE as usize)
                        .filter(|&c| libc::CPU_ISSET(c, &s))
                        .map(|c| c as u32)
                        .collect::<BTreeSet<u32>>()
                }
            })
            .join()
            .unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(got, topo.nodes[&first].cpus);
    }

    #[test]
    fn sampling_spreads_over_the_ranges() {
        // Three 10-page ranges, every 4th page: pages 0, 4, 8 | 12, 16 | 20, 24, 28.
        let page = PAGE_SIZE;
        let ranges = [
            (0x10000000, 10 * page),
            (0x20000000, 10 * page),
            (0x30000000, 10 * page),
        ];
        let mut want = vec![];
        for g in (0..30).step_by(4) {
            let (r, i) = (g / 10, g % 10);
            want.push(ranges[r].0 + i * page);
        }
        let got = sample(&ranges, 4);
        assert_eq!(got, want);
        assert_eq!(sample(&ranges, 1).len(), 30);
        assert_eq!(sample(&ranges, 100), vec![ranges[0].0]);
    }

    #[test]
    fn no_sysfs_tree_is_one_node() {
        let t = Topology::read(Path::new("/nonexistent/node")).unwrap();
        assert_eq!(t.memory_nodes(), set(&[0]));
    }

    #[test]
    fn this_hosts_memory_is_where_the_kernel_says() {
        let topo = Topology::host().unwrap();
        let first = *topo.memory_nodes().iter().next().unwrap();
        let p = Placement::new(NumaPolicy::Bind, Some(&set(&[first])), &topo).unwrap();
        p.probe().unwrap();
        let (free, total) = nodes_memory(&p.nodes).unwrap();
        assert!(free > 0 && free <= total, "{free} of {total}");
        let len = 64 * PAGE_SIZE;
        // SAFETY: a fresh private anonymous mapping, unmapped below.
        let m = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(m, libc::MAP_FAILED);
        p.bind(m, len).unwrap();
        // SAFETY: ours; touch the first half only.
        unsafe { (m as *mut u8).write_bytes(1, len / 2) };
        let (per_node, step) = pages_per_node(&[(m as usize, len)]);
        assert_eq!(step, 1);
        assert_eq!(per_node, BTreeMap::from([(first, 32)]));
        // SAFETY: ours.
        unsafe { libc::munmap(m, len) };
    }
}
