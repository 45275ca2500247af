//! Help generated from the CLI definition: `ramd completions SHELL` gives
//! scripts the shells accept (and that complete ramd's real commands and
//! flags), `ramd man` pages that groff and man render without a warning.

mod common;

use common::*;
use std::fs;
use std::path::Path;
use std::process::Command;

fn ramd(args: &[&str]) -> String {
    run_ok(Command::new(ramd_bin()).args(args))
}

/// What bash's completion offers for the words of `line` (the last one
/// being completed), with the script `ramd completions bash` printed.
fn bash_completes(script: &Path, line: &str) -> Vec<String> {
    let bash = require_tool("bash");
    let words: Vec<&str> = line.split(' ').collect();
    let probe = format!(
        "source '{}' || exit 9\n\
         COMP_WORDS=({})\nCOMP_CWORD={}\nCOMP_LINE='{line}'\nCOMP_POINT={}\n\
         _ramd ramd '{}' '{}'\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        words
            .iter()
            .map(|w| format!("'{w}'"))
            .collect::<Vec<_>>()
            .join(" "),
        words.len() - 1,
        line.len(),
        words[words.len() - 1],
        words[words.len() - 2],
    );
    run_ok(Command::new(bash).args(["--norc", "--noprofile", "-c", &probe]))
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn bash_completion_parses_and_completes_commands_and_flags() {
    let tmp = scratch();
    let script = tmp.path().join("ramd.bash");
    fs::write(&script, ramd(&["completions", "bash"])).unwrap();
    run_ok(Command::new(require_tool("bash")).arg("-n").arg(&script));
    let registered = run_ok(Command::new(require_tool("bash")).args([
        "--norc",
        "-c",
        &format!("source '{}' && complete -p ramd", script.display()),
    ]));
    assert!(registered.contains("_ramd"), "{registered}");

    let c = bash_completes(&script, "ramd sta");
    assert_eq!(c, ["status"], "ramd sta<TAB>");
    let c = bash_completes(&script, "ramd status --wa");
    assert_eq!(c, ["--watch"], "ramd status --wa<TAB>");
    let mut c = bash_completes(&script, "ramd install-");
    c.sort();
    assert_eq!(
        c,
        ["install-mount-helper", "install-systemd"],
        "ramd install-<TAB>"
    );
}

#[test]
fn every_shell_gets_a_script() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let s = ramd(&["completions", shell]);
        assert!(s.contains("install-systemd"), "{shell}: {s}");
    }
    let e = run(
        Command::new(ramd_bin()).args(["completions", "tcsh"]),
        CMD_TIMEOUT,
    )
    .failed()
    .stderr;
    assert!(e.contains("possible values"), "{e}");
}

/// `groff -man` renders `page` with every warning on, and prints none.
fn assert_groff_clean(page: &Path) {
    let out = run(
        Command::new(require_tool("groff"))
            .args(["-man", "-Tutf8", "-ww", "-z"])
            .arg(page),
        CMD_TIMEOUT,
    );
    assert!(
        out.success() && out.stderr.trim().is_empty(),
        "groff on {}: {}\n{}",
        page.display(),
        out.status,
        out.stderr
    );
}

/// `man -l page`, as text.
fn man_renders(page: &Path) -> String {
    let out = run(
        Command::new(require_tool("man"))
            .arg("-l")
            .arg(page)
            .env("MANWIDTH", "100")
            .env("MANPAGER", "cat")
            .env("PAGER", "cat"),
        CMD_TIMEOUT,
    );
    assert!(out.success(), "man -l {}: {}", page.display(), out.stderr);
    out.stdout
}

#[test]
fn man_pages_render_without_warnings() {
    let tmp = scratch();
    let main = tmp.path().join("ramd.1");
    fs::write(&main, ramd(&["man"])).unwrap();
    assert_groff_clean(&main);
    let text = man_renders(&main);
    for want in [
        "ramd(1)",
        "SYNOPSIS",
        "install-systemd",
        "completions",
        "ramd 0.1.0",
    ] {
        assert!(text.contains(want), "no {want:?} in:\n{text}");
    }

    let status = tmp.path().join("ramd-status.1");
    fs::write(&status, ramd(&["man", "status"])).unwrap();
    assert_groff_clean(&status);
    let text = man_renders(&status);
    for want in ["ramd-status(1)", "--watch", "--interval"] {
        assert!(text.contains(want), "no {want:?} in:\n{text}");
    }
    let e = run(
        Command::new(ramd_bin()).args(["man", "image", "bogus"]),
        CMD_TIMEOUT,
    )
    .failed()
    .stderr;
    assert!(e.contains("`ramd image` has no command \"bogus\""), "{e}");

    // --out-dir: one page per command, every one clean.
    let dir = tmp.path().join("man1");
    ramd(&["man", "--out-dir", dir.to_str().unwrap()]);
    let mut pages: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    pages.sort();
    for want in [
        "ramd.1",
        "ramd-serve.1",
        "ramd-status.1",
        "ramd-image-verify.1",
    ] {
        assert!(pages.iter().any(|p| p == want), "no {want} in {pages:?}");
    }
    for p in &pages {
        assert_groff_clean(&dir.join(p));
    }
}
