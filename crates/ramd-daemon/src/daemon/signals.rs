//! Signals as the daemon loop's [`Event`]s: one thread turns SIGINT,
//! SIGTERM, SIGQUIT and SIGHUP into events, so that the loop handles them
//! with everything else.

use std::sync::mpsc::Sender;

use anyhow::{Context, Result};

use super::Hangup;
use crate::event::Event;

/// SIGINT, SIGTERM and SIGQUIT stop (a second one cuts clients off; the
/// save still happens); SIGHUP as `hangup` says. Every signal a terminal
/// or an init system sends is caught: none ends the process unsaved.
pub(super) fn on_signals(tx: Sender<Event>, hangup: Hangup) -> Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGQUIT, SIGHUP])
        .context("installing signal handlers")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                let event = match (sig, hangup) {
                    (SIGHUP, Hangup::Reload) => {
                        log::info!("signal {sig} (SIGHUP): reloading");
                        Event::Hangup
                    }
                    (SIGHUP, Hangup::Ignore) => {
                        log::warn!(
                            "signal {sig} (SIGHUP) ignored: this daemon has no terminal \
                             (`ramd down NAME` or `umount` stops it)"
                        );
                        continue;
                    }
                    _ => {
                        // A load under way (the loop hears this once the
                        // disks are open) stops now.
                        ramd_store::persist::stop_loading(true);
                        Event::Signal(sig)
                    }
                };
                if tx.send(event).is_err() {
                    return;
                }
            }
        })?;
    Ok(())
}
