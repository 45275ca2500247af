//! Reading /proc/self/mountinfo: whether a path is a mount point, its
//! device, type and read-only flag, without ever asking the filesystem
//! mounted there (safe on a FUSE mount whose daemon is not serving); and
//! the remount to read-write.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::mount::ms_flag;

/// Whether `path` is already a mount point (listed in /proc/self/mountinfo).
pub fn is_mount_point(path: &Path) -> bool {
    mount_device(path).is_some()
}

/// The device (major, minor) of the topmost mount at `path`, from
/// /proc/self/mountinfo. Unlike stat(2), this never asks the filesystem,
/// so it is safe on a FUSE mount whose daemon is not serving yet.
pub fn mount_device(path: &Path) -> Option<(u32, u32)> {
    let line = mountinfo_line(path)?;
    let dev = line.split(' ').nth(2)?;
    let (major, minor) = dev.split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Whether the topmost mount at `path` is read-only (the mount's own flag
/// or its superblock's), from /proc/self/mountinfo: a remount changes it
/// behind the filesystem's back.
pub fn mount_read_only(path: &Path) -> Option<bool> {
    let line = mountinfo_line(path)?;
    let mount_opts = line.split(' ').nth(5)?;
    let (_, tail) = line.split_once(" - ")?;
    let super_opts = tail.split(' ').nth(2)?;
    let ro = |opts: &str| opts.split(',').any(|o| o == "ro");
    Some(ro(mount_opts) || ro(super_opts))
}

/// Makes the topmost mount at `path` read-write (its superblock and the
/// mount itself, with `mount(2)` `MS_REMOUNT`), keeping its other flags as
/// /proc/self/mountinfo shows them: a promoted standby's mount.
pub fn remount_read_write(path: &Path) -> std::io::Result<()> {
    let line = mountinfo_line(path)
        .ok_or_else(|| std::io::Error::other(format!("{} is not a mount point", path.display())))?;
    let field = |n: usize| line.split(' ').nth(n).unwrap_or("").to_string();
    let super_opts = line
        .split_once(" - ")
        .and_then(|(_, t)| t.split(' ').nth(2))
        .unwrap_or("")
        .to_string();
    let mut flags = libc::MS_REMOUNT;
    let mut atime = false;
    for o in field(5).split(',').chain(super_opts.split(',')) {
        // Not "ro": this remount is the one that makes it read-write.
        if o != "ro" {
            flags |= ms_flag(o).unwrap_or(0);
        }
        atime |= o == "noatime" || o == "relatime";
    }
    if !atime {
        flags |= libc::MS_STRICTATIME;
    }
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: mount(2) with a NUL-terminated path we own; no source, type
    // or data (FUSE takes none on a remount).
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            c.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The /proc/self/mountinfo line of the topmost mount at `path`.
fn mountinfo_line(path: &Path) -> Option<String> {
    mountinfo_line_at(&path.canonicalize().ok()?)
}

/// The /proc/self/mountinfo line of the topmost mount at `path`, which is
/// already absolute and free of links.
fn mountinfo_line_at(path: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.as_os_str().as_bytes();
    // Later lines are mounted on top of earlier ones.
    info.lines()
        .rev()
        .find(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|mp| unescape_mountinfo(mp) == want)
        })
        .map(str::to_string)
}

/// mountinfo writes space, tab, newline and backslash as octal escapes.
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// The filesystem type (`fuse.ramd`, `ext4`, ...) of the topmost mount at
/// `path`, found without touching the mount itself: only its parent is
/// resolved, so this works on a dead FUSE mount, where stat(2) of `path`
/// fails with ENOTCONN.
pub fn mount_type_at(path: &Path) -> Option<String> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.canonicalize().ok()?,
        _ => std::env::current_dir().ok()?,
    };
    let line = mountinfo_line_at(&parent.join(path.file_name()?))?;
    let (_, tail) = line.split_once(" - ")?;
    tail.split(' ').next().map(str::to_string)
}

/// The mount points of device `dev` in a mountinfo text (a process's
/// `/proc/PID/mountinfo`), as that process's namespace names them.
pub fn mount_points_of(mountinfo: &str, dev: (u32, u32)) -> Vec<std::path::PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let want = format!("{}:{}", dev.0, dev.1);
    mountinfo
        .lines()
        .filter(|l| l.split(' ').nth(2) == Some(want.as_str()))
        .filter_map(|l| l.split(' ').nth(4))
        .map(|mp| std::ffi::OsString::from_vec(unescape_mountinfo(mp)).into())
        .collect()
}
