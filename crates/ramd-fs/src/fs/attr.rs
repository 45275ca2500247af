//! `Fs`'s attributes: stat, setattr (mode, owner, size, times), chattr's
//! flags and statfs.

use ramd_store::PAGE_SIZE;

use super::types::{err, Kill};
use super::{
    base, now, round_up, Attr, Caller, Data, Errno, Fs, Ino, Kind, Result, SetAttr, SetTime,
    FL_NOATIME, FL_SUPPORTED, MAX_FILE_SIZE,
};

impl Fs {
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        let st = self.state.read();
        Ok(self.hot_attr(st.get(ino)?, ino))
    }

    /// Applies `set` for `who`. Like the VFS (the mount negotiates
    /// FUSE_HANDLE_KILLPRIV_V2, which leaves this to the filesystem), a
    /// chown of a non-directory, and a truncate by a caller without
    /// CAP_FSETID, drop setuid, setgid and file capabilities; so does an
    /// empty SETATTR, the kernel's word that a change needs it.
    pub fn setattr(&self, who: Caller, ino: Ino, set: SetAttr) -> Result<Attr> {
        // A new size needs the data in the backing file; times alone are
        // the inode's while it is cold.
        let _pin = match set.size {
            Some(_) => Some(self.hot_pin(ino)?),
            None => None,
        };
        let c = self.store.change();
        let now = now();
        let mut st = self.state.write();
        let inode = st.get_mut(ino)?;
        inode.check_mutable()?;
        // Append-only: times may still move both to now (utime(NULL)),
        // and the kernel write back its own, nothing else (the VFS's
        // rule in notify_change, which FUSE inodes never reach).
        if set.mode.is_some()
            || set.uid.is_some()
            || set.gid.is_some()
            || set.size.is_some()
            || set.times_given
        {
            inode.check_fixed()?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            self.drop_privileges(inode, who, Kill::Chown);
        }
        if set.size.is_some() {
            self.drop_privileges(inode, who, Kill::Modify);
        }
        if set.is_empty() && inode.kind == Kind::File {
            // The kernel found that a change by `who` (a write, fallocate
            // or copy it did not send us: passed through to the backing
            // file, or a fallocate) must drop setuid/setgid, and with
            // HANDLE_KILLPRIV_V2 leaves that to us, sending nothing else.
            self.drop_privileges(inode, who, Kill::KernelSays);
        }
        if inode.kind == Kind::File && self.hot.get().is_some() {
            if set.size.is_some_and(|s| s > self.max_file_size()) {
                return err(Errno::EFBIG);
            }
            let made_with = (inode.atime, inode.mtime, inode.flags);
            Fs::cancel_move(&mut inode.cold);
            if !inode.cold.is_cold() {
                self.hot_setattr(ino, made_with, set.size, set.atime, set.mtime)?;
            }
        } else if let Some(size) = set.size {
            let Data::File {
                slot,
                ref mut pages,
                ref mut alloc_end,
            } = inode.data
            else {
                return err(if inode.kind == Kind::Dir {
                    Errno::EISDIR
                } else {
                    Errno::EINVAL
                });
            };
            if size > MAX_FILE_SIZE {
                return err(Errno::EFBIG);
            }
            if size < inode.size || size < *alloc_end {
                // Freed at once, like tmpfs: the tail becomes holes (the
                // last page whole: past the old end it holds only zeros).
                let end = round_up((*alloc_end).max(inode.size));
                if end > size {
                    let delta = self.punch(&c, base(slot) + size, end - size);
                    *pages = pages.saturating_add_signed(delta);
                }
                *alloc_end = size;
            }
            if size != inode.size {
                inode.size = size;
                inode.touch_mc(now);
            }
        }
        if let Some(mode) = set.mode {
            inode.perm = (mode & 0o7777) as u16;
        }
        if let Some(uid) = set.uid {
            inode.uid = uid;
        }
        if let Some(gid) = set.gid {
            inode.gid = gid;
        }
        let resolve = |t: SetTime| match t {
            SetTime::At(t) => t,
            SetTime::Now => now,
        };
        if let Some(t) = set.atime {
            inode.atime = resolve(t);
        }
        if let Some(t) = set.mtime {
            inode.mtime = resolve(t);
        }
        inode.ctime = set.ctime.unwrap_or(now);
        Ok(self.hot_attr(inode, ino))
    }

    /// The chattr flags (FS_IOC_GETFLAGS).
    pub fn flags(&self, ino: Ino) -> Result<u32> {
        Ok(self.state.read().get(ino)?.flags)
    }

    /// FS_IOC_SETFLAGS: only the flags tmpfs keeps (EOPNOTSUPP otherwise,
    /// as tmpfs). The kernel has checked ownership and CAP_LINUX_IMMUTABLE.
    pub fn set_flags(&self, ino: Ino, flags: u32) -> Result<()> {
        let _change = self.store.change();
        // A standby's tree is its writer's (see `fuse.rs`'s `changes`).
        if self.store.standby() {
            return err(Errno::EROFS);
        }
        if flags & !FL_SUPPORTED != 0 {
            return err(Errno::EOPNOTSUPP);
        }
        let mut st = self.state.write();
        let inode = st.get_mut(ino)?;
        if inode.kind == Kind::File && (inode.flags ^ flags) & FL_NOATIME != 0 {
            self.hot_noatime(ino, flags & FL_NOATIME != 0)?;
        }
        inode.flags = flags;
        inode.ctime = now();
        drop(st);
        // The kernel does not know an ioctl moved ctime.
        self.attr_changed(ino);
        Ok(())
    }

    /// For readdirplus: the attributes of an entry, counting a lookup.
    pub fn lookup_ino(&self, ino: Ino) -> Result<Attr> {
        let mut st = self.state.write();
        let inode = st.get_mut(ino)?;
        inode.lookups += 1;
        Ok(self.hot_attr(inode, ino))
    }

    /// (total blocks, free blocks, total inodes, free inodes), 4 KiB blocks.
    pub fn statfs(&self) -> (u64, u64, u64, u64) {
        let (used, limit) = self.pages_used();
        let total = match self.size() {
            Some(_) => limit,
            // ramfs mode: what is used plus what the host could still give.
            None => used + ramd_store::mem_available().unwrap_or(0) / PAGE_SIZE as u64,
        };
        let inodes = self.state.read().inodes.len() as u64;
        (
            total,
            total.saturating_sub(used),
            self.cfg.nr_inodes,
            self.cfg.nr_inodes.saturating_sub(inodes),
        )
    }
}
