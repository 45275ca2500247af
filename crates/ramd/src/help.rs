//! Help beyond `--help`, generated from the one CLI definition (`cli.rs`):
//! shell completion scripts (clap_complete) and manual pages (clap_mangen),
//! so neither can drift from the flags ramd really takes.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use clap::CommandFactory;
use clap_complete::Shell;

use crate::cli::Cli;

/// `ramd completions SHELL`: the script on stdout.
pub fn completions(shell: Shell) -> Result<()> {
    let mut cmd = Cli::command();
    let mut out = std::io::stdout().lock();
    clap_complete::generate(shell, &mut cmd, "ramd", &mut out);
    out.flush().context("writing the completion script")
}

/// The CLI as the man pages see it: built (so subcommands are named
/// `ramd-serve` and so on) and without clap's `help` subcommand.
fn command() -> clap::Command {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

/// `ramd man [COMMAND…]`: the page of ramd (or of `ramd COMMAND…`) as roff
/// on stdout; with `out_dir`, every page written there as `ramd*.1`.
pub fn man(path: &[String], out_dir: Option<&Path>) -> Result<()> {
    let cmd = command();
    if let Some(dir) = out_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let n = write_pages(cmd, dir)
            .with_context(|| format!("writing man pages to {}", dir.display()))?;
        println!("wrote {n} ramd man pages to {}", dir.display());
        return Ok(());
    }
    let mut page = cmd;
    for (i, name) in path.iter().enumerate() {
        let Some(sub) = page.find_subcommand(name).cloned() else {
            let known: Vec<&str> = page.get_subcommands().map(|c| c.get_name()).collect();
            let parent: Vec<&str> = ["ramd"]
                .into_iter()
                .chain(path[..i].iter().map(String::as_str))
                .collect();
            bail!(
                "`{}` has no command {name:?} (its commands: {})",
                parent.join(" "),
                known.join(", ")
            );
        };
        page = sub;
    }
    let mut out = std::io::stdout().lock();
    page_of(page)
        .render(&mut out)
        .and_then(|()| out.flush())
        .context("writing the man page")
}

/// Every page has the same footer: "ramd VERSION", "ramd manual".
fn page_of(cmd: clap::Command) -> clap_mangen::Man {
    clap_mangen::Man::new(cmd)
        .source(format!("ramd {}", env!("CARGO_PKG_VERSION")))
        .manual("ramd manual")
}

/// `cmd`'s page and those of its commands, recursively; how many.
fn write_pages(cmd: clap::Command, dir: &Path) -> std::io::Result<usize> {
    let mut n = 0;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        n += write_pages(sub.clone(), dir)?;
    }
    page_of(cmd).generate_to(dir)?;
    Ok(n + 1)
}
