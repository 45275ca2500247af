//! Settings groups of protocols beyond the built-in ones: a protocol
//! registered with a [`crate::Registry`] whose factory names a
//! [`GroupDef`] gets its `clap::Args` group added to every disk's flags
//! (and so to its config table's keys and mount options) and receives it
//! parsed, by type, through `get` on a `dyn DiskSettings`. The built-in
//! protocols' groups are flattened into the daemon's settings instead, so
//! that `--help` lists them where they always stood.
//!
//! The groups are process-wide: clap builds a disk's flags from a type
//! (`Args::augment_args`), with no registry at hand, so registering is
//! what makes a group part of that type's flags from then on.

use std::any::{Any, TypeId};
use std::fmt::Debug;
use std::sync::{Arc, RwLock};

/// A protocol's own settings group, as clap parses it.
pub trait Group: clap::Args + Debug + Send + Sync + 'static {
    /// One setting by its config key, as text to compare; `None`: not a
    /// key of this group.
    fn setting(&self, key: &str) -> Option<String>;
}

/// How a registered group is added to a disk's flags and read back.
#[derive(Clone, Copy)]
pub struct GroupDef {
    id: fn() -> TypeId,
    augment: fn(clap::Command) -> clap::Command,
    parse: fn(&clap::ArgMatches) -> Result<Parsed, clap::Error>,
}

impl GroupDef {
    pub fn of<G: Group>() -> GroupDef {
        GroupDef {
            id: TypeId::of::<G>,
            augment: G::augment_args,
            parse: |m| {
                let g = G::from_arg_matches(m)?;
                Ok(Parsed {
                    text: format!("{g:?}"),
                    setting: |g, key| g.downcast_ref::<G>().and_then(|g| g.setting(key)),
                    value: Arc::new(g),
                })
            },
        }
    }
}

/// One disk's value of a registered group.
#[derive(Clone)]
pub struct Parsed {
    value: Arc<dyn Any + Send + Sync>,
    /// Its `Debug` text, for a disk's fingerprint.
    text: String,
    setting: fn(&dyn Any, &str) -> Option<String>,
}

impl Debug for Parsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

static GROUPS: RwLock<Vec<GroupDef>> = RwLock::new(Vec::new());

/// Adds a group to every disk's flags from now on (once per type).
pub fn register(def: GroupDef) {
    let mut groups = GROUPS.write().unwrap_or_else(|e| e.into_inner());
    if !groups.iter().any(|g| (g.id)() == (def.id)()) {
        groups.push(def);
    }
}

fn registered() -> Vec<GroupDef> {
    GROUPS.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The registered groups of one disk, parsed: a field of a disk's
/// settings, flattened (`#[command(flatten)]`) after its own flags.
#[derive(Clone, Debug, Default)]
pub struct Groups(Vec<Parsed>);

impl Groups {
    /// The group of type `t`, if registered.
    pub fn get(&self, t: TypeId) -> Option<&dyn Any> {
        for p in &self.0 {
            let v: &dyn Any = &*p.value;
            if v.type_id() == t {
                return Some(v);
            }
        }
        None
    }

    /// One setting by its config key, from the group that has it.
    pub fn setting(&self, key: &str) -> Option<String> {
        self.0.iter().find_map(|p| (p.setting)(&*p.value, key))
    }
}

impl clap::FromArgMatches for Groups {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Groups, clap::Error> {
        registered()
            .iter()
            .map(|g| (g.parse)(m))
            .collect::<Result<_, _>>()
            .map(Groups)
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Groups::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for Groups {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        registered().iter().fold(cmd, |cmd, g| (g.augment)(cmd))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Groups::augment_args(cmd)
    }
}
