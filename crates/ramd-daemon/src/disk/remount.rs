//! `remount`: a mounted filesystem disk's settings changed in place
//! (mount(8)'s `-o remount`).

use anyhow::{bail, Context, Result};

use ramd_store::PAGE_SIZE;

use super::build::fs_max_memory;
use super::Disk;
use crate::args::DiskSize;
use ramd_store::human;

impl Disk {
    /// `mount -o remount,...` of a filesystem disk (the `remount OPTIONS`
    /// control request; the mount helper has already applied the VFS
    /// flags): a new size (growing always; shrinking when what is stored
    /// fits), max_memory, and the atime rule. Other settings may be given
    /// (an fstab line's) but must equal the running ones. Nothing changes
    /// unless everything can.
    pub fn remount(&self, options: &str) -> Result<serde_json::Value> {
        let (Some(fs), Some(dir)) = (&self.fs, &self.args.fuse.mount) else {
            bail!(
                "disk {:?} is not a filesystem disk: nothing to remount",
                self.args.name
            );
        };
        let source = self.args.mount_flags().source;
        let req = crate::mount_opts::parse(&source, dir, options)?;
        let new = &req.disk;
        if self.store.standby() && !new.read_only {
            bail!(
                "disk {:?} is a standby: its mount stays read-only (give `ro`) until `ramd \
                 promote {}` makes it the writer",
                self.args.name,
                self.args.name
            );
        }
        let mut size = fs.size();
        let mut max_memory = self.args.max_memory;
        for key in &req.given {
            match key.as_str() {
                "size" => {
                    size = match new.size {
                        Some(DiskSize::Bytes(n)) => Some(n),
                        _ => None,
                    }
                }
                "max_memory" => max_memory = new.max_memory,
                k => {
                    let (now, asked) = (self.args.setting(k), new.setting(k));
                    if now != asked {
                        bail!(
                            "option {k}: cannot change on a mounted disk (it is {}, asked for {}): \
                             umount it and mount it again",
                            now.unwrap_or_default(),
                            asked.unwrap_or_default()
                        );
                    }
                }
            }
        }
        let resize = req.given.iter().any(|k| k == "size" || k == "max_memory");
        let budget = match max_memory {
            Some(m) => m,
            // The default for the new size, plus whatever the disk was
            // given beyond the default for its old one (an image's slack).
            None => {
                let before = fs_max_memory(&self.args, fs.size(), false);
                let extra = self.store.max_memory().saturating_sub(before);
                fs_max_memory(&self.args, size, false).saturating_add(extra)
            }
        };
        if resize {
            self.store
                .set_limits(size.map(|n| n.div_ceil(PAGE_SIZE as u64)), budget)
                .with_context(|| match size {
                    Some(n) => format!("resizing to {}", human(n)),
                    None => "resizing to unlimited".to_string(),
                })?;
            fs.set_size(size)
                .context("resizing the file data's tmpfs")?;
            // The cold tier's store has the same budget of its own.
            if let Some(cold) = fs.cold_store() {
                cold.set_limits(None, budget)
                    .context("the cold tier's memory budget")?;
            }
            // The kernel's dirty cap and the write reserve follow the size.
            if let (true, Some(dev)) = (self.args.writeback_cache(), ramd_fs::mount_device(dir)) {
                fs.set_write_reserve(crate::frontends::bdi::limit_dirty(dev, size));
            }
            if let Some(s) = &self.saving {
                s.persister.set_size(size.unwrap_or(0));
            }
        }
        // Without an atime word the rule stays (`MountRequest::atime_given`).
        let atime = if req.atime_given {
            new.fuse.atime()
        } else {
            fs.atime()
        };
        fs.set_atime(atime);
        let budget = self.store.max_memory();
        log::info!(
            "disk {:?} remounted: size {}, max memory {}, atime {:?}",
            self.args.name,
            size.map_or("unlimited".into(), human),
            human(budget),
            atime
        );
        Ok(serde_json::json!({
            "remounted": self.args.name,
            "size": size.unwrap_or(0),
            "max_memory": budget,
        }))
    }
}
