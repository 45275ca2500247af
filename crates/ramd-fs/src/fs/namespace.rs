//! `Fs`'s namespace: lookup, create (every kind), link, unlink, rename
//! and directory listing, with their charges to the memory budget.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use ramd_store::Change;

use super::acl::{self, ACL_ACCESS, ACL_DEFAULT};
use super::dir::Entries;
use super::types::{err, MAX_SLOTS};
use super::{
    check_name, name_cost, now, xattr_cost, Attr, Caller, Data, DirEntry, Errno, Fs, Ino, Inode,
    Kind, Result, State, INODE_COST, NAME_MAX,
};

impl Fs {
    /// Looks `name` up in `parent`, counting a lookup. "." and ".." are
    /// what the kernel asks for to open a file handle whose inode it no
    /// longer caches (`.` of any inode, `..` of a directory).
    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr> {
        if name.len() > NAME_MAX {
            return err(Errno::ENAMETOOLONG);
        }
        let mut st = self.state.write();
        let ino = match name.as_bytes() {
            b"." => parent,
            b".." => match st.get(parent)?.data {
                Data::Dir { parent, .. } => parent,
                _ => return err(Errno::ENOTDIR),
            },
            _ => st.child(parent, name)?,
        };
        let inode = st.get_mut(ino)?;
        inode.lookups += 1;
        Ok(self.hot_attr(inode, ino))
    }

    /// The kernel dropped `n` references taken by lookups and creations.
    /// Takes the gate: dropping the inode frees its slot for reuse.
    pub fn forget(&self, ino: Ino, n: u64) {
        let _gate = self.store.change();
        let mut st = self.state.write();
        if let Some(inode) = st.inodes.get_mut(&ino) {
            inode.lookups = inode.lookups.saturating_sub(n);
        }
        // Fewer lookups reach no data: an unreachable inode's went when
        // its last link or open did (`maybe_free`).
        self.maybe_drop(&mut st, ino);
    }

    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let target = match &self.state.read().get(ino)?.data {
            Data::Symlink(t) => t.as_bytes().to_vec(),
            _ => return err(Errno::EINVAL),
        };
        self.accessed(ino);
        Ok(target)
    }

    /// Creates a node of any kind but symlink. `mode` carries the type bits
    /// and permissions (already masked by the kernel's umask).
    pub fn mknod(
        &self,
        who: Caller,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> Result<Attr> {
        let _change = self.store.change();
        let kind = Kind::from_mode(mode).ok_or(Errno::EINVAL)?;
        if kind == Kind::Symlink {
            return err(Errno::EINVAL);
        }
        self.create_node(who, parent, Some(name), kind, mode, rdev, None)
    }

    pub fn mkdir(&self, who: Caller, parent: Ino, name: &OsStr, mode: u32) -> Result<Attr> {
        let _change = self.store.change();
        self.create_node(who, parent, Some(name), Kind::Dir, mode, 0, None)
    }

    pub fn symlink(&self, who: Caller, parent: Ino, name: &OsStr, target: &OsStr) -> Result<Attr> {
        let _change = self.store.change();
        if target.len() >= libc::PATH_MAX as usize {
            return err(Errno::ENAMETOOLONG);
        }
        self.create_node(
            who,
            parent,
            Some(name),
            Kind::Symlink,
            0o777,
            0,
            Some(target),
        )
    }

    /// Creates and opens a regular file.
    pub fn create(&self, who: Caller, parent: Ino, name: &OsStr, mode: u32) -> Result<Attr> {
        let _change = self.store.change();
        let attr = self.create_node(who, parent, Some(name), Kind::File, mode, 0, None)?;
        self.opened(self.state.write().get_mut(attr.ino)?);
        self.hot_changed(attr.ino);
        Ok(attr)
    }

    /// Creates and opens a regular file with no name in `parent`
    /// (O_TMPFILE): freed when closed unless a link names it first.
    pub fn tmpfile(&self, who: Caller, parent: Ino, mode: u32) -> Result<Attr> {
        let _change = self.store.change();
        let attr = self.create_node(who, parent, None, Kind::File, mode, 0, None)?;
        let mut st = self.state.write();
        self.opened(st.get_mut(attr.ino)?);
        st.linkable.insert(attr.ino);
        self.hot_changed(attr.ino);
        Ok(attr)
    }

    /// The caller holds the gate. Without a name (O_TMPFILE) the inode is
    /// made unlinked.
    #[allow(clippy::too_many_arguments)]
    fn create_node(
        &self,
        who: Caller,
        parent: Ino,
        name: Option<&OsStr>,
        kind: Kind,
        mode: u32,
        rdev: u32,
        target: Option<&OsStr>,
    ) -> Result<Attr> {
        if let Some(name) = name {
            check_name(name)?;
        }
        let now = now();
        let mut st = self.state.write();
        let p = match name {
            Some(name) => st.check_new_entry(parent, name)?,
            None => {
                let p = st.get(parent)?;
                p.entries()?;
                if p.nlink == 0 {
                    return err(Errno::ENOENT);
                }
                p
            }
        };
        p.check_mutable()?;
        if !st.room_for_inode(self.cfg.nr_inodes) {
            return err(Errno::ENOSPC);
        }
        // A default ACL replaces the umask (POSIX.1e, as posix_acl_create).
        let default_acl = p.xattrs.get(OsStr::new(ACL_DEFAULT)).cloned();
        let mut xattrs = BTreeMap::new();
        let mut mode = mode & 0o7777;
        match default_acl {
            Some(acl) if kind != Kind::Symlink => {
                if let Some(access) = acl::inherit(&acl, &mut mode) {
                    xattrs.insert(OsString::from(ACL_ACCESS), access);
                }
                if kind == Kind::Dir {
                    xattrs.insert(OsString::from(ACL_DEFAULT), acl);
                }
            }
            _ if kind != Kind::Symlink => mode &= !who.umask,
            _ => {}
        }
        // setgid directories hand their group, and to subdirectories the
        // setgid bit, down to what is created in them.
        let mut perm = mode as u16;
        let gid = if p.perm & libc::S_ISGID as u16 != 0 {
            if kind == Kind::Dir {
                perm |= libc::S_ISGID as u16;
            }
            p.gid
        } else {
            who.gid
        };
        let cost = INODE_COST
            + name.map_or(0, name_cost)
            + target.map_or(0, |t| t.len() as u64)
            + xattrs.iter().map(|(k, v)| xattr_cost(k, v)).sum::<u64>();
        self.store.charge(cost)?;
        let data = match kind {
            Kind::File => {
                let slot = match st.free_slots.pop() {
                    Some(s) => s,
                    None if st.next_slot < MAX_SLOTS => {
                        st.next_slot += 1;
                        st.next_slot - 1
                    }
                    None => {
                        self.store.uncharge(cost);
                        return err(Errno::ENOSPC);
                    }
                };
                Data::File {
                    slot,
                    pages: 0,
                    alloc_end: 0,
                }
            }
            Kind::Dir => Data::Dir {
                entries: Entries::new(),
                parent,
            },
            Kind::Symlink => Data::Symlink(target.expect("symlink target").to_owned()),
            _ => Data::Special,
        };
        let ino = Ino(st.next_ino);
        st.next_ino += 1;
        let mut inode = Inode::new(kind, perm, who.uid, gid, data, now);
        inode.rdev = rdev;
        inode.size = target.map_or(0, |t| t.len() as u64);
        inode.xattrs = xattrs;
        let Some(name) = name else {
            inode.nlink = 0;
            let attr = inode.attr(ino);
            st.inodes.insert(ino, inode);
            return Ok(attr);
        };
        let attr = inode.attr(ino);
        st.inodes.insert(ino, inode);
        let p = st.get_mut(parent)?;
        p.entries_mut()?.insert(name.to_owned(), ino);
        if kind == Kind::Dir {
            p.nlink += 1;
        }
        p.touch_mc(now);
        Ok(attr)
    }

    pub fn link(&self, ino: Ino, newparent: Ino, newname: &OsStr) -> Result<Attr> {
        let _change = self.store.change();
        check_name(newname)?;
        let now = now();
        let mut st = self.state.write();
        st.check_new_entry(newparent, newname)?.check_mutable()?;
        let inode = st.get(ino)?;
        inode.check_fixed()?;
        if inode.kind == Kind::Dir {
            return err(Errno::EPERM);
        }
        if inode.nlink == 0 && !st.linkable.contains(&ino) {
            return err(Errno::ENOENT);
        }
        if inode.nlink >= u32::MAX - 1 {
            return err(Errno::EMLINK);
        }
        self.store.charge(name_cost(newname))?;
        let np = st.get_mut(newparent)?;
        np.entries_mut()?.insert(newname.to_owned(), ino);
        np.touch_mc(now);
        st.linkable.remove(&ino);
        let inode = st.get_mut(ino)?;
        inode.nlink += 1;
        inode.lookups += 1;
        inode.ctime = now;
        Ok(self.hot_attr(inode, ino))
    }

    pub fn unlink(&self, parent: Ino, name: &OsStr) -> Result<()> {
        let c = self.store.change();
        let mut st = self.state.write();
        let ino = st.child(parent, name)?;
        // EPERM before the kind, as the VFS's may_delete.
        st.get(parent)?.check_fixed()?;
        st.get(ino)?.check_fixed()?;
        if st.get(ino)?.kind == Kind::Dir {
            return err(Errno::EISDIR);
        }
        self.remove_entry(&c, &mut st, parent, name, ino);
        Ok(())
    }

    pub fn rmdir(&self, parent: Ino, name: &OsStr) -> Result<()> {
        let c = self.store.change();
        if name == "." {
            return err(Errno::EINVAL);
        }
        if name == ".." {
            return err(Errno::ENOTEMPTY);
        }
        let mut st = self.state.write();
        let ino = st.child(parent, name)?;
        // The VFS's may_delete checks the parent's and the victim's
        // immutable and append-only flags (EPERM) before the kind, and
        // the filesystem's emptiness (ENOTEMPTY) comes after both.
        st.get(parent)?.check_fixed()?;
        let d = st.get(ino)?;
        d.check_fixed()?;
        if !d.entries()?.is_empty() {
            return err(Errno::ENOTEMPTY);
        }
        self.remove_entry(&c, &mut st, parent, name, ino);
        Ok(())
    }

    /// Drops the entry `name` → `ino` from `parent`, with link counts, times
    /// and memory.
    fn remove_entry(&self, c: &Change<'_>, st: &mut State, parent: Ino, name: &OsStr, ino: Ino) {
        let now = now();
        let p = st.inodes.get_mut(&parent).expect("parent exists");
        p.entries_mut().expect("parent is a dir").remove(name);
        p.touch_mc(now);
        let inode = st.inodes.get_mut(&ino).expect("child exists");
        inode.ctime = now;
        if inode.kind == Kind::Dir {
            inode.nlink = 0;
            st.inodes.get_mut(&parent).expect("parent").nlink -= 1;
        } else {
            inode.nlink -= 1;
        }
        self.store.uncharge(name_cost(name));
        self.maybe_free(c, st, ino);
    }

    /// renameat2(2) by `who`. RENAME_WHITEOUT leaves a whiteout (a
    /// character device 0:0, mode 0, `who`'s) at the old name, as tmpfs
    /// does for overlayfs; the kernel has checked CAP_MKNOD.
    pub fn rename(
        &self,
        who: Caller,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        const NOREPLACE: u32 = libc::RENAME_NOREPLACE;
        const EXCHANGE: u32 = libc::RENAME_EXCHANGE;
        const WHITEOUT: u32 = libc::RENAME_WHITEOUT;
        let c = self.store.change();
        if flags & !(NOREPLACE | EXCHANGE | WHITEOUT) != 0
            || flags & EXCHANGE != 0 && flags & (NOREPLACE | WHITEOUT) != 0
        {
            return err(Errno::EINVAL);
        }
        check_name(newname)?;
        let now = now();
        let mut st = self.state.write();
        let src = st.child(parent, name)?;
        let dst = match st.child(newparent, newname) {
            Ok(d) => Some(d),
            Err(Errno::ENOENT) => None,
            Err(e) => return Err(e),
        };
        if st.get(newparent)?.nlink == 0 {
            return err(Errno::ENOENT);
        }
        st.get(src)?.check_fixed()?;
        st.get(parent)?.check_fixed()?;
        st.get(newparent)?.check_mutable()?;
        if let Some(dst) = dst {
            st.get(dst)?.check_fixed()?;
            // An entry replaced or exchanged leaves the new parent.
            st.get(newparent)?.check_fixed()?;
        }
        let src_dir = st.get(src)?.kind == Kind::Dir;
        // Moving a directory below itself is refused by the VFS already;
        // checked again because a loop would orphan a subtree.
        if src_dir && parent != newparent && self.is_ancestor(&st, src, newparent) {
            return err(Errno::EINVAL);
        }
        if flags & EXCHANGE != 0 {
            let dst = dst.ok_or(Errno::ENOENT)?;
            let dst_dir = st.get(dst)?.kind == Kind::Dir;
            if dst_dir && parent != newparent && self.is_ancestor(&st, dst, parent) {
                return err(Errno::EINVAL);
            }
            st.get_mut(parent)?
                .entries_mut()?
                .insert(name.to_owned(), dst);
            st.get_mut(newparent)?
                .entries_mut()?
                .insert(newname.to_owned(), src);
            if parent != newparent {
                self.reparent(&mut st, src, parent, newparent);
                self.reparent(&mut st, dst, newparent, parent);
            }
            for ino in [src, dst] {
                st.get_mut(ino)?.ctime = now;
            }
            for p in [parent, newparent] {
                st.get_mut(p)?.touch_mc(now);
            }
            return Ok(());
        }
        if let Some(dst) = dst {
            if flags & NOREPLACE != 0 {
                return err(Errno::EEXIST);
            }
            if dst == src {
                // Two names of one inode: POSIX says do nothing.
                return Ok(());
            }
            let d = st.get(dst)?;
            match (src_dir, d.kind == Kind::Dir) {
                (true, false) => return err(Errno::ENOTDIR),
                (false, true) => return err(Errno::EISDIR),
                (true, true) if !d.entries()?.is_empty() => return err(Errno::ENOTEMPTY),
                _ => {}
            }
        }
        // Nothing may fail after the replaced entry is gone: charge first.
        let whiteout_cost = INODE_COST + name_cost(name);
        if flags & WHITEOUT != 0 {
            if !st.room_for_inode(self.cfg.nr_inodes) {
                return err(Errno::ENOSPC);
            }
            self.store.charge(whiteout_cost)?;
        }
        if let Err(e) = self.store.charge(name_cost(newname)) {
            if flags & WHITEOUT != 0 {
                self.store.uncharge(whiteout_cost);
            }
            return Err(e.into());
        }
        if let Some(dst) = dst {
            self.remove_entry(&c, &mut st, newparent, newname, dst);
        }
        st.get_mut(parent)?.entries_mut()?.remove(name);
        self.store.uncharge(name_cost(name));
        st.get_mut(newparent)?
            .entries_mut()?
            .insert(newname.to_owned(), src);
        if parent != newparent {
            self.reparent(&mut st, src, parent, newparent);
        }
        st.get_mut(src)?.ctime = now;
        for p in [parent, newparent] {
            st.get_mut(p)?.touch_mc(now);
        }
        if flags & WHITEOUT != 0 {
            let ino = Ino(st.next_ino);
            st.next_ino += 1;
            let mut w = Inode::new(Kind::CharDev, 0, who.uid, who.gid, Data::Special, now);
            // No reply announces it: the kernel looks it up when it wants it.
            w.lookups = 0;
            st.inodes.insert(ino, w);
            st.get_mut(parent)?
                .entries_mut()?
                .insert(name.to_owned(), ino);
        }
        Ok(())
    }

    /// Fixes ".." and the parents' link counts when a directory moves.
    fn reparent(&self, st: &mut State, ino: Ino, from: Ino, to: Ino) {
        let Some(Inode {
            data: Data::Dir { parent, .. },
            ..
        }) = st.inodes.get_mut(&ino)
        else {
            return;
        };
        *parent = to;
        st.inodes.get_mut(&from).expect("old parent").nlink -= 1;
        st.inodes.get_mut(&to).expect("new parent").nlink += 1;
    }

    /// Whether `a` is `b` or one of its ancestors.
    fn is_ancestor(&self, st: &State, a: Ino, mut b: Ino) -> bool {
        loop {
            if a == b {
                return true;
            }
            match st.inodes.get(&b).map(|i| &i.data) {
                Some(Data::Dir { parent, .. }) if *parent != b => b = *parent,
                _ => return false,
            }
        }
    }

    /// OPENDIR: `ino` must be a directory. Nothing is kept per open: a
    /// listing goes on from its offset alone (see `fs/dir.rs`).
    pub fn opendir(&self, ino: Ino) -> Result<()> {
        self.state.read().get(ino)?.entries()?;
        Ok(())
    }

    /// Up to `max` entries of directory `ino` after `offset` (0, or the
    /// cookie of the last entry a listing returned), with their cookies:
    /// ".", "..", then the names in the order they were added. Reading
    /// from the start counts as an access of the directory.
    pub fn read_dir(&self, ino: Ino, offset: u64, max: usize) -> Result<Vec<(u64, DirEntry)>> {
        let list = {
            let st = self.state.read();
            let d = st.get(ino)?;
            let Data::Dir { entries, parent } = &d.data else {
                return err(Errno::ENOTDIR);
            };
            if offset == 0 {
                entries.set_listed();
            }
            let dots = [(1, ".", ino), (2, "..", *parent)];
            let dots = dots
                .into_iter()
                .filter(|&(c, ..)| c > offset)
                .map(|(c, n, i)| {
                    let e = DirEntry {
                        ino: i,
                        kind: Kind::Dir,
                        name: n.into(),
                    };
                    (c, e)
                });
            let named = entries.after(offset).map(|(c, name, child)| {
                let kind = st.inodes.get(&child).map_or(Kind::File, |i| i.kind);
                let e = DirEntry {
                    ino: child,
                    kind,
                    name: name.clone(),
                };
                (c, e)
            });
            dots.chain(named).take(max).collect()
        };
        if offset == 0 {
            self.accessed(ino);
        }
        Ok(list)
    }

    /// Whether directory `ino` was listed from the start since the last
    /// call said so (false for anything else).
    pub fn take_listed(&self, ino: Ino) -> bool {
        self.state
            .read()
            .get(ino)
            .and_then(|i| i.entries())
            .is_ok_and(|e| e.take_listed())
    }

    /// Every entry of directory `ino`, "." and ".." first, as
    /// [`Fs::read_dir`] lists them.
    pub fn list_dir(&self, ino: Ino) -> Result<Vec<DirEntry>> {
        let list = self.read_dir(ino, 0, usize::MAX)?;
        Ok(list.into_iter().map(|(_, e)| e).collect())
    }
}
