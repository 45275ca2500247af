//! The steps of [`super::Disk::open`] that build a disk's parts from its
//! settings: checks across settings, the store's configuration and NUMA
//! placement, the filesystem (with its cold tier), saving, background
//! work, and the run directory.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use parking_lot::Mutex;

use ramd_fs::{Fs, FsConfig};
use ramd_store::numa::Placement;
use ramd_store::persist::{DiskKind, ImageDir};
use ramd_store::{Codec, ScanHandle, Store, StoreConfig, PAGE_SIZE};

use super::{Saving, Shared};
use crate::args::{DataPath, DiskArgs};
use ramd_store::human;
use ramd_store::persist::FlushMode;
use ramd_store::persist::{self, Persister};

/// Settings that are wrong together, caught before anything is built.
pub(super) fn check_args(args: &DiskArgs) -> Result<()> {
    if args.autosave.is_some_and(|d| d.is_zero()) {
        bail!("--autosave must be longer than 0s");
    }
    if args.image.is_none() && args.flush == FlushMode::Persist {
        bail!("--flush persist needs --image DIR: a flush has nowhere to persist to");
    }
    if args.standby {
        if args.standby_poll.is_zero() {
            bail!("--standby-poll must be longer than 0s");
        }
        match &args.image {
            Some(i) if persist::is_url(i) => {}
            Some(i) => bail!(
                "--standby --image {}: a standby follows an image in object storage \
                 (s3://BUCKET/PREFIX), whose lease it can take over at promotion; a directory \
                 has no lease (a second ramd on one directory is refused while the first \
                 holds it)",
                i.display()
            ),
            None => bail!("--standby needs --image s3://BUCKET/PREFIX: the image to follow"),
        }
        if args.fuse.mount.is_some() && args.fuse.data_path == DataPath::Kernel {
            bail!(
                "--standby with --data-path kernel: a standby serves file data from the store, \
                 where each applied save puts it (the kernel path keeps it in backing files the \
                 kernel reads directly); leave --data-path out or give store"
            );
        }
        if let Some(url) = &args.replicate {
            bail!(
                "--standby with --replicate {url}: a standby saves nothing until promoted, \
                 and its image is in object storage already"
            );
        }
        if args.read_only {
            bail!(
                "--standby with --read-only: a standby is read-only until promoted, and \
                 writable after; leave --read-only out"
            );
        }
    }
    if let (Some(url), Some(image)) = (&args.replicate, &args.image) {
        if !persist::is_url(Path::new(url)) {
            bail!(
                "--replicate {url}: not an object-storage URL: give s3://BUCKET/PREFIX (a \
                 second directory is no replica: it dies with the host)"
            );
        }
        if image.as_os_str() == url.as_str() {
            bail!("--replicate {url} is the disk's --image itself: give another prefix");
        }
        if persist::is_url(image) {
            bail!(
                "--replicate {url} needs --image DIR, a local directory: image {} is in object \
                 storage already",
                image.display()
            );
        }
    }
    Ok(())
}

/// The store's settings for this disk.
pub(super) fn store_config(
    args: &DiskArgs,
    kind: DiskKind,
    size: Option<u64>,
    loading: bool,
    shared: &Shared,
    placement: &Option<Placement>,
) -> StoreConfig {
    let base = StoreConfig {
        warm_pool: args.warm_pool,
        host_reserve: shared.host_reserve,
        track_changes: args.image.is_some(),
        shared_budget: shared.budget.clone(),
        compress: args.compress,
        compress_after: args.compress_after.unwrap_or_default(),
        recompress: args.recompress,
        idle_after: args.idle_after,
        memory: ramd_store::MemoryPolicy {
            mlock: args.mlock,
            numa: placement.clone(),
            huge_pages: args.huge_pages,
        },
        ..StoreConfig::new(size.unwrap_or(ramd_store::MAX_SIZE))
    };
    match kind {
        DiskKind::Block => {
            let size = size.expect("a block disk has a size");
            StoreConfig {
                max_memory: args
                    .max_memory
                    .or(loading.then(|| ramd_store::default_max_memory(size, true))),
                ..base
            }
        }
        DiskKind::Fs => {
            let max_memory = args
                .max_memory
                .unwrap_or_else(|| fs_max_memory(args, size, loading));
            let base = match crate::frontends::fuse::data_path(args).0 {
                // File data is in the tmpfs, or compressed in the cold
                // tier's own store: this one holds none.
                DataPath::Kernel => StoreConfig {
                    compress: Codec::None,
                    compress_after: Duration::ZERO,
                    ..base
                },
                DataPath::Store | DataPath::Auto => base,
            };
            StoreConfig {
                max_memory: Some(max_memory),
                page_limit: size.map(|n| n.div_ceil(PAGE_SIZE as u64)),
                size: ramd_store::MAX_SIZE,
                ..base
            }
        }
    }
}

/// How long a closed file of `--data-path kernel --compress` stays
/// untouched before it moves to the cold tier, if --compress-after does
/// not say.
pub const COLD_AFTER: Duration = Duration::from_secs(60);

/// `--data-path kernel --compress`: the cold tier, a store of its own
/// (compressed as pages are written, never saved: a save reads cold files
/// from it as file data), under the disk's memory budget and the daemon's.
pub(super) fn start_cold_tier(
    args: &DiskArgs,
    fs: &Arc<Fs>,
    size: Option<u64>,
    shared: &Shared,
    placement: &Option<Placement>,
) -> Result<()> {
    if crate::frontends::fuse::data_path(args).0 != DataPath::Kernel || args.compress.is_none() {
        return Ok(());
    }
    let cfg = StoreConfig {
        warm_pool: args.warm_pool,
        host_reserve: shared.host_reserve,
        shared_budget: shared.budget.clone(),
        compress: args.compress,
        max_memory: Some(
            args.max_memory
                .unwrap_or_else(|| fs_max_memory(args, size, false)),
        ),
        memory: ramd_store::MemoryPolicy {
            mlock: args.mlock,
            numa: placement.clone(),
            huge_pages: args.huge_pages,
        },
        ..StoreConfig::new(ramd_store::MAX_SIZE)
    };
    let after = args.compress_after.unwrap_or(COLD_AFTER);
    let store = Arc::new(Store::new(cfg)?);
    fs.set_cold_tier(store, after)
        .map_err(|e| anyhow::anyhow!("--data-path kernel: the cold tier: errno {}", e.get()))?;
    log::info!(
        "disk {:?}: closed files untouched {after:?} move to the cold tier, compressed with {}",
        args.name,
        args.compress
    );
    Ok(())
}

/// A filesystem disk's default budget: every page of `size`, plus room for
/// the page tables of many small files and for inodes and names (1/8 of
/// size, ≥ 64 MiB). ramfs mode: the host's memory, still guarded by the
/// host reserve. `loaded`: it may hold compressed pages from an image.
pub(super) fn fs_max_memory(args: &DiskArgs, size: Option<u64>, loaded: bool) -> u64 {
    let compressed = args.compresses() || loaded;
    match size {
        Some(n) => {
            ramd_store::default_max_memory(n, compressed).saturating_add((n / 8).max(64 << 20))
        }
        None => mem_total(),
    }
}

/// The disk's NUMA placement, if --numa-nodes or --numa-policy asks for
/// one: checked against the host's nodes and probed with a real `mbind`,
/// so every mistake fails here, at start.
pub(super) fn placement(args: &DiskArgs) -> Result<Option<Placement>> {
    if args.numa_nodes.is_none() && args.numa_policy.is_none() {
        return Ok(None);
    }
    let topo = ramd_store::numa::Topology::host()?;
    let p = Placement::new(
        args.numa_policy.unwrap_or_default(),
        args.numa_nodes.as_ref(),
        &topo,
    )?;
    p.probe()?;
    log::info!(
        "disk {:?}: page memory {} on NUMA node(s) {}, serving threads on CPU(s) {}",
        args.name,
        p.policy,
        ramd_store::numa::list_text(&p.nodes),
        match p.cpus.is_empty() {
            true => "anywhere (the nodes have none)".to_string(),
            false => ramd_store::numa::list_text(&p.cpus),
        }
    );
    Ok(Some(p))
}

pub(super) fn mem_total() -> u64 {
    ramd_store::mem_total().unwrap_or(1 << 30)
}

/// The filesystem of an `fs` disk: loaded from its image, or new.
pub(super) fn open_fs(
    args: &DiskArgs,
    store: &Arc<Store>,
    size: Option<u64>,
    image: Option<(ImageDir, u64)>,
    load_progress: super::LoadProgress,
) -> Result<(Fs, Option<ImageDir>, Option<Vec<u8>>)> {
    let cfg = FsConfig {
        size,
        nr_inodes: args
            .fuse
            .nr_inodes
            .unwrap_or(mem_total() / PAGE_SIZE as u64 / 2),
        mode: args.fuse.mode,
        uid: args.fuse.uid,
        gid: args.fuse.gid,
        atime: args.fuse.atime(),
    };
    // `--data-path kernel`: file data in a private kernel tmpfs, made
    // before a load, which writes into it.
    let tier = match crate::frontends::fuse::data_path(args).0 {
        DataPath::Kernel => Some(
            ramd_fs::hot::HotTier::new(&crate::frontends::fuse::hot_config(args, &cfg))
                .context("--data-path kernel: making the private tmpfs for file data")?,
        ),
        DataPath::Store | DataPath::Auto => None,
    };
    match (image, tier) {
        (Some((image, _)), Some(tier)) if image.manifest().is_some() => {
            let (fs, tree) = Fs::load_kernel(store.clone(), cfg, tier, &image)?;
            Ok((fs, Some(image), Some(tree)))
        }
        (Some((image, _)), None) if image.manifest().is_some() => {
            let tree =
                persist::load(&image, store, &mut load_progress())?.expect("fs images have a tree");
            let fs = Fs::load(store.clone(), cfg, &tree).map_err(|e| {
                anyhow::anyhow!("loading image {}: the tree: {e}", image.path().display())
            })?;
            Ok((fs, Some(image), Some(tree)))
        }
        (image, tier) => {
            let fs = Fs::new(store.clone(), cfg)
                .map_err(|e| anyhow::anyhow!("creating the filesystem: errno {}", e.get()))?;
            if let Some(tier) = tier {
                fs.set_hot_tier(tier).map_err(|e| {
                    anyhow::anyhow!("--data-path kernel: setting the tier up: errno {}", e.get())
                })?;
            }
            Ok((fs, image.map(|(i, _)| i), None))
        }
    }
}

/// Sets up saving: the persister, the store's flush hook with --flush
/// persist, and the save thread.
pub(super) fn start_saving(
    args: &DiskArgs,
    store: &Arc<Store>,
    image: ImageDir,
    kind: DiskKind,
    size: Option<u64>,
    fs: &Option<Arc<Fs>>,
    loaded_tree: Option<Vec<u8>>,
) -> Result<Saving> {
    let persist = args.flush == FlushMode::Persist;
    // Before any save: a replica that is refused (another writer holds
    // it, it holds another disk) stops the start.
    let replica = match &args.replicate {
        Some(url) => Some(persist::Replica::start(Path::new(url), &image)?),
        None => None,
    };
    let mut p = Persister::new(
        store.clone(),
        image,
        kind,
        size.unwrap_or(0),
        args.autosave,
        persist,
    );
    if let Some(r) = replica {
        p.set_replica(r);
    }
    if args.standby {
        p.set_standby(args.standby_poll);
    }
    if let Some(fs) = fs {
        if let Some(outer) = fs.outer_pages() {
            p.set_outer(outer);
        }
        if args.standby {
            p.set_follow_tree(Box::new(ramd_fs::fs::StandbyTree(fs.clone())));
        }
        let fs = fs.clone();
        p.set_meta(Box::new(move || fs.save_meta()), loaded_tree.as_deref());
    }
    let p = Arc::new(p);
    if persist {
        // Weak: the store must not keep its own persister alive.
        let weak = Arc::downgrade(&p);
        store.set_flush_hook(Box::new(move || match weak.upgrade() {
            Some(p) => p.flush(),
            None => Ok(()),
        }));
    }
    let thread = p.start().context("starting the save thread")?;
    Ok(Saving {
        persister: p,
        thread: Mutex::new(thread),
    })
}

/// Background compression and compaction, if the disk compresses, and the
/// warm pool's decay, on the daemon's shared threads; they run until the
/// returned handle is dropped.
pub(super) fn start_scanner(
    store: &Arc<Store>,
    args: &DiskArgs,
    shared: &Shared,
) -> Option<ScanHandle> {
    if args.compresses() && crate::frontends::fuse::data_path(args).0 == DataPath::Store {
        log::info!(
            "disk {:?}: compression {} ({}), pages idle {:?} {}, {} background thread(s)",
            args.name,
            args.compress,
            match args.compress_after.unwrap_or_default() {
                d if d.is_zero() => "as pages are written".to_string(),
                d => format!("once untouched {d:?}"),
            },
            args.idle_after,
            if args.recompress.is_none() {
                "are kept as they are".to_string()
            } else {
                format!("are re-packed with {}", args.recompress)
            },
            shared.compress_threads
        );
    }
    Some(shared.scanners.add(store.clone()))
}

/// A sparse disk may promise more than the host has (as tmpfs may); say so.
pub(super) fn warn_if_overcommitted(store: &Store, reserve: u64) {
    if let Some(avail) = ramd_store::mem_available() {
        if store.max_memory() > avail {
            let total = ramd_store::mem_total().unwrap_or(0);
            log::warn!(
                "max memory {} exceeds the host's available memory {} (of {} RAM): the disk \
                 is thin, as tmpfs's size= is; writes will get ENOSPC once the host is down \
                 to its reserve of {}",
                human(store.max_memory()),
                human(avail),
                human(total),
                human(reserve)
            );
        }
    }
}

pub fn make_run_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating run directory {}", dir.display()))
}
