//! The POSIX corners of the filesystem disk that tmpfs gets right, each
//! checked on ramd and, where the kernel's tmpfs is the oracle, on a kernel
//! tmpfs in the same test: privilege bits dropped on writes by another user,
//! no stale data after asynchronous direct writes, rewinddir, file handles
//! that outlive the kernel's inode cache, and unsupported ioctls logged once.
//! The clients are coreutils, util-linux (setpriv, fallocate), fio and small
//! C programs compiled here with gcc.

mod common;
mod fs_common;

use common::*;
use fs_common::*;
use std::fs;
use std::process::Command;

fn sh_env(script: &str, args: &[&str], env: (&str, &str)) -> Output {
    run(
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("sh")
            .args(args)
            .env(env.0, env.1),
        LONG_TIMEOUT,
    )
}

/// Runs `script` (arg 1: a fresh directory) on a kernel tmpfs and on
/// `disk`; asserts the outputs are identical and returns ramd's.
fn same_as_tmpfs(disk: &FsDisk, what: &str, script: &str) -> String {
    let tmpfs = KernelTmpfs::mount("size=64M");
    let mut outs = Vec::new();
    for root in [tmpfs.path(), disk.path()] {
        let d = root.join(what);
        fs::create_dir(&d).unwrap();
        outs.push(sh_env(script, &[s(&d)], ("ZERO", "")).ok());
    }
    assert_eq!(
        outs[1], outs[0],
        "{what}: ramd (left) differs from kernel tmpfs (right)"
    );
    outs.pop().unwrap()
}

/// Writes, truncates and fallocates (plain, punch hole, zero range) as
/// `nobody` without capabilities (zero range only with ZERO=zero in the
/// environment: tmpfs has no FALLOC_FL_ZERO_RANGE), on files of mode 6666 and 6676 owned by
/// root:root, then as `nobody` in group root; and chowns as root.
/// `stat` right after each must show what tmpfs shows.
const PRIVILEGE_SCRIPT: &str = r#"
set -e
cd "$1"
other='setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all'
member='setpriv --reuid=65534 --regid=0 --clear-groups --inh-caps=-all'
for who in other member; do
  eval "as=\$$who"
  for mode in 6666 6676 2666 4666; do
    for op in write truncate fallocate punch $ZERO; do
      f=$who.$mode.$op
      head -c 8192 /dev/zero > $f
      chmod $mode $f
      stat -c %a $f >/dev/null
      case $op in
        write) $as sh -c "printf x >> $f" ;;
        truncate) $as truncate -s 100 $f ;;
        fallocate) $as fallocate -l 16384 $f ;;
        punch) $as fallocate -p -o 0 -l 4096 $f ;;
        zero) $as fallocate -z -o 0 -l 4096 $f ;;
      esac
      echo "$f $(stat -c %a $f)"
    done
  done
done
for mode in 6755 6745 2745; do
  head -c 10 /dev/zero > chown.$mode
  chmod $mode chown.$mode
  chown 65534 chown.$mode
  echo "chown.$mode $(stat -c %a chown.$mode)"
done
"#;

#[test]
fn writes_by_another_user_drop_setuid_and_setgid_as_on_tmpfs() {
    for t in ["setpriv", "fallocate", "truncate", "stat"] {
        require_tool(t);
    }
    let disk = FsDisk::mount(&["--size", "64M"]);
    let out = same_as_tmpfs(&disk, "privs", PRIVILEGE_SCRIPT);
    // The oracle itself: tmpfs drops both bits for a writer outside the group.
    assert!(out.contains("other.6666.write 666\n"), "{out}");
    assert!(out.contains("member.6666.write 2666\n"), "{out}");
    // Zero range (ramd has it, tmpfs not): as a punch does.
    let d = disk.join("zero");
    fs::create_dir(&d).unwrap();
    let with_zero = sh_env(PRIVILEGE_SCRIPT, &[s(&d)], ("ZERO", "zero")).ok();
    for line in out.lines().filter(|l| l.contains(".punch ")) {
        let zero = line.replace(".punch ", ".zero ");
        assert!(with_zero.contains(&format!("{zero}\n")), "{with_zero}");
    }
}
