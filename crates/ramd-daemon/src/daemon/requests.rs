//! The daemon's own control socket: `status` of every disk, `down` (all
//! of them or one), and `reload` of the config file (what changed starts,
//! stops or is refused).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{json, Value};

use super::{Daemon, Mode, Stop};
use crate::args::DiskArgs;
use crate::config::{self};
use crate::control::Request;
use crate::notify;
use crate::status::DaemonStatus;

impl Daemon {
    pub(super) fn daemon_request(&mut self, req: Request) {
        let line = req.line().to_string();
        // `down [NAME] [--force]`
        let force = line.split_whitespace().any(|w| w == "--force");
        let words: Vec<&str> = line
            .split_whitespace()
            .filter(|w| *w != "--force")
            .collect();
        let how = if force { Stop::Force } else { Stop::Ask };
        let (verb, arg) = match words.as_slice() {
            [v] => (*v, None),
            [v, a] => (*v, Some(*a)),
            _ => ("", None),
        };
        match (verb, arg) {
            ("status", None) => {
                let status = self.status();
                req.answer(Ok(json!({ "daemon": status })))
            }
            ("down", None) => {
                self.end();
                self.down_all.push(req);
                self.finish_all_as(how);
            }
            ("down", Some(name)) => {
                if self.disks.contains_key(name) {
                    self.finish(name, Some(req), how);
                } else if self.published.failed.lock().remove(name).is_some() {
                    // A disk that never started: nothing to stop or save.
                    req.answer(Ok(json!({ "stopped": name, "saved": false })))
                } else {
                    let names: Vec<&str> = self.disks.keys().map(String::as_str).collect();
                    req.answer(Err(format!(
                        "no disk named {name:?} in this daemon (its disks: {})",
                        if names.is_empty() {
                            "none".to_string()
                        } else {
                            names.join(", ")
                        }
                    )))
                }
            }
            ("reload", path) => {
                let r = self.reload(path.map(PathBuf::from));
                req.answer(r)
            }
            _ => req.answer(Err(format!("unknown daemon request {line:?}"))),
        }
    }

    fn status(&self) -> DaemonStatus {
        let used = self
            .disks
            .values()
            .map(|r| r.disk.store().stats().memory_used)
            .sum();
        self.published.daemon(used)
    }

    /// `ramd reload`: reads the config file again (or `path`), checks all
    /// of it, then starts the disks it adds and stops those it removes.
    /// Disks in both are not touched, even if their settings changed (that
    /// takes `ramd down NAME` and another reload). A file that does not
    /// parse or check changes nothing.
    pub(super) fn reload(&mut self, path: Option<PathBuf>) -> std::result::Result<Value, String> {
        notify::reloading();
        let r = self.reload_inner(path);
        notify::ready(&self.summary());
        r
    }

    fn reload_inner(&mut self, path: Option<PathBuf>) -> std::result::Result<Value, String> {
        let Mode::Up {
            config,
            settings,
            all_or_nothing,
        } = &self.mode
        else {
            return Err("only `ramd up` reloads".into());
        };
        let all_or_nothing = *all_or_nothing;
        let path = path.unwrap_or_else(|| config.clone());
        let plan = config::load(&path).map_err(|e| format!("{e:#} (nothing was changed)"))?;
        let mut notes = Vec::new();
        if plan.daemon != *settings {
            notes.push(format!(
                "[daemon] of {} changed: it takes effect when the daemon restarts",
                path.display()
            ));
        }
        let wanted: BTreeMap<String, DiskArgs> = plan
            .disks
            .into_iter()
            .map(|(a, _)| (a.name.clone(), a))
            .collect();
        let removed: Vec<String> = self
            .disks
            .iter()
            .filter(|(n, r)| !wanted.contains_key(*n) && !r.finishing)
            .map(|(n, _)| n.clone())
            .collect();
        let mut added = Vec::new();
        let mut unchanged = Vec::new();
        for (name, args) in &wanted {
            match self.disks.get(name) {
                None => added.push(args.clone()),
                Some(r) if r.finishing => {
                    return Err(format!(
                        "disk {name:?} is still stopping: reload again once it is gone \
                         (nothing was changed)"
                    ))
                }
                Some(r) => {
                    if r.disk.args().fingerprint() != args.fingerprint() {
                        notes.push(format!(
                            "disk {name:?} changed in {}: its new settings take effect once \
                             it is restarted (`ramd down {name}` then `ramd reload`)",
                            path.display()
                        ));
                    }
                    unchanged.push(name.clone());
                }
            }
        }
        self.check_claims(&added, &path, all_or_nothing)
            .map_err(|e| format!("{e:#} (nothing was changed)"))?;
        for n in &notes {
            log::warn!("{n}");
        }
        for n in &removed {
            self.finish(n, None, Stop::Ask);
        }
        // Failed disks the file no longer names are forgotten.
        self.published
            .failed
            .lock()
            .retain(|n, _| wanted.contains_key(n));
        let names = if all_or_nothing {
            self.open(added)
                .map_err(|e| format!("{e:#} (disks removed from the file are stopping)"))?
        } else {
            self.open_each(added)
        };
        if let Mode::Up { config, .. } = &mut self.mode {
            *self.published.config.lock() = Some(path.display().to_string());
            *config = path;
        }
        if !self.published.failed.lock().is_empty() {
            return Err(format!(
                "{} (started: {})",
                self.failed_text(),
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ));
        }
        Ok(json!({
            "added": names, "removed": removed, "unchanged": unchanged, "notes": notes,
        }))
    }
}
