//! A filesystem disk's content, the FUSE factory's `prepare` hook: the
//! [`Fs`] over the disk's store (loaded from its image, or new), its
//! kernel data path (the private tmpfs) and cold tier, and the hooks the
//! disk's lifecycle calls on it (saving, status, remount, promotion).

use std::any::Any;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::settings::FuseArgs;
use crate::{Fs, FsConfig};
use ramd_store::persist::{self, Persister};
use ramd_store::{Store, StoreConfig, PAGE_SIZE};

use crate::settings::DataPath;

use super::disk::{data_path, hot_config, FsDisk};
use ramd_frontend::{mem_total, Content, DiskSettings, Prepare, Prepared};

/// How long a closed file of `--data-path kernel --compress` stays
/// untouched before it moves to the cold tier, if --compress-after does
/// not say.
pub const COLD_AFTER: Duration = Duration::from_secs(60);

/// The filesystem, and what its hooks need of the disk's settings.
pub struct FsContent {
    fs: Arc<Fs>,
    mount: Option<PathBuf>,
    /// The kernel's write-back cache: its dirty cap follows the size.
    writeback_cache: bool,
}

/// The filesystem of an `fs` disk: loaded from its image, or new, with
/// its cold tier.
pub(super) fn prepare(args: &FsDisk, p: &Prepare) -> Result<Prepared> {
    let size = p.size;
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
    let tier = match data_path(args).0 {
        DataPath::Kernel => Some(
            crate::hot::HotTier::new(&hot_config(args, &cfg))
                .context("--data-path kernel: making the private tmpfs for file data")?,
        ),
        DataPath::Store | DataPath::Auto => None,
    };
    let store = p.store;
    let (fs, tree) = match (p.image, tier) {
        (Some(image), Some(tier)) => {
            let (fs, tree) = Fs::load_kernel(store.clone(), cfg, tier, image)?;
            (fs, Some(tree))
        }
        (Some(image), None) => {
            let chain = persist::load(image, store, &mut (p.load_progress)())?
                .expect("fs images have a tree");
            let (fs, tree) = Fs::load_chain(store.clone(), cfg, &chain).map_err(|e| {
                anyhow::anyhow!("loading image {}: the tree: {e}", image.path().display())
            })?;
            (fs, Some(tree))
        }
        (None, tier) => {
            let fs = Fs::new(store.clone(), cfg)
                .map_err(|e| anyhow::anyhow!("creating the filesystem: errno {}", e.get()))?;
            if let Some(tier) = tier {
                fs.set_hot_tier(tier).map_err(|e| {
                    anyhow::anyhow!("--data-path kernel: setting the tier up: errno {}", e.get())
                })?;
            }
            (fs, None)
        }
    };
    let fs = Arc::new(fs);
    start_cold_tier(args, &fs, p)?;
    Ok(Prepared {
        content: Arc::new(FsContent {
            fs,
            mount: args.fuse.mount.clone(),
            writeback_cache: args.writeback_cache(),
        }),
        loaded_meta: tree,
    })
}

/// `--data-path kernel --compress`: the cold tier, a store of its own
/// (compressed as pages are written, never saved: a save reads cold files
/// from it as file data), under the disk's memory budget and the daemon's.
fn start_cold_tier(args: &FsDisk, fs: &Arc<Fs>, p: &Prepare) -> Result<()> {
    if data_path(args).0 != DataPath::Kernel || args.store.compress.is_none() {
        return Ok(());
    }
    let cfg = StoreConfig {
        warm_pool: args.store.warm_pool,
        host_reserve: p.host_reserve,
        shared_budget: p.budget.clone(),
        compress: args.store.compress,
        max_memory: Some(
            args.store
                .max_memory
                .unwrap_or_else(|| args.store.fs_max_memory(p.size, false)),
        ),
        memory: ramd_store::MemoryPolicy {
            mlock: args.store.mlock,
            numa: p.placement.cloned(),
            huge_pages: args.store.huge_pages,
        },
        ..StoreConfig::new(ramd_store::MAX_SIZE)
    };
    let after = args.store.compress_after.unwrap_or(COLD_AFTER);
    let store = Arc::new(Store::new(cfg)?);
    fs.set_cold_tier(store, after)
        .map_err(|e| anyhow::anyhow!("--data-path kernel: the cold tier: errno {}", e.get()))?;
    log::info!(
        "disk {:?}: closed files untouched {after:?} move to the cold tier, compressed with {}",
        args.name,
        args.store.compress
    );
    Ok(())
}

impl Content for FsContent {
    fn as_any(&self) -> &(dyn Any + Send + Sync) {
        &self.fs
    }

    fn attach(&self, p: &mut Persister, standby: bool, loaded_meta: Option<&[u8]>) {
        if let Some(outer) = self.fs.outer_pages() {
            p.set_outer(outer);
        }
        if standby {
            p.set_follow_tree(Box::new(crate::fs::StandbyTree::new(
                self.fs.clone(),
                loaded_meta,
            )));
        }
        let fs = self.fs.clone();
        p.set_meta(Box::new(move |full| fs.save_tree(full)));
    }

    fn stores(&self) -> Vec<Arc<Store>> {
        self.fs.cold_store().into_iter().cloned().collect()
    }

    fn size(&self) -> Option<u64> {
        self.fs.size()
    }

    fn pages_used(&self) -> (u64, u64) {
        self.fs.pages_used()
    }

    fn outside_bytes(&self) -> u64 {
        // With the kernel data path, file data is in its tmpfs.
        self.fs.hot_tier().map_or(0, |h| h.used_bytes())
    }

    fn codec(&self) -> Option<String> {
        // With a cold tier, its codec is the disk's (the disk's store
        // holds no file data).
        self.fs.cold_store().map(|c| c.stats().compress)
    }

    fn data_path(&self) -> String {
        match self.fs.hot_tier() {
            Some(_) => "kernel",
            None => "store",
        }
        .to_string()
    }

    fn max_objects(&self) -> u64 {
        self.fs.config().nr_inodes
    }

    fn stats(&self) -> serde_json::Value {
        serde_json::to_value(self.fs.stats()).expect("FsStats is plain data")
    }

    fn read_only(&self) -> Option<bool> {
        crate::mount_read_only(self.mount.as_ref()?)
    }

    fn resize(&self, size: Option<u64>, budget: u64) -> Result<()> {
        self.fs
            .set_size(size)
            .context("resizing the file data's tmpfs")?;
        // The cold tier's store has the same budget of its own.
        if let Some(cold) = self.fs.cold_store() {
            cold.set_limits(None, budget)
                .context("the cold tier's memory budget")?;
        }
        // The kernel's dirty cap and the write reserve follow the size.
        if let (true, Some(dev)) = (
            self.writeback_cache,
            self.mount.as_deref().and_then(crate::mount_device),
        ) {
            self.fs
                .set_write_reserve(super::bdi::limit_dirty(dev, size));
        }
        Ok(())
    }

    fn remount(&self, new: Option<&dyn DiskSettings>) -> String {
        // Without an atime word the rule stays.
        let atime = match new.and_then(|n| n.get::<FuseArgs>()) {
            Some(f) => f.atime(),
            None => self.fs.atime(),
        };
        self.fs.set_atime(atime);
        format!("atime {atime:?}")
    }

    fn promote(&self, disk: &str) -> Result<()> {
        let Some(dir) = &self.mount else {
            return Ok(());
        };
        crate::remount_read_write(dir).with_context(|| {
            format!(
                "promoted: disk {disk:?} is the writer of its image, but its mount {} stays \
                 read-only; make it read-write with `mount -o remount,rw {}`",
                dir.display(),
                dir.display()
            )
        })
    }
}
