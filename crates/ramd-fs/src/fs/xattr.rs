//! `Fs`'s extended attributes, POSIX ACLs (kept as the `system.posix_acl_*`
//! xattrs) included.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::acl::{self, ACL_ACCESS};
use super::types::{err, XATTR_SIZE_MAX};
use super::{check_xattr_name, now, xattr_cost, Errno, Fs, Ino, Result};

impl Fs {
    /// Sets an xattr. An access ACL also sets the mode's permission bits,
    /// and drops setgid when the kernel says its caller may not keep it
    /// (`kill_sgid`: outside the file's group, without CAP_FSETID), as
    /// posix_acl_update_mode does.
    pub fn setxattr(
        &self,
        ino: Ino,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        kill_sgid: bool,
    ) -> Result<()> {
        let _change = self.store.change();
        check_xattr_name(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return err(Errno::E2BIG);
        }
        let mut st = self.state.write();
        let inode = st.get_mut(ino)?;
        inode.check_fixed()?;
        if name == ACL_ACCESS {
            // The mode follows an access ACL, and one that says no more
            // than the mode is not kept (the kernel leaves both to us).
            let (mode, extended) = acl::mode_of(value).ok_or(Errno::EINVAL)?;
            inode.perm = (inode.perm & !0o777) | mode as u16;
            if kill_sgid {
                inode.perm &= !(libc::S_ISGID as u16);
            }
            inode.ctime = now();
            if !extended {
                if let Some(v) = inode.xattrs.remove(name) {
                    self.store.uncharge(xattr_cost(name, &v));
                }
                return Ok(());
            }
        }
        let old = inode.xattrs.get(name);
        if flags & libc::XATTR_CREATE != 0 && old.is_some() {
            return err(Errno::EEXIST);
        }
        if flags & libc::XATTR_REPLACE != 0 && old.is_none() {
            return err(Errno::ENODATA);
        }
        let new_cost = xattr_cost(name, value);
        let old_cost = old.map_or(0, |v| xattr_cost(name, v));
        if new_cost > old_cost {
            self.store.charge(new_cost - old_cost)?;
        } else {
            self.store.uncharge(old_cost - new_cost);
        }
        inode.xattrs.insert(name.to_owned(), value.to_vec());
        inode.ctime = now();
        Ok(())
    }

    pub fn getxattr(&self, ino: Ino, name: &OsStr) -> Result<Vec<u8>> {
        check_xattr_name(name)?;
        let st = self.state.read();
        st.get(ino)?.xattrs.get(name).cloned().ok_or(Errno::ENODATA)
    }

    /// All names, each followed by a NUL, as listxattr(2) returns them.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<u8>> {
        let st = self.state.read();
        let mut out = Vec::new();
        for name in st.get(ino)?.xattrs.keys() {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
        }
        Ok(out)
    }

    pub fn removexattr(&self, ino: Ino, name: &OsStr) -> Result<()> {
        let _change = self.store.change();
        check_xattr_name(name)?;
        let mut st = self.state.write();
        let inode = st.get_mut(ino)?;
        inode.check_fixed()?;
        let v = inode.xattrs.remove(name).ok_or(Errno::ENODATA)?;
        self.store.uncharge(xattr_cost(name, &v));
        inode.ctime = now();
        Ok(())
    }
}
