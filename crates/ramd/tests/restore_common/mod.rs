//! `ramd image restore` and `--keep-saves`, the same steps for an image in
//! a directory (tests/persist.rs) and in object storage (tests/s3.rs):
//! saves with different data over three chains, a restore to each save and
//! to a time between two, each compared byte for byte with what the disk
//! held then; the chains kept across full saves; a prune that drops the
//! kept chain older than its retention only; refusals of bad input.

use crate::common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const SIZE: u64 = 8 * MIB;

fn pairs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// `ramd ARGS` with `env`.
fn ramd_env(run: &Path, args: &[&str], env: &[(String, String)]) -> Output {
    let mut c = Command::new(ramd_bin());
    c.arg("--run-dir").arg(run).args(args).envs(pairs(env));
    run_cmd(&mut c)
}

fn run_cmd(c: &mut Command) -> Output {
    crate::common::run(c, CMD_TIMEOUT)
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Writes `len` random bytes at `at` over NBD, and into `model`.
fn write_random(uri: &str, dir: &Path, model: &mut [u8], at: u64, len: u64) {
    let data = dir.join(format!("data-{at}-{len}"));
    random_file(&data, len);
    qemu_io(uri, &[format!("write -s {} {at} {len}", data.display())]);
    model[at as usize..(at + len) as usize].copy_from_slice(&std::fs::read(&data).unwrap());
}

/// Asserts the image at `img` holds `model`, exported to a raw file.
pub fn assert_image_is(
    run: &Path,
    img: &str,
    env: &[(String, String)],
    model: &[u8],
    tmp: &Path,
    what: &str,
) {
    let raw = tmp.join("export.raw");
    let _ = std::fs::remove_file(&raw);
    ramd_env(
        run,
        &["image", "export", img, "--to", raw.to_str().unwrap()],
        env,
    )
    .ok();
    let disk = std::fs::read(&raw).unwrap();
    assert_eq!(disk.len(), model.len(), "{what}");
    if let Some(i) = (0..disk.len()).find(|&i| disk[i] != model[i]) {
        panic!(
            "{what}: {img} holds byte {i} = {:#x}, not the {:#x} of then",
            disk[i], model[i]
        );
    }
}

fn ls(run: &Path, img: &str, env: &[(String, String)]) -> Vec<Value> {
    let out = ramd_env(run, &["image", "ls", img, "--json"], env).ok();
    serde_json::from_str::<Value>(&out)
        .unwrap_or_else(|e| panic!("image ls --json ({e}): {out}"))
        .as_array()
        .unwrap()
        .clone()
}

fn id_of(run: &Path, img: &str, env: &[(String, String)]) -> String {
    let out = ramd_env(run, &["image", "info", img, "--json"], env).ok();
    let v: Value = serde_json::from_str(&out).unwrap();
    v["id"].as_str().unwrap().to_string()
}

/// The scenario on image `img` (new), restoring to `dests` (new places,
/// at least 10; a mix of directories and URLs is fine), with `env`.
pub fn restore_scenario(img: &str, dests: &[String], env: &[(String, String)], tmp: &Path) {
    let run = tmp.join("run");
    std::fs::create_dir_all(&run).unwrap();
    let mut d = Ramd::try_start_in_with(
        &run,
        &["--size", "8M", "--image", img, "--keep-saves", "1h"],
        &pairs(env),
        None,
    )
    .unwrap_or_else(|(s, e)| panic!("serve {img} ({s}):\n{e}"));
    let mut model = vec![0u8; SIZE as usize];
    // (seq, model) of each save: 1 full, 2, 3 full, 4, 5 full, 6: two
    // chains replaced by full saves, kept, and the image's own.
    let mut saves: Vec<(u64, Vec<u8>)> = Vec::new();
    for i in 0..6u64 {
        // A region of its own, and one every save overwrites.
        write_random(d.uri(), tmp, &mut model, (i + 1) * MIB, 256 * KIB);
        write_random(d.uri(), tmp, &mut model, 0, 64 * KIB);
        if i == 2 {
            // The kept chain [1, 2] is to be older than a retention that
            // keeps [3, 4]: save 3 comes well after save 2 (see the prune
            // below).
            let t2 = ls(&run, img, env).last().unwrap()["time_ns"]
                .as_u64()
                .unwrap();
            wait_until(
                Duration::from_secs(30),
                "the clock to pass save 2 by 4 s",
                || now_ns() > t2 + 4_000_000_000,
            );
        }
        let mut args = vec!["snapshot", d.name(), "--json"];
        if i == 2 || i == 4 {
            args.push("--full");
        }
        let out = ramd_env(&run, &args, env).ok();
        let r: Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(r["full"], i % 2 == 0, "save {i}: {r}");
        saves.push((field(&r, "seq"), model.clone()));
    }
    d.stop();

    // Every save is listed, each from the MANIFEST that names it.
    let listed = ls(&run, img, env);
    let seqs: Vec<u64> = listed.iter().map(|s| field(s, "seq")).collect();
    let want: Vec<u64> = saves.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, want, "{listed:?}");
    let named: Vec<&str> = listed
        .iter()
        .map(|s| s["manifest"].as_str().unwrap())
        .collect();
    assert_eq!(
        named,
        [
            "MANIFEST-00000001",
            "MANIFEST-00000001",
            "MANIFEST-00000003",
            "MANIFEST-00000003",
            "MANIFEST",
            "MANIFEST"
        ],
        "{listed:?}"
    );
    let time = |seq: u64| {
        listed
            .iter()
            .find(|s| field(s, "seq") == seq)
            .map(|s| field(s, "time_ns"))
            .unwrap()
    };

    // Each save, restored, is the disk as it was then.
    let src_id = id_of(&run, img, env);
    for (i, (seq, then)) in saves.iter().enumerate() {
        let out = ramd_env(
            &run,
            &[
                "image",
                "restore",
                img,
                "--at",
                &seq.to_string(),
                "--to",
                &dests[i],
            ],
            env,
        )
        .ok();
        assert!(out.contains(&format!("restored save {seq} ")), "{out}");
        assert_image_is(&run, &dests[i], env, then, tmp, &format!("save {seq}"));
        assert_ne!(
            id_of(&run, &dests[i], env),
            src_id,
            "a restore is a new disk"
        );
    }

    // A time between saves 3 and 4 (nanoseconds, RFC 3339) is save 3.
    let (s3, s4) = (saves[2].0, saves[3].0);
    let between = (time(s3) + time(s4)) / 2;
    let when = format!(
        "{}",
        humantime::format_rfc3339_nanos(UNIX_EPOCH + Duration::from_nanos(between))
    );
    let out = ramd_env(
        &run,
        &[
            "image",
            "restore",
            img,
            "--at",
            &when,
            "--to",
            &dests[6],
            "--same-id",
        ],
        env,
    )
    .ok();
    assert!(
        out.contains(&format!("restored save {s3} ")),
        "{when}: {out}"
    );
    assert_eq!(id_of(&run, &dests[6], env), src_id, "--same-id");
    // Served as any image.
    let served = Ramd::try_start_in_with(
        &tmp.join("served"),
        &["--image", &dests[6]],
        &pairs(env),
        None,
    )
    .unwrap_or_else(|(s, e)| panic!("serve the restored {} ({s}):\n{e}", dests[6]));
    require_tool("nbdcopy");
    let raw = tmp.join("served.raw");
    run_ok(&mut cmd("nbdcopy", [served.uri(), raw.to_str().unwrap()]));
    assert!(
        std::fs::read(&raw).unwrap() == saves[2].1,
        "the restored image, served, is not save {s3}"
    );
    drop(served);

    // Bad input: clear refusals, nothing written.
    let refused = |at: &str, to: &str| {
        ramd_env(
            &run,
            &["image", "restore", img, "--at", at, "--to", to],
            env,
        )
        .failed()
        .stderr
    };
    let e = refused("99", &dests[7]);
    assert!(e.contains("no kept save 99"), "{e}");
    assert!(e.contains("the kept saves are 1 "), "{e}");
    let e = refused("1 day ago", &dests[7]);
    assert!(e.contains("no kept save at or before"), "{e}");
    let e = refused("yesterday-ish", &dests[7]);
    assert!(e.contains("not a save's sequence number"), "{e}");
    let e = refused("1", &dests[0]);
    assert!(
        e.contains(&dests[0]) && e.contains("holds an image already"),
        "{e}"
    );
    let e = refused("1", img);
    assert!(e.contains("holds an image already"), "{e}");

    // A prune with a retention that save 2 is past and save 4 is not
    // (saves 3 and 4 came more than 4 s after save 2: 2 s either side)
    // drops the chain [1, 2] only.
    let keep_ms = (now_ns() - time(saves[1].0)) / 1_000_000 - 2000;
    let out = ramd_env(
        &run,
        &[
            "image",
            "prune",
            img,
            "--keep-saves",
            &format!("{keep_ms}ms"),
        ],
        env,
    )
    .ok();
    assert!(out.contains("MANIFEST-00000001"), "{out}");
    assert!(!out.contains("MANIFEST-00000003"), "{out}");
    let seqs: Vec<u64> = ls(&run, img, env).iter().map(|s| field(s, "seq")).collect();
    assert_eq!(seqs, want[2..], "after the prune");
    let e = refused("1", &dests[7]);
    assert!(e.contains("no kept save 1"), "{e}");
    // A prune without --keep-saves leaves kept chains alone.
    ramd_env(&run, &["image", "prune", img], env).ok();
    let seqs: Vec<u64> = ls(&run, img, env).iter().map(|s| field(s, "seq")).collect();
    assert_eq!(seqs, want[2..], "after a prune without --keep-saves");
    let out = ramd_env(
        &run,
        &["image", "restore", img, "--at", "4", "--to", &dests[8]],
        env,
    )
    .ok();
    assert!(out.contains("restored save 4 "), "{out}");
    assert_image_is(
        &run,
        &dests[8],
        env,
        &saves[3].1,
        tmp,
        "save 4 after the prune",
    );
}
