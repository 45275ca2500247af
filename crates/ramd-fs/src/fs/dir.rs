//! A directory's entries, and the cookies that are its readdir offsets.
//!
//! The kernel reads directories without opening them on ramd's side
//! (FUSE_NO_OPENDIR_SUPPORT: no OPENDIR or RELEASEDIR round trip, and no
//! per-open listing to keep), so a READDIR's offset alone must say where
//! to go on, whatever was added or removed since the last call. Each entry
//! gets a cookie when it is added, one more than any before it in this
//! directory, and a listing goes in cookie order: an entry present for the
//! whole listing is returned exactly once, as POSIX asks; one added or
//! removed meanwhile may or may not be. Cookies 1 and 2 are "." and "..".
//! Cookies are not saved: a load hands them out afresh, in name order.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use super::Ino;

/// The first cookie of a named entry ("." is 1, ".." 2).
pub(super) const FIRST_COOKIE: u64 = 3;

#[derive(Debug, Default)]
pub(super) struct Entries {
    /// name → (inode, cookie).
    by_name: BTreeMap<OsString, (Ino, u64)>,
    /// cookie → name, for listings.
    by_cookie: BTreeMap<u64, OsString>,
    /// The cookie the next new name gets.
    next: u64,
    /// Listed from the start since [`Entries::take_listed`] last said so:
    /// the kernel may keep that listing (see `FuseFs::listing_may_move_atime`).
    listed: AtomicBool,
}

impl Entries {
    pub(super) fn new() -> Entries {
        Entries {
            by_name: BTreeMap::new(),
            by_cookie: BTreeMap::new(),
            next: FIRST_COOKIE,
            listed: AtomicBool::new(false),
        }
    }

    /// Points `name` at `ino`; a name already present keeps its cookie (a
    /// rename over it, an exchange: the name did not move). The inode it
    /// named before, if any.
    pub(super) fn insert(&mut self, name: OsString, ino: Ino) -> Option<Ino> {
        if let Some((old, _)) = self.by_name.get_mut(&name) {
            return Some(std::mem::replace(old, ino));
        }
        let cookie = self.next;
        self.next += 1;
        self.by_cookie.insert(cookie, name.clone());
        self.by_name.insert(name, (ino, cookie));
        None
    }

    pub(super) fn remove(&mut self, name: &OsStr) -> Option<Ino> {
        let (ino, cookie) = self.by_name.remove(name)?;
        self.by_cookie.remove(&cookie);
        Some(ino)
    }

    pub(super) fn get(&self, name: &OsStr) -> Option<&Ino> {
        self.by_name.get(name).map(|(ino, _)| ino)
    }

    pub(super) fn contains_key(&self, name: &OsStr) -> bool {
        self.by_name.contains_key(name)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The entries in name order (saves, checks).
    pub(super) fn iter(&self) -> impl Iterator<Item = (&OsString, &Ino)> {
        self.into_iter()
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = &OsString> {
        self.by_name.keys()
    }

    /// Takes `old`'s cookies for the names both hold, and new ones after
    /// all of `old`'s for the rest: a standby installing a save's tree
    /// (`fs/follow.rs`) keeps a listing that goes on across the apply
    /// returning each name that stayed exactly once.
    pub(super) fn keep_cookies_of(&mut self, old: &Entries) {
        let mut next = old.next.max(FIRST_COOKIE);
        let mut by_cookie = BTreeMap::new();
        for (name, (_, cookie)) in self.by_name.iter_mut() {
            *cookie = match old.by_name.get(name) {
                Some(&(_, c)) => c,
                None => {
                    next += 1;
                    next - 1
                }
            };
            by_cookie.insert(*cookie, name.clone());
        }
        self.by_cookie = by_cookie;
        self.next = next;
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Ino> {
        self.by_name.values().map(|(ino, _)| ino)
    }

    pub(super) fn set_listed(&self) {
        self.listed.store(true, Relaxed);
    }

    /// Whether the directory was listed from the start since the last call.
    pub(super) fn take_listed(&self) -> bool {
        self.listed.swap(false, Relaxed)
    }

    /// The entries after cookie `after`, in cookie order: (cookie, name,
    /// inode).
    pub(super) fn after(&self, after: u64) -> impl Iterator<Item = (u64, &OsString, Ino)> {
        self.by_cookie
            .range(after.saturating_add(1)..)
            .map(|(&cookie, name)| (cookie, name, self.by_name[name].0))
    }
}

/// The same names for the same inodes (cookies aside).
impl PartialEq for Entries {
    fn eq(&self, other: &Entries) -> bool {
        self.by_name.len() == other.by_name.len()
            && self.iter().zip(other.iter()).all(|(a, b)| a == b)
    }
}

type ByName<'a> = std::collections::btree_map::Iter<'a, OsString, (Ino, u64)>;
type Entry<'a> = (&'a OsString, &'a Ino);

impl<'a> IntoIterator for &'a Entries {
    type Item = Entry<'a>;
    type IntoIter = std::iter::Map<ByName<'a>, fn((&'a OsString, &'a (Ino, u64))) -> Entry<'a>>;

    fn into_iter(self) -> Self::IntoIter {
        self.by_name.iter().map(|(name, (ino, _))| (name, ino))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(e: &Entries, after: u64) -> Vec<(u64, String)> {
        e.after(after)
            .map(|(c, n, _)| (c, n.to_string_lossy().into_owned()))
            .collect()
    }

    #[test]
    fn a_cookie_stays_valid_while_other_entries_come_and_go() {
        let mut e = Entries::new();
        for (i, n) in ["b", "a", "c"].iter().enumerate() {
            assert_eq!(e.insert(n.into(), Ino(10 + i as u64)), None);
        }
        let first = names(&e, 0);
        assert_eq!(first, [(3, "b".into()), (4, "a".into()), (5, "c".into())]);
        // A listing stopped after "b" (cookie 3); "b" and "a" go, "d"
        // comes: going on from 3 returns the untouched "c" and the new "d".
        e.remove(OsStr::new("b"));
        e.remove(OsStr::new("a"));
        e.insert("d".into(), Ino(13));
        assert_eq!(names(&e, 3), [(5, "c".into()), (6, "d".into())]);
        // A name that comes back is new: it does not reuse its old cookie.
        e.insert("a".into(), Ino(14));
        assert_eq!(names(&e, 5), [(6, "d".into()), (7, "a".into())]);
        // Replacing what a name points at keeps its place.
        assert_eq!(e.insert("c".into(), Ino(20)), Some(Ino(12)));
        assert_eq!(
            e.after(4).next().map(|(c, _, i)| (c, i)),
            Some((5, Ino(20)))
        );
        let by_name: Vec<_> = e.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(by_name, ["a", "c", "d"]);
        assert!(e.contains_key(OsStr::new("d")) && !e.contains_key(OsStr::new("b")));
    }

    #[test]
    fn a_new_tree_keeps_the_cookies_of_the_names_it_shares() {
        let mut old = Entries::new();
        for (i, n) in ["x", "b", "m"].iter().enumerate() {
            old.insert(n.into(), Ino(i as u64 + 10));
        }
        // What a load builds: name order.
        let mut new = Entries::new();
        for (i, n) in ["a", "b", "m", "z"].iter().enumerate() {
            new.insert(n.into(), Ino(i as u64 + 20));
        }
        new.keep_cookies_of(&old);
        assert_eq!(
            names(&new, 0),
            [
                (4, "b".into()),
                (5, "m".into()),
                (6, "a".into()),
                (7, "z".into())
            ]
        );
        // A listing that had reached "b" under the old tree goes on with
        // "m" and the new names, never "b" again.
        assert_eq!(names(&new, 4).first().map(|(c, _)| *c), Some(5));
        new.insert("q".into(), Ino(30));
        assert_eq!(names(&new, 7), [(8, "q".into())]);
    }
}
