//! How an image load's progress is shown: a bar on a terminal, else a log
//! line at each quarter. The engine only reports it
//! (`ramd_store::persist::Progress`); the daemon gets this through its
//! `Setup`, `ramd image` commands call it themselves.

use std::io::IsTerminal;

use ramd_store::persist::Progress;

/// A fresh reporter for one load.
pub fn load_progress() -> Box<dyn FnMut(Progress)> {
    let mut bar: Option<Option<indicatif::ProgressBar>> = None;
    let mut logged = 0;
    Box::new(move |p| match p {
        Progress::Read { done, total } => match bar.get_or_insert_with(|| progress_bar(total)) {
            Some(b) => b.set_position(done),
            None => {
                let quarter = done * 4 / total.max(1);
                if quarter > logged && quarter < 4 {
                    logged = quarter;
                    log::info!("loading: {}%", quarter * 25);
                }
            }
        },
        Progress::Done => {
            if let Some(Some(b)) = bar.take() {
                b.finish_and_clear();
            }
        }
    })
}

fn progress_bar(total: u64) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let b = indicatif::ProgressBar::new(total);
    b.set_style(
        indicatif::ProgressStyle::with_template(
            "loading {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template"),
    );
    Some(b)
}
