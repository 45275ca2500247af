//! A disk's control socket: each request line (`status`, `snapshot`,
//! `remount`, `promote`, `stop`, `wait`...) answered by the disk, or passed
//! to the daemon's loop as an [`Event`].

use std::path::Path;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use super::{Disk, Events};
use crate::control::Request;
use crate::event::Event;

/// The control socket's answers for one disk.
pub(super) fn disk_handler(
    target: Arc<OnceLock<Weak<Disk>>>,
    events: Events,
) -> crate::control::Handler {
    let events = Mutex::new(events);
    Arc::new(move |req: Request| {
        let disk = target.get().and_then(Weak::upgrade);
        let Some(disk) = disk else {
            return req.answer(Err("the disk is starting or stopping".into()));
        };
        match req.line() {
            "status" => {
                let status = disk.status();
                req.answer(Ok(serde_json::json!({ "disks": [status] })))
            }
            line if line == "snapshot" || line.starts_with("snapshot ") => {
                // `snapshot [full] [to DIR]`
                let line = line.to_string();
                let rest = line["snapshot".len()..].trim_start();
                let (full, rest) = match rest.strip_prefix("full") {
                    Some(r) => (true, r.trim_start()),
                    None => (false, rest),
                };
                let to = rest.strip_prefix("to ").map(Path::new);
                if to.is_none() && !rest.is_empty() {
                    return req.answer(Err(format!("unknown control request {line:?}")));
                }
                let r = disk
                    .snapshot(full, to)
                    .map(|r| {
                        let mut v = serde_json::to_value(r).expect("report serializes");
                        v["path"] = disk.image_path().into();
                        v
                    })
                    .map(|v| serde_json::json!({ "snapshot": v }))
                    .map_err(|e| format!("{e:#}"));
                req.answer(r)
            }
            // `promote [force] [wait SECS]`
            line if line == "promote" || line.starts_with("promote ") => {
                let line = line.to_string();
                let words: Vec<&str> = line.split_whitespace().skip(1).collect();
                let (mut force, mut wait) = (false, Duration::ZERO);
                let mut it = words.iter();
                while let Some(w) = it.next() {
                    match (*w, it.clone().next()) {
                        ("force", _) => force = true,
                        ("wait", Some(v)) => match v.parse::<f64>() {
                            Ok(secs) if secs >= 0.0 && secs.is_finite() => {
                                wait = Duration::from_secs_f64(secs);
                                it.next();
                            }
                            _ => return req.answer(Err(format!("promote: bad wait {v:?}"))),
                        },
                        _ => return req.answer(Err(format!("unknown control request {line:?}"))),
                    }
                }
                let r = disk
                    .promote(force, wait)
                    .map(|r| {
                        let mut v = serde_json::to_value(r).expect("report serializes");
                        v["path"] = disk.image_path().into();
                        v["id"] = disk.id.to_string().into();
                        serde_json::json!({ "promoted": v })
                    })
                    .map_err(|e| format!("{e:#}"));
                req.answer(r)
            }
            // Answered once the disk is gone (the umount helper waits for
            // the save at stop this way); nothing is stopped.
            "wait" => {
                let disk = disk.args.name.clone();
                let _ = events.lock().send(Event::WaitDisk { disk, req });
            }
            line if line.starts_with("remount ") => {
                let r = disk
                    .remount(&line["remount ".len()..])
                    .map_err(|e| format!("{e:#}"));
                req.answer(r)
            }
            // Stopping is the daemon's business: it owns the disk.
            "stop" | "stop force" => {
                let force = req.line() == "stop force";
                // Unsent (the daemon is gone), the request answers itself.
                let disk = disk.args.name.clone();
                let _ = events.lock().send(Event::StopDisk { disk, req, force });
            }
            other => {
                let msg = format!("unknown control request {other:?}");
                req.answer(Err(msg))
            }
        }
    })
}
