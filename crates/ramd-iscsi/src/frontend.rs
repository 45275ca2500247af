//! iSCSI: one target per daemon, one LUN per block disk that asks for it
//! (`--iscsi`). [`FrontendFactory::build`] is per disk, so the factory holds
//! what the disks share: the target (its LUN map and sessions) and the
//! portals (listening sockets), each with the number of disks using it. A
//! disk's frontend removes its LUN when it stops; a portal closes with its
//! last disk, and the target with its last LUN.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::thread;

use anyhow::{bail, Context};
use parking_lot::{Condvar, Mutex};
use ramd_frontend::{Claim, DiskContext, DiskSettings, Frontend, FrontendFactory, FrontendStatus};
use ramd_store::persist::DiskKind;

use crate::scsi::{Lun, LunConfig};
use crate::settings::IscsiArgs;
use crate::{Chap, Portal, Target, TargetConfig};

#[derive(Default)]
pub struct Iscsi {
    shared: Arc<Mutex<Shared>>,
}

#[derive(Default)]
struct Shared {
    target: Option<Arc<Target>>,
    /// By the address asked for (port 0 included), with its users.
    portals: HashMap<SocketAddr, PortalEntry>,
}

struct PortalEntry {
    portal: Arc<Portal>,
    users: usize,
    thread: Option<thread::JoinHandle<()>>,
}

impl Iscsi {
    pub fn new() -> Iscsi {
        Iscsi::default()
    }
}

/// `iqn.2026-11.org.ramd:<host>`, the host name lower-cased and cut to the
/// characters an IQN allows.
pub fn default_iqn() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let host: String = host
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.'))
        .collect();
    let host = if host.is_empty() {
        "localhost".to_string()
    } else {
        host
    };
    format!("iqn.2026-11.org.ramd:{host}")
}

fn target_config(args: &IscsiArgs, max_connections: u16) -> TargetConfig {
    let chap = |c: &Option<(String, String)>| {
        c.as_ref().map(|(u, s)| Chap {
            user: u.clone(),
            secret: s.clone(),
        })
    };
    TargetConfig {
        name: args.iscsi_target.clone().unwrap_or_else(default_iqn),
        alias: "ramd".into(),
        chap: chap(&args.iscsi_chap),
        mutual_chap: chap(&args.iscsi_mutual_chap),
        max_connections: max_connections as usize,
    }
}

impl FrontendFactory for Iscsi {
    fn claims(&self, disk: &dyn DiskSettings, _run_dir: &Path) -> anyhow::Result<Vec<Claim>> {
        let Some(args) = disk.get::<IscsiArgs>() else {
            return Ok(Vec::new());
        };
        let Some(addr) = args.portal else {
            return Ok(Vec::new());
        };
        if disk.kind() != DiskKind::Block {
            bail!("--iscsi: disk {} is not a block disk", disk.name());
        }
        if !addr.ip().is_loopback() && args.iscsi_chap.is_none() && !args.iscsi_no_auth {
            bail!(
                "--iscsi {addr}: disk {} would serve beyond loopback without authentication: \
                 give --iscsi-chap USER:SECRET, or --iscsi-no-auth to allow it",
                disk.name()
            );
        }
        // Portals are shared between disks by design, so they claim
        // nothing; a LUN number does.
        Ok(args
            .iscsi_lun
            .map(|l| Claim(format!("iscsi lun {l}")))
            .into_iter()
            .collect())
    }

    fn build(&self, disk: &DiskContext) -> anyhow::Result<Vec<Arc<dyn Frontend>>> {
        let s = disk.settings;
        let Some(args) = s.get::<IscsiArgs>() else {
            return Ok(Vec::new());
        };
        let name = s.name();
        let Some(addr) = args.portal else {
            return Ok(Vec::new());
        };
        if disk.kind != DiskKind::Block {
            return Ok(Vec::new());
        }
        let size = disk.store.size();
        if !size.is_multiple_of(args.block_size as u64) {
            bail!(
                "--block-size {}: disk {}'s size, {size} bytes, is not a whole number of blocks",
                args.block_size,
                name
            );
        }
        let cfg = target_config(args, s.max_connections());
        let mut sh = self.shared.lock();
        let target = match &sh.target {
            Some(t) => {
                if t.config().name != cfg.name
                    || t.config().chap != cfg.chap
                    || t.config().mutual_chap != cfg.mutual_chap
                {
                    bail!(
                        "disk {}: its iSCSI target settings (--iscsi-target, --iscsi-chap, \
                         --iscsi-mutual-chap) differ from those of the disks already on the \
                         daemon's one target {}",
                        name,
                        t.config().name
                    );
                }
                t.clone()
            }
            None => Target::new(cfg),
        };
        let lun_no = match args.iscsi_lun {
            Some(n) => n as u64,
            None => {
                let used = target.lun_ids();
                (0..16384u64)
                    .find(|n| !used.contains(n))
                    .context("no free iSCSI LUN number")?
            }
        };
        let lun = Arc::new(
            Lun::new(
                disk.store.clone(),
                LunConfig {
                    block_size: args.block_size,
                    read_only: s.read_only(),
                    // From the disk's identity, not its name: two hosts'
                    // disks of one name are two devices to a multipath
                    // initiator, and an image's disk is the same device
                    // across restarts.
                    id: disk.id.folded(),
                    serial: disk.id.to_string(),
                    product: "ramd disk".into(),
                    // Saved to an image: written data is durable only after a
                    // flush, so initiators are told to send SYNCHRONIZE CACHE.
                    write_cache: s.has_image(),
                },
            )
            .with_metrics(disk.metrics.frontend("iscsi")),
        );
        if !target.add_lun(lun_no, lun) {
            bail!(
                "--iscsi-lun {lun_no}: disk {} asks for a LUN another disk has",
                name
            );
        }
        if let Entry::Vacant(slot) = sh.portals.entry(addr) {
            let portal = match Portal::bind(addr) {
                Ok(p) => Arc::new(p),
                Err(e) => {
                    target.remove_lun(lun_no);
                    return Err(e).with_context(|| format!("iSCSI portal {addr}"));
                }
            };
            let (p, t) = (portal.clone(), target.clone());
            let thread = thread::Builder::new()
                .name("iscsi-portal".into())
                .spawn(move || {
                    if let Err(e) = p.serve(&t) {
                        log::error!("iSCSI portal {}: {e}", p.local_addr());
                    }
                })
                .context("starting the iSCSI portal thread")?;
            slot.insert(PortalEntry {
                portal,
                users: 0,
                thread: Some(thread),
            });
        }
        let entry = sh.portals.get_mut(&addr).expect("just inserted");
        entry.users += 1;
        let local = entry.portal.local_addr();
        sh.target = Some(target.clone());
        let endpoint = format!("iscsi://{local}/{}/{lun_no}", target.config().name);
        Ok(vec![Arc::new(IscsiFrontend {
            shared: self.shared.clone(),
            target,
            addr,
            lun: lun_no,
            endpoint,
            stopped: Mutex::new(false),
            wake: Condvar::new(),
        })])
    }
}

struct IscsiFrontend {
    shared: Arc<Mutex<Shared>>,
    target: Arc<Target>,
    addr: SocketAddr,
    lun: u64,
    endpoint: String,
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Frontend for IscsiFrontend {
    fn serve(&self) -> anyhow::Result<()> {
        let mut s = self.stopped.lock();
        while !*s {
            self.wake.wait(&mut s);
        }
        Ok(())
    }

    fn stop(&self, _force: bool) {
        {
            let mut s = self.stopped.lock();
            if *s {
                return;
            }
            *s = true;
        }
        let (portal, last_lun) = {
            let mut sh = self.shared.lock();
            let remaining = self.target.remove_lun(self.lun);
            let last_lun = remaining == 0;
            if last_lun {
                sh.target = None;
            }
            let mut gone = None;
            if let Some(e) = sh.portals.get_mut(&self.addr) {
                e.users -= 1;
                if e.users == 0 {
                    gone = sh.portals.remove(&self.addr);
                }
            }
            (gone, last_lun)
        };
        if last_lun {
            // No disk left: every session goes.
            self.target.stop();
        }
        if let Some(mut p) = portal {
            p.portal.stop();
            if let Some(t) = p.thread.take() {
                let _ = t.join();
            }
        }
        self.wake.notify_all();
    }

    fn status(&self) -> FrontendStatus {
        FrontendStatus {
            protocol: "iscsi".into(),
            endpoint: self.endpoint.clone(),
            connections: Some(self.target.sessions() as u64),
            transport: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_iqn_is_ramds() {
        assert!(default_iqn().starts_with("iqn.2026-11.org.ramd:"));
    }
}
