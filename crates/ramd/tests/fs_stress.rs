//! Many threads creating, writing, renaming, linking and unlinking in shared
//! directories of one filesystem disk at once, then the tree checked against
//! a model: every name where the model says, with its content and link
//! count, and nothing else. Each thread owns its names (so the end state is
//! known) but all of them share the directories, the inode table and the
//! store.

mod common;
mod fs_common;

use common::wait_until;
use fs_common::*;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::thread;

const THREADS: usize = 8;
const OPS: usize = 1500;
const DIRS: usize = 4;
/// How long the kernel may take to forget unlinked inodes.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(20);

/// The harness's xorshift64*, one seed per thread: a failure replays.
use common::Rng;

/// A random index below `n`.
fn index(rng: &mut Rng, n: usize) -> usize {
    rng.below(n as u64) as usize
}

/// What one thread believes: each of its inodes (by a number of its own)
/// with its content, and the names (directory, name) linking to it.
#[derive(Default)]
struct Model {
    content: BTreeMap<usize, Vec<u8>>,
    names: BTreeMap<(usize, String), usize>,
}

fn dir(root: &Path, d: usize) -> PathBuf {
    root.join(format!("d{d}"))
}

fn content(t: usize, id: usize, op: usize, rng: &mut Rng) -> Vec<u8> {
    // Lengths across page boundaries, some empty.
    let len = index(rng, 3 * 4096 + 1);
    let mut v = format!("{t}:{id}:{op}:").into_bytes();
    v.resize(len.max(v.len()), (op % 251) as u8);
    v
}

fn worker(root: &Path, t: usize) -> Model {
    let mut rng = Rng::new(t as u64 + 1);
    let mut m = Model::default();
    let mut next_id = 0;
    let mut next_name = 0;
    for op in 0..OPS {
        let names: Vec<(usize, String)> = m.names.keys().cloned().collect();
        let pick = |rng: &mut Rng| names[index(rng, names.len())].clone();
        let choice = if names.is_empty() {
            0
        } else {
            index(&mut rng, 6)
        };
        match choice {
            // create
            0 => {
                let d = index(&mut rng, DIRS);
                let name = format!("t{t}-{next_name}");
                next_name += 1;
                let data = content(t, next_id, op, &mut rng);
                fs::write(dir(root, d).join(&name), &data).unwrap();
                m.content.insert(next_id, data);
                m.names.insert((d, name), next_id);
                next_id += 1;
            }
            // overwrite through one of its names
            1 => {
                let (d, name) = pick(&mut rng);
                let id = m.names[&(d, name.clone())];
                let data = content(t, id, op, &mut rng);
                fs::write(dir(root, d).join(&name), &data).unwrap();
                m.content.insert(id, data);
            }
            // rename, maybe over another of its own names
            2 | 3 => {
                let (d, name) = pick(&mut rng);
                let nd = index(&mut rng, DIRS);
                let target = if index(&mut rng, 4) == 0 {
                    pick(&mut rng)
                } else {
                    next_name += 1;
                    (nd, format!("t{t}-{}", next_name - 1))
                };
                if target == (d, name.clone()) {
                    continue;
                }
                let id = m.names[&(d, name.clone())];
                fs::rename(
                    dir(root, d).join(&name),
                    dir(root, target.0).join(&target.1),
                )
                .unwrap();
                // Renaming onto another name of the same inode leaves both.
                if m.names.get(&target) != Some(&id) {
                    m.names.remove(&(d, name));
                    if let Some(old) = m.names.insert(target, id) {
                        forget_if_unlinked(&mut m, old);
                    }
                }
            }
            // hard link
            4 => {
                let (d, name) = pick(&mut rng);
                let nd = index(&mut rng, DIRS);
                let new = format!("t{t}-{next_name}");
                next_name += 1;
                fs::hard_link(dir(root, d).join(&name), dir(root, nd).join(&new)).unwrap();
                let id = m.names[&(d, name)];
                m.names.insert((nd, new), id);
            }
            // unlink
            _ => {
                let (d, name) = pick(&mut rng);
                fs::remove_file(dir(root, d).join(&name)).unwrap();
                let id = m.names.remove(&(d, name)).unwrap();
                forget_if_unlinked(&mut m, id);
            }
        }
    }
    m
}

fn forget_if_unlinked(m: &mut Model, id: usize) {
    if !m.names.values().any(|&i| i == id) {
        m.content.remove(&id);
    }
}

#[test]
fn concurrent_tree_changes_match_a_model() {
    let disk = FsDisk::mount(&["--size", "256M"]);
    let root = disk.path().to_path_buf();
    for d in 0..DIRS {
        fs::create_dir(dir(&root, d)).unwrap();
    }
    let models: Vec<Model> = thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let root = &root;
                s.spawn(move || worker(root, t))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // What the model says must be there, with its content and link count.
    let mut want: BTreeMap<(usize, String), (Vec<u8>, usize)> = BTreeMap::new();
    for m in &models {
        for ((d, name), id) in &m.names {
            let links = m.names.values().filter(|&i| i == id).count();
            want.insert((*d, name.clone()), (m.content[id].clone(), links));
        }
    }
    let mut found = 0;
    for d in 0..DIRS {
        for e in fs::read_dir(dir(&root, d)).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let Some((data, links)) = want.get(&(d, name.clone())) else {
                panic!("d{d}/{name} exists; the model has no such name");
            };
            let meta = e.metadata().unwrap();
            assert_eq!(meta.nlink() as usize, *links, "d{d}/{name}: link count");
            assert_eq!(&fs::read(e.path()).unwrap(), data, "d{d}/{name}: content");
            found += 1;
        }
    }
    assert_eq!(found, want.len(), "names the model has are missing");
    // Inodes: the model's files plus the root and the directories, once
    // the kernel has forgotten the unlinked ones (it does so lazily).
    let inodes: usize = models.iter().map(|m| m.content.len()).sum();
    let expect = (inodes + 1 + DIRS) as u64;
    wait_until(SETTLE, "df -i to count the model's inodes", || {
        df(disk.path()).iused == expect
    });
    disk.stop();
}
