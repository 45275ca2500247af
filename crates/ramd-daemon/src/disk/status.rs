//! A disk's `status`: the store's, the filesystem's and the persister's
//! figures, its frontends and settings, as one typed [`DiskStatus`].

use std::sync::atomic::Ordering;

use ramd_store::persist::{DiskKind, PersistStatus};
use ramd_store::PAGE_SIZE;

use super::Disk;
use crate::status::DiskStatus;

impl Disk {
    /// The image directory saves go to now.
    pub(super) fn image_path(&self) -> Option<String> {
        self.saving
            .as_ref()
            .and_then(|s| s.persister.status().image)
    }

    pub fn status(&self) -> DiskStatus {
        let mut store = self.store.stats();
        let (pages_per_node, pages_per_node_sample) = self.store.pages_per_node();
        let (memory_limit, by) = self.store.effective_limit();
        let frontends: Vec<_> = self.frontends.iter().map(|f| f.status()).collect();
        let connections = frontends
            .iter()
            .filter_map(|f| f.connections)
            .reduce(|a, b| a + b);
        let mut page_limit = None;
        if self.kind == DiskKind::Fs {
            // A filesystem's size is its capacity, not the store's address space.
            // With --data-path kernel, what its tmpfs holds.
            let (used, limit) = self
                .fs
                .as_ref()
                .map_or(self.store.pages_used(), |f| f.pages_used());
            store.size = self.current_size().unwrap_or(0);
            store.used_bytes = used * PAGE_SIZE as u64;
            page_limit = Some(limit);
            // With a cold tier, its codec is the disk's (this store holds
            // no file data).
            if let Some(cold) = self.fs.as_ref().and_then(|f| f.cold_store()) {
                store.compress = cold.stats().compress;
            }
        }
        DiskStatus {
            name: self.args.name.clone(),
            kind: self.kind.name().into(),
            id: self.id.to_string(),
            pid: std::process::id(),
            uri: frontends
                .first()
                .map_or(String::new(), |f| f.endpoint.clone()),
            connections,
            // A filesystem disk's may change with `mount -o remount,ro`.
            read_only: match (&self.fs, &self.args.fuse.mount) {
                (Some(_), Some(dir)) => {
                    ramd_fs::mount_read_only(dir).unwrap_or(self.args.read_only)
                }
                _ => self.args.read_only || self.store.standby(),
            },
            mount: self.args.fuse.mount.as_ref().and(
                frontends
                    .iter()
                    .find(|f| f.protocol == "fuse")
                    .map(|f| f.endpoint.clone()),
            ),
            data_path: self.fs.as_ref().map(|f| {
                if f.hot_tier().is_some() {
                    "kernel"
                } else {
                    "store"
                }
                .to_string()
            }),
            unlimited: self.kind == DiskKind::Fs && self.current_size().is_none(),
            page_limit,
            metrics: self.metrics_url.clone(),
            frontends,
            store,
            fs: self.fs.as_ref().map(|f| f.stats()),
            io: self.io.snapshot(),
            persist: self
                .saving
                .as_ref()
                .map_or_else(PersistStatus::none, |s| s.persister.status()),
            pages_per_node,
            pages_per_node_sample,
            memory_limit,
            memory_limit_by: by.into(),
            numa_policy: self.placement.as_ref().map(|p| p.policy.to_string()),
            numa_nodes: self
                .placement
                .as_ref()
                .map(|p| ramd_store::numa::list_text(&p.nodes)),
            process: ramd_store::ProcessMemory::now(),
            blocked: self.blocked(),
            stopping: self.leaving.load(Ordering::SeqCst) || self.stopped(),
        }
    }
}
