//! POSIX ACLs as the kernel hands them over in `system.posix_acl_*`
//! xattrs: a little-endian u32 version (2), then entries of tag (u16),
//! permissions (u16) and id (u32). The kernel checks access with them; `Fs`
//! only has to pass a directory's default ACL on to what is created in it.

/// Where POSIX ACLs live (the kernel reads and checks them itself).
pub(super) const ACL_ACCESS: &str = "system.posix_acl_access";
pub(super) const ACL_DEFAULT: &str = "system.posix_acl_default";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

/// The access ACL of a new inode created with `mode` (permission bits,
/// updated here) in a directory with default ACL `default`, as POSIX.1e
/// says (the kernel's `posix_acl_create`): each class is limited to what
/// `mode` asks for, and `mode` to what the ACL grants. `None` when the
/// result says no more than the mode (no ACL needed), or `default` is not
/// a well-formed ACL (then only the mode counts).
pub(super) fn inherit(default: &[u8], mode: &mut u32) -> Option<Vec<u8>> {
    let (head, body) = default.split_at_checked(4)?;
    if u32::from_le_bytes(head.try_into().ok()?) != VERSION || body.len() % 8 != 0 {
        return None;
    }
    let mut acl = default.to_vec();
    let mut m = *mode;
    let mut extended = false;
    let (mut group_obj, mut mask) = (None, None);
    for at in (4..acl.len()).step_by(8) {
        let tag = u16::from_le_bytes([acl[at], acl[at + 1]]);
        let perm = u16::from_le_bytes([acl[at + 2], acl[at + 3]]) as u32;
        let set = |acl: &mut Vec<u8>, p: u32| {
            acl[at + 2..at + 4].copy_from_slice(&(p as u16).to_le_bytes())
        };
        match tag {
            USER_OBJ => {
                let p = perm & (m >> 6) & 7;
                set(&mut acl, p);
                m &= (p << 6) | !0o700;
            }
            USER | GROUP => extended = true,
            GROUP_OBJ => group_obj = Some(at),
            MASK => {
                mask = Some(at);
                extended = true;
            }
            OTHER => {
                let p = perm & m & 7;
                set(&mut acl, p);
                m &= p | !0o007;
            }
            _ => return None,
        }
    }
    // The group class: the mask when there is one, else the owning group.
    let at = mask.or(group_obj)?;
    let perm = u16::from_le_bytes([acl[at + 2], acl[at + 3]]) as u32;
    let p = perm & (m >> 3) & 7;
    acl[at + 2..at + 4].copy_from_slice(&(p as u16).to_le_bytes());
    m &= (p << 3) | !0o070;
    *mode = m;
    extended.then_some(acl)
}

/// The permission bits an access ACL stands for (owner from the owner's
/// entry, group from the mask or else the owning group's, other from
/// other's), and whether it says more than they do (named users or groups,
/// a mask). `None` if it is not a well-formed ACL.
pub(super) fn mode_of(acl: &[u8]) -> Option<(u32, bool)> {
    let (head, body) = acl.split_at_checked(4)?;
    if u32::from_le_bytes(head.try_into().ok()?) != VERSION || body.len() % 8 != 0 {
        return None;
    }
    let (mut user, mut group, mut mask, mut other) = (None, None, None, None);
    let mut extended = false;
    for e in body.chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u32::from(u16::from_le_bytes([e[2], e[3]]) & 7);
        match tag {
            USER_OBJ => user = Some(perm),
            GROUP_OBJ => group = Some(perm),
            OTHER => other = Some(perm),
            MASK => {
                mask = Some(perm);
                extended = true;
            }
            USER | GROUP => extended = true,
            _ => return None,
        }
    }
    Some((user? << 6 | mask.or(group)? << 3 | other?, extended))
}
