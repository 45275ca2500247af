//! The POSIX corners of the filesystem disk that tmpfs gets right, each
//! checked on ramd and, where the kernel's tmpfs is the oracle, on a kernel
//! tmpfs in the same test: privilege bits dropped on writes by another user,
//! no stale data after asynchronous direct writes, rewinddir, file handles
//! that outlive the kernel's inode cache, unsupported ioctls logged once,
//! timestamps from the kernel's clock, immutable and append-only refusing
//! first, setgid dropped by an ACL change, and xfs_io's chattr/lsattr.
//! The clients are coreutils, util-linux (setpriv, fallocate), acl,
//! e2fsprogs, xfsprogs, fio and small C programs compiled here with gcc.

mod common;
mod fs_common;

use common::*;
use fs_common::*;
use std::fs;
use std::path::Path;
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
    same_as_tmpfs_mounted(disk, "size=64M", what, script)
}

/// [`same_as_tmpfs`] on a tmpfs mounted with `options`.
fn same_as_tmpfs_mounted(disk: &FsDisk, options: &str, what: &str, script: &str) -> String {
    let tmpfs = KernelTmpfs::mount(options);
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
/// root:root, then as `nobody` in group root, then as root without
/// CAP_FSETID; and chowns as root.
/// `stat` right after each must show what tmpfs shows.
const PRIVILEGE_SCRIPT: &str = r#"
set -e
cd "$1"
other='setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all'
member='setpriv --reuid=65534 --regid=0 --clear-groups --inh-caps=-all'
capless='setpriv --bounding-set=-fsetid --inh-caps=-fsetid'
for who in other member capless; do
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
    // The kernel path: writes never reach ramd; the kernel sends an empty
    // SETATTR from the writer when the bits must go.
    let kernel = FsDisk::mount(&["--size", "64M", "--data-path", "kernel"]);
    same_as_tmpfs(&kernel, "privs, kernel path", PRIVILEGE_SCRIPT);
    kernel.stop();
    let disk = FsDisk::mount(&["--size", "64M", "--data-path", "store"]);
    let out = same_as_tmpfs(&disk, "privs", PRIVILEGE_SCRIPT);
    // The oracle itself: tmpfs drops both bits for a writer outside the group.
    assert!(out.contains("other.6666.write 666\n"), "{out}");
    assert!(out.contains("member.6666.write 2666\n"), "{out}");
    assert!(out.contains("capless.4666.write 666\n"), "{out}");
    // Zero range (ramd has it, tmpfs not): as a punch does.
    let d = disk.join("zero");
    fs::create_dir(&d).unwrap();
    let with_zero = sh_env(PRIVILEGE_SCRIPT, &[s(&d)], ("ZERO", "zero")).ok();
    for line in out.lines().filter(|l| l.contains(".punch ")) {
        let zero = line.replace(".punch ", ".zero ");
        assert!(with_zero.contains(&format!("{zero}\n")), "{with_zero}");
    }
}

const AIO_STALE_C: &str = r#"/* Buffered reads mixed with asynchronous direct writes: a buffered read
 * while the writes are in flight, and after io_getevents has reaped them
 * another, which must return what was written. Usage: aiostale FILE ROUNDS. Prints "ok" or the first stale
 * offset and exits 1. */
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define BS 4096
#define N 64

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: aiostale FILE ROUNDS\n"); return 2; }
    int rounds = atoi(argv[2]);
    int bfd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (bfd < 0) { perror("open buffered"); return 2; }
    static char buf[N * BS];
    memset(buf, 'a', sizeof buf);
    if (pwrite(bfd, buf, sizeof buf, 0) != sizeof buf) { perror("pwrite"); return 2; }
    int dfd = open(argv[1], O_RDWR | O_DIRECT);
    if (dfd < 0) { perror("open O_DIRECT"); return 2; }
    aio_context_t ctx = 0;
    if (syscall(SYS_io_setup, N, &ctx) < 0) { perror("io_setup"); return 2; }
    char *wbuf;
    if (posix_memalign((void **)&wbuf, BS, N * BS)) return 2;
    for (int r = 0; r < rounds; r++) {
        /* Fill the page cache with the current contents. */
        if (pread(bfd, buf, sizeof buf, 0) != sizeof buf) { perror("pread"); return 2; }
        char c = 'b' + r % 24;
        memset(wbuf, c, N * BS);
        struct iocb cbs[N], *cbp[N];
        memset(cbs, 0, sizeof cbs);
        for (int i = 0; i < N; i++) {
            cbs[i].aio_fildes = dfd;
            cbs[i].aio_lio_opcode = IOCB_CMD_PWRITE;
            cbs[i].aio_buf = (unsigned long)(wbuf + i * BS);
            cbs[i].aio_nbytes = BS;
            cbs[i].aio_offset = (long long)i * BS;
            cbp[i] = &cbs[i];
        }
        if (syscall(SYS_io_submit, ctx, N, cbp) != N) { perror("io_submit"); return 2; }
        /* A buffered read while the writes are in flight may cache what
         * was there before them. */
        if (pread(bfd, buf, sizeof buf, 0) != sizeof buf) { perror("pread"); return 2; }
        struct io_event ev[N];
        int got = 0;
        while (got < N) {
            long n = syscall(SYS_io_getevents, ctx, 1, N - got, ev, NULL);
            if (n < 0) { perror("io_getevents"); return 2; }
            for (long i = 0; i < n; i++)
                if (ev[i].res != BS) { fprintf(stderr, "aio write: %lld\n", (long long)ev[i].res); return 2; }
            got += n;
        }
        if (pread(bfd, buf, sizeof buf, 0) != sizeof buf) { perror("pread"); return 2; }
        for (size_t i = 0; i < sizeof buf; i++)
            if (buf[i] != c) {
                printf("stale: round %d offset %zu has '%c', wrote '%c'\n", r, i, buf[i], c);
                return 1;
            }
    }
    printf("ok\n");
    return 0;
}
"#;

#[test]
fn buffered_reads_never_see_stale_data_after_async_direct_writes() {
    let prog = c_program("aiostale", AIO_STALE_C);
    let check = |dir: &Path| {
        let out = run(
            Command::new(&prog.path).arg(dir.join("f")).arg("40"),
            LONG_TIMEOUT,
        );
        assert_eq!(out.stdout, "ok\n", "{dir:?}: {}{}", out.stdout, out.stderr);
    };
    let tmpfs = KernelTmpfs::mount("size=64M");
    check(tmpfs.path());
    // One worker too: dropping the cache must not wait on the worker that
    // would answer the read holding the page.
    for threads in ["8", "1"] {
        let disk = FsDisk::mount(&["--size", "64M", "--threads", threads]);
        check(disk.path());
    }
}

/// opendir, read all, create a name, rewinddir, read all again: the new
/// name must be there (POSIX). Prints the count of each pass and whether
/// the new name was seen.
const REWINDDIR_C: &str = r#"
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int pass(DIR *d, const char *want, int *seen) {
    struct dirent *e;
    int n = 0;
    *seen = 0;
    while ((e = readdir(d)) != NULL) {
        n++;
        if (want && strcmp(e->d_name, want) == 0) *seen = 1;
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc != 2 || chdir(argv[1]) != 0) { perror("chdir"); return 2; }
    close(open("before", O_CREAT | O_WRONLY, 0644));
    DIR *d = opendir(".");
    if (!d) { perror("opendir"); return 2; }
    int seen;
    int first = pass(d, "after", &seen);
    close(open("after", O_CREAT | O_WRONLY, 0644));
    rewinddir(d);
    int second = pass(d, "after", &seen);
    printf("first %d second %d after %s\n", first, second, seen ? "seen" : "missing");
    closedir(d);
    return 0;
}
"#;

#[test]
fn rewinddir_shows_names_added_since_opendir() {
    let prog = c_program("rewind", REWINDDIR_C);
    let disk = FsDisk::mount(&["--size", "64M"]);
    let script = format!("{} \"$1\"", prog.path.display());
    let out = same_as_tmpfs(&disk, "rewind", &script);
    assert_eq!(out, "first 3 second 4 after seen\n");
}

/// File handles: name_to_handle_at on a file, a directory and a file then
/// removed; the kernel's caches dropped (drop_caches 2, with nothing held
/// open but the mount's root); then open_by_handle_at must read the file,
/// list the directory and answer ESTALE for the removed file.
const HANDLES_C: &str = r#"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static struct file_handle *handle(const char *path) {
    struct file_handle *h = malloc(sizeof *h + MAX_HANDLE_SZ);
    h->handle_bytes = MAX_HANDLE_SZ;
    int mount_id;
    if (name_to_handle_at(AT_FDCWD, path, h, &mount_id, 0) != 0) {
        fprintf(stderr, "name_to_handle_at %s: %s\n", path, strerror(errno));
        exit(2);
    }
    return h;
}

int main(int argc, char **argv) {
    if (argc != 2 || chdir(argv[1]) != 0) { perror("chdir"); return 2; }
    int fd = open("file", O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0 || write(fd, "handled\n", 8) != 8) { perror("file"); return 2; }
    close(fd);
    if (mkdir("dir", 0755) != 0) { perror("mkdir"); return 2; }
    close(open("dir/inside", O_CREAT | O_WRONLY, 0644));
    close(open("gone", O_CREAT | O_WRONLY, 0644));
    struct file_handle *hf = handle("file"), *hd = handle("dir"), *hg = handle("gone");
    if (unlink("gone") != 0) { perror("unlink"); return 2; }
    int mnt = open(".", O_RDONLY | O_DIRECTORY);
    if (chdir("/") != 0) return 2;
    sync();
    int dc = open("/proc/sys/vm/drop_caches", O_WRONLY);
    if (dc < 0 || write(dc, "2\n", 2) != 2) { perror("drop_caches"); return 2; }
    close(dc);
    char buf[64] = {0};
    fd = open_by_handle_at(mnt, hf, O_RDONLY);
    if (fd < 0) { printf("file: %s\n", strerror(errno)); return 1; }
    if (read(fd, buf, sizeof buf - 1) < 0) { perror("read"); return 2; }
    printf("file: %s", buf);
    close(fd);
    fd = open_by_handle_at(mnt, hd, O_RDONLY | O_DIRECTORY);
    if (fd < 0) { printf("dir: %s\n", strerror(errno)); return 1; }
    DIR *d = fdopendir(fd);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, "inside") == 0) printf("dir: inside\n");
    closedir(d);
    fd = open_by_handle_at(mnt, hg, O_RDONLY);
    printf("gone: %s\n", fd < 0 ? strerror(errno) : "opened");
    return 0;
}
"#;

#[test]
fn file_handles_outlive_the_kernels_inode_cache() {
    let prog = c_program("handles", HANDLES_C);
    let disk = FsDisk::mount(&["--size", "64M"]);
    let script = format!("{} \"$1\"", prog.path.display());
    let out = same_as_tmpfs(&disk, "handles", &script);
    assert_eq!(out, "file: handled\ndir: inside\ngone: Stale file handle\n");
}

/// chattr's flags tmpfs keeps, set and enforced: append-only (appends
/// only, no truncate, remove or rename), immutable (no change at all),
/// no dump, no atime (a read leaves atime alone), and one tmpfs refuses.
const CHATTR_SCRIPT: &str = r#"
cd "$1"
try() { if "$@" 2>/dev/null; then echo "ok: $*"; else echo "refused: $*"; fi; }
flags() { lsattr -d "$1" | cut -d' ' -f1; }
echo one > a; echo data > i; echo n > n; echo t > t; mkdir d
chattr +a a; chattr +i i; chattr +d n; chattr +A t
for f in a i n t; do echo "$f $(flags $f)"; done
try sh -c 'echo two >> a'
try sh -c 'echo over > a'
try truncate -s 0 a
try mv a a2
try rm -f a
try ln a a3
try chmod 600 a
cat a
try sh -c 'echo more >> i'
try touch i
try chmod 600 i
try rm -f i
try ln i i2
try setfattr -n user.x -v 1 i
try chattr +C n
touch -a -d 2001-01-01 t
cat t >/dev/null
stat -c %X t
chattr +i d
try touch d/new
chattr -i d
try touch d/new
chattr -a a; chattr -i i
try rm -f a i
ls
"#;

#[test]
fn chattr_flags_are_kept_and_enforced_as_on_tmpfs() {
    for t in ["chattr", "lsattr", "setfattr"] {
        require_tool(t);
    }
    for args in DATA_PATHS {
        let disk = FsDisk::mount(args);
        let out = same_as_tmpfs(&disk, "chattr", CHATTR_SCRIPT);
        assert!(out.contains("refused: rm -f a\n"), "{args:?}: {out}");
        assert!(out.contains("ok: sh -c echo two >> a\n"), "{args:?}: {out}");
        assert!(out.contains("\n978307200\n"), "noatime: {args:?}: {out}");
        disk.stop();
    }
}

/// An ioctl nobody supports, called many times: ENOTTY each time, as on
/// tmpfs, and one line in the daemon's log.
const IOCTL_C: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int fd = open(argv[1], O_CREAT | O_RDWR, 0644);
    if (fd < 0) { perror("open"); return 2; }
    int v = 0, enotty = 0;
    for (int i = 0; i < 200; i++)
        if (ioctl(fd, _IOR('r', 0x42, int), &v) < 0 && errno == ENOTTY) enotty++;
    printf("ENOTTY %d\n", enotty);
    return 0;
}
"#;

#[test]
fn an_unsupported_ioctl_is_logged_once() {
    let prog = c_program("ioctl", IOCTL_C);
    let disk = FsDisk::mount(&["--size", "64M"]);
    let script = format!("{} \"$1\"/f", prog.path.display());
    assert_eq!(same_as_tmpfs(&disk, "ioctl", &script), "ENOTTY 200\n");
    let log = disk.stderr();
    let n = log.matches("unsupported ioctl 0x80047242").count();
    assert_eq!(n, 1, "logged {n} times:\n{log}");
}

/// POSIX ACLs: set, read back, enforced for another user, kept in step
/// with chmod, removed; a directory's default ACL inherited by files and
/// subdirectories in place of the umask.
const ACL_SCRIPT: &str = r#"
cd "$1"
umask 022
nobody='setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all'
try() { if "$@" 2>/dev/null >/dev/null; then echo "ok: $*"; else echo "refused: $*"; fi; }
echo hi > own; chmod 600 own
try $nobody cat own
setfacl -m u:65534:r own
try $nobody cat own
getfacl -c own
chmod 640 own
getfacl -c own
stat -c '%a' own
setfacl -m u:65534:- own
try $nobody cat own
setfacl -b own
getfacl -c own
mkdir d
setfacl -d -m u:65534:rwx,g::r-x,o::- d
touch d/f; mkdir d/sub
for p in d d/f d/sub; do echo "== $p $(stat -c %a $p)"; getfacl -c $p; done
"#;

#[test]
fn posix_acls_are_kept_enforced_and_inherited_as_on_tmpfs() {
    for t in ["setfacl", "getfacl", "setpriv"] {
        require_tool(t);
    }
    let disk = FsDisk::mount(&["--size", "64M"]);
    let out = same_as_tmpfs(&disk, "acl", ACL_SCRIPT);
    assert!(out.contains("refused: setpriv"), "{out}");
    assert!(
        out.contains("ok: setpriv"),
        "the ACL let nobody read: {out}"
    );
    assert!(out.contains("user:nobody:r--"), "{out}");
}

/// renameat2 with RENAME_WHITEOUT (what overlayfs does on its upper
/// layer): the old name becomes a whiteout, a character device 0:0.
const WHITEOUT_C: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2 || chdir(argv[1]) != 0) { perror("chdir"); return 2; }
    close(open("a", O_CREAT | O_WRONLY, 0644));
    if (syscall(SYS_renameat2, AT_FDCWD, "a", AT_FDCWD, "b", RENAME_WHITEOUT) != 0) {
        perror("renameat2 RENAME_WHITEOUT");
        return 1;
    }
    return 0;
}
"#;

#[test]
fn rename_whiteout_leaves_a_whiteout_as_on_tmpfs() {
    let prog = c_program("whiteout", WHITEOUT_C);
    let disk = FsDisk::mount(&["--size", "64M"]);
    let script = format!(
        "{} \"$1\" && cd \"$1\" && stat -c '%n %F %t:%T %a %u:%g %h' a b && ls",
        prog.path.display()
    );
    let out = same_as_tmpfs(&disk, "whiteout", &script);
    assert!(
        out.starts_with("a character special file 0:0 0 0:0 1\n"),
        "{out}"
    );
}

const IDMAP_C: &str = r#"/* idmap SRC DST: bind-mounts SRC on DST as an idmapped mount whose ids
 * are those of a user namespace mapping 0..65535 in it to 100000.. outside
 * (mount_setattr MOUNT_ATTR_IDMAP). */
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void put(const char *path, const char *text) {
    int fd = open(path, O_WRONLY);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) { perror(path); exit(2); }
    close(fd);
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: idmap SRC DST\n"); return 2; }
    int go[2];
    if (pipe(go)) return 2;
    pid_t child = fork();
    if (child == 0) {
        if (unshare(CLONE_NEWUSER)) { perror("unshare"); _exit(2); }
        char c;
        close(go[1]);
        if (read(go[0], &c, 1) < 0) _exit(2);
        _exit(0);
    }
    char path[64];
    /* Wait until the child is in its own namespace. */
    for (int i = 0; i < 1000; i++) {
        char a[64], b[64];
        snprintf(path, sizeof path, "/proc/%d/ns/user", child);
        ssize_t n = readlink(path, a, sizeof a - 1);
        ssize_t m = readlink("/proc/self/ns/user", b, sizeof b - 1);
        if (n > 0 && m > 0 && (n != m || memcmp(a, b, n) != 0)) break;
        usleep(1000);
    }
    snprintf(path, sizeof path, "/proc/%d/uid_map", child);
    put(path, "0 100000 65536\n");
    snprintf(path, sizeof path, "/proc/%d/setgroups", child);
    put(path, "deny\n");
    snprintf(path, sizeof path, "/proc/%d/gid_map", child);
    put(path, "0 100000 65536\n");
    snprintf(path, sizeof path, "/proc/%d/ns/user", child);
    int userns = open(path, O_RDONLY | O_CLOEXEC);
    if (userns < 0) { perror("userns"); return 2; }
    int tree = open_tree(AT_FDCWD, argv[1], OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (tree < 0) { perror("open_tree"); return 2; }
    struct mount_attr attr = { .attr_set = MOUNT_ATTR_IDMAP, .userns_fd = userns };
    int rc = 0;
    if (mount_setattr(tree, "", AT_EMPTY_PATH, &attr, sizeof attr) != 0) {
        perror("mount_setattr MOUNT_ATTR_IDMAP");
        rc = 1;
    } else if (move_mount(tree, "", AT_FDCWD, argv[2], MOVE_MOUNT_F_EMPTY_PATH) != 0) {
        perror("move_mount");
        rc = 2;
    }
    close(go[1]);
    waitpid(child, NULL, 0);
    return rc;
}
"#;

/// Through an idmapped mount of `root` (ids 0..65535 shown as 100000..):
/// a file made by host root, one made by mapped uid 100005, a chown to
/// mapped 100007; both views' owners.
fn idmapped_owners(prog: &Path, root: &Path) -> String {
    let view = tempfile::Builder::new()
        .prefix("ramd-idmap.")
        .tempdir()
        .unwrap();
    let out = run(Command::new(prog).arg(root).arg(view.path()), CMD_TIMEOUT);
    assert!(out.success(), "idmapped mount of {root:?}: {}", out.stderr);
    let script = r#"
set -e
touch "$1/byhost" "$1/chowned"
setpriv --reuid=100005 --regid=100005 --clear-groups touch "$2/bymapped"
chown 100007:100007 "$2/chowned"
for f in byhost bymapped chowned; do
  echo "$f $(stat -c %u:%g "$1/$f") $(stat -c %u:%g "$2/$f")"
done
"#;
    let r = sh_env(script, &[s(root), s(view.path())], ("ZERO", ""));
    assert!(umount_or_detach(view.path()), "umount {:?}", view.path());
    r.ok()
}

#[test]
fn idmapped_mounts_map_owners_as_on_tmpfs() {
    let prog = c_program("idmap", IDMAP_C);
    let tmpfs = KernelTmpfs::mount("size=64M");
    let want = idmapped_owners(&prog.path, tmpfs.path());
    assert_eq!(
        want,
        "byhost 0:0 100000:100000\nbymapped 5:5 100005:100005\nchowned 7:7 100007:100007\n"
    );
    let disk = FsDisk::mount(&["--size", "64M"]);
    assert_eq!(idmapped_owners(&prog.path, disk.path()), want);
}

const TMPFILE_C: &str = r#"/* tmpfile DIR: O_TMPFILE files: unnamed while open, given a name by
 * linkat (AT_EMPTY_PATH, and through /proc/self/fd), never with O_EXCL. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int made(int dir, const char *data, int excl) {
    int fd = openat(dir, ".", O_TMPFILE | O_RDWR | (excl ? O_EXCL : 0), 0640);
    if (fd < 0) { printf("O_TMPFILE: %s\n", strerror(errno)); return -1; }
    if (write(fd, data, strlen(data)) != (ssize_t)strlen(data)) { perror("write"); return -1; }
    struct stat st;
    fstat(fd, &st);
    printf("open: nlink %lu mode %o size %lld\n", (unsigned long)st.st_nlink,
           (unsigned)(st.st_mode & 07777), (long long)st.st_size);
    return fd;
}

static void show(int dir, const char *name) {
    char buf[64] = {0};
    int fd = openat(dir, name, O_RDONLY);
    if (fd < 0) { printf("%s: %s\n", name, strerror(errno)); return; }
    struct stat st;
    fstat(fd, &st);
    ssize_t n = read(fd, buf, sizeof buf - 1);
    printf("%s: nlink %lu mode %o data '%.*s'\n", name, (unsigned long)st.st_nlink,
           (unsigned)(st.st_mode & 07777), (int)(n < 0 ? 0 : n), buf);
    close(fd);
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    umask(022);
    int dir = open(argv[1], O_RDONLY | O_DIRECTORY);
    if (dir < 0) { perror("open dir"); return 2; }
    int fd = made(dir, "first", 0);
    if (fd < 0) return 1;
    if (linkat(fd, "", dir, "empty-path", AT_EMPTY_PATH) != 0)
        printf("linkat AT_EMPTY_PATH: %s\n", strerror(errno));
    show(dir, "empty-path");
    close(fd);

    fd = made(dir, "second", 0);
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    if (linkat(AT_FDCWD, proc, dir, "via-proc", AT_SYMLINK_FOLLOW) != 0)
        printf("linkat /proc/self/fd: %s\n", strerror(errno));
    show(dir, "via-proc");
    close(fd);

    fd = made(dir, "third", 1);
    if (linkat(fd, "", dir, "excl", AT_EMPTY_PATH) != 0)
        printf("linkat O_EXCL: %s\n", strerror(errno));
    close(fd);

    /* Closed without a link: gone. */
    fd = made(dir, "fourth", 0);
    close(fd);
    return 0;
}
"#;

#[test]
fn o_tmpfile_files_are_unnamed_until_linked_as_on_tmpfs() {
    let prog = c_program("tmpfile", TMPFILE_C);
    let disk = FsDisk::mount(&["--size", "64M"]);
    let script = format!("{} \"$1\" && ls \"$1\"", prog.path.display());
    let out = same_as_tmpfs(&disk, "tmpfile", &script);
    assert_eq!(
        out,
        "open: nlink 0 mode 640 size 5\n\
         empty-path: nlink 1 mode 640 data 'first'\n\
         open: nlink 0 mode 640 size 6\n\
         via-proc: nlink 1 mode 640 data 'second'\n\
         open: nlink 0 mode 640 size 5\n\
         linkat O_EXCL: No such file or directory\n\
         open: nlink 0 mode 640 size 6\n\
         empty-path\nvia-proc\n"
    );
    // What is left are the two linked files' bytes: the unlinked ones'
    // data went when they were closed (RELEASE comes asynchronously).
    wait_until(CMD_TIMEOUT, "unlinked O_TMPFILE data freed", || {
        disk.status()["file_bytes"] == 11
    });
}

/// Birth time through statx (`stat %W`): known, set at creation, and left
/// alone by later changes.
const BTIME_SCRIPT: &str = r#"
cd "$1"
before=$(date +%s)
echo x > f; mkdir d; ln -s f l
after=$(date +%s)
for n in f d l; do
  b=$(stat -c %W $n)
  if [ "$b" -ge "$before" ] && [ "$b" -le "$after" ]; then echo "$n: born now"; else echo "$n: born $b ($before..$after)"; fi
done
b=$(stat -c %W f)
touch -d 2001-01-01 f; echo more >> f; chmod 600 f
[ "$(stat -c %W f)" = "$b" ] && echo "f: birth kept"
[ "$(stat -c %Y f)" -ge "$b" ] && echo "f: mtime moved"
"#;

#[test]
fn statx_reports_birth_time_as_on_tmpfs() {
    require_tool("stat");
    let disk = FsDisk::mount(&["--size", "64M"]);
    let out = same_as_tmpfs(&disk, "btime", BTIME_SCRIPT);
    assert_eq!(
        out,
        "f: born now\nd: born now\nl: born now\nf: birth kept\nf: mtime moved\n"
    );
}

/// The disks every cache-dependent check runs on: the store path with
/// its write-back cache (io_uring where the kernel offers it) and with
/// writes sent as they happen, and the kernel path (the default where
/// passthrough can be had).
const CACHE_MODES: [&[&str]; 2] = [
    &["--size", "64M", "--data-path", "store"],
    &[
        "--size",
        "64M",
        "--no-writeback-cache",
        "--data-path",
        "store",
    ],
];

/// The kernel data path: files' data in a private kernel tmpfs, served by
/// FUSE passthrough (no write-back cache).
const KERNEL_PATH: &[&str] = &["--size", "64M", "--data-path", "kernel"];

/// Both data paths: the store (with its write-back cache) and the kernel's
/// (the default where passthrough can be had).
const DATA_PATHS: [&[&str]; 2] = [CACHE_MODES[0], KERNEL_PATH];

/// Every way file data moves: both cache modes of the store, and the
/// kernel data path.
const ALL_MODES: [&[&str]; 3] = [CACHE_MODES[0], CACHE_MODES[1], KERNEL_PATH];

/// `echo aaa > f` as the shell does it, then the order of its times: birth
/// and atime no later than mtime (so relatime moves atime on the first
/// read). Then, once the kernel's coarse clock (the one `current_time()`
/// reads) has passed every time of the file, polled with a deadline, one
/// read: it must move atime.
const CLOCKS_C: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static long long ns(long long s, long long n) { return s * 1000000000LL + n; }
static long long ts(struct statx_timestamp t) { return ns(t.tv_sec, t.tv_nsec); }

static struct statx get(const char *p) {
    struct statx s;
    if (statx(AT_FDCWD, p, 0, STATX_BASIC_STATS | STATX_BTIME, &s) != 0) { perror("statx"); exit(2); }
    if (!(s.stx_mask & STATX_BTIME)) { printf("no birth time\n"); exit(1); }
    return s;
}

int main(int argc, char **argv) {
    if (argc != 2 || chdir(argv[1]) != 0) { perror("chdir"); return 2; }
    int fd = open("f", O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0 || write(fd, "aaa\n", 4) != 4) { perror("write"); return 2; }
    close(fd);
    struct statx s = get("f");
    long long a = ts(s.stx_atime), m = ts(s.stx_mtime), c = ts(s.stx_ctime), b = ts(s.stx_btime);
    printf("birth <= mtime: %s\n", b <= m ? "yes" : "no");
    printf("birth <= atime: %s\n", b <= a ? "yes" : "no");
    printf("atime <= mtime: %s\n", a <= m ? "yes" : "no");
    printf("mtime <= ctime: %s\n", m <= c ? "yes" : "no");
    long long last = a > m ? a : m;
    last = last > c ? last : c;
    last = last > b ? last : b;
    struct timespec t, start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        clock_gettime(CLOCK_REALTIME_COARSE, &t);
        if (ns(t.tv_sec, t.tv_nsec) > last) break;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > 10) { printf("the coarse clock stayed behind the file's times\n"); return 1; }
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    char buf[8];
    fd = open("f", O_RDONLY);
    if (fd < 0 || read(fd, buf, sizeof buf) != 4) { perror("read"); return 2; }
    close(fd);
    struct statx r = get("f");
    printf("first read moved atime: %s\n", ts(r.stx_atime) > a ? "yes" : "no");
    return 0;
}
"#;

#[test]
fn timestamps_come_from_the_kernels_clock_as_on_tmpfs() {
    let prog = c_program("clocks", CLOCKS_C);
    let script = format!("{} \"$1\"", prog.path.display());
    for args in ALL_MODES {
        let disk = FsDisk::mount(args);
        let out = same_as_tmpfs(&disk, "clocks", &script);
        assert_eq!(
            out,
            "birth <= mtime: yes\nbirth <= atime: yes\natime <= mtime: yes\nmtime <= ctime: yes\n\
             first read moved atime: yes\n",
            "{args:?}"
        );
    }
}

/// Removing from an immutable or append-only directory, or a directory
/// that is itself such, is refused (EPERM) before emptiness or kind is
/// looked at (the VFS's may_delete; `unlink DIR` is not compared: the
/// kernel answers EISDIR for a FUSE inode, which never carries the flags,
/// before ramd is asked); an append-only file keeps its times against any
/// but both set to now (utime(NULL), touch).
const FIXED_SCRIPT: &str = r#"
cd "$1"
try() { if "$@" 2>err; then echo "ok: $*"; else echo "refused: $* ($(sed 's/.*: //' err))"; fi; }
mkdir -p imm/sub/x imm/empty app/sub/x app/empty self/full/x self/empty
chattr +i imm; chattr +a app; chattr +i self/full self/empty
for d in imm/sub imm/empty app/sub app/empty self/full self/empty; do
  try rmdir $d
done
chattr -i imm self/full self/empty; chattr -a app
echo a > af; chattr +a af
try touch -d 2001-01-01 af
try touch -a -d 2001-01-01 af
try touch -m -d 2001-01-01 af
try touch af
try touch -a af
try touch -m af
try python3 -c 'import os, sys; os.utime(sys.argv[1], (0, 0))' af
try python3 -c 'import os, sys; os.utime(sys.argv[1], None)' af
chattr -a af
rm -f err
"#;

#[test]
fn immutable_and_append_only_refuse_as_on_tmpfs() {
    for t in ["chattr", "touch", "unlink", "rmdir"] {
        require_tool(t);
    }
    for args in ALL_MODES {
        let disk = FsDisk::mount(args);
        let out = same_as_tmpfs(&disk, "fixed", FIXED_SCRIPT);
        assert!(
            out.contains("refused: rmdir imm/sub (Operation not permitted)\n"),
            "{args:?}: {out}"
        );
        assert!(
            out.contains("refused: touch -m -d 2001-01-01 af (Operation not permitted)\n"),
            "{args:?}: {out}"
        );
        assert!(out.contains("ok: touch af\n"), "{args:?}: {out}");
    }
}

/// An access ACL set on a setgid file by its owner: outside the file's
/// group and without CAP_FSETID the setgid bit goes (posix_acl_update_mode),
/// in the group or as root it stays; a default ACL on a setgid directory
/// leaves the mode alone.
const SGID_ACL_SCRIPT: &str = r#"
cd "$1"
other='setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all'
member='setpriv --reuid=65534 --regid=0 --clear-groups --inh-caps=-all'
for who in other member root; do
  eval "as=\${$who:-}"
  echo s > $who; chown 65534:0 $who; chmod 2770 $who
  $as setfacl -m u:1:r $who
  echo "$who access $(stat -c %a $who)"
  # An ACL that says no more than the mode (none is kept) counts too.
  echo s > $who.plain; chown 65534:0 $who.plain; chmod 2750 $who.plain
  $as setfacl -m u::rwx $who.plain
  echo "$who.plain access $(stat -c %a $who.plain)"
  mkdir $who.d; chown 65534:0 $who.d; chmod 2770 $who.d
  $as setfacl -d -m u:1:r $who.d
  echo "$who.d default $(stat -c %a $who.d)"
done
"#;

#[test]
fn an_acl_set_outside_the_group_drops_setgid_as_on_tmpfs() {
    for t in ["setfacl", "setpriv", "stat"] {
        require_tool(t);
    }
    for args in DATA_PATHS {
        let disk = FsDisk::mount(args);
        let out = same_as_tmpfs(&disk, "sgidacl", SGID_ACL_SCRIPT);
        assert!(out.contains("other access 770\n"), "{args:?}: {out}");
        assert!(out.contains("member access 2770\n"), "{args:?}: {out}");
        assert!(out.contains("root access 2770\n"), "{args:?}: {out}");
    }
}

/// xfs_io's chattr and lsattr (FS_IOC_FSSETXATTR / FSGETXATTR): the flags
/// tmpfs keeps set, shown (also by e2fsprogs' lsattr) and enforced; the
/// others, a project id and extent sizes refused as tmpfs refuses them.
/// Not compared: `xfs_io -c statx`'s attributes. tmpfs shows these flags
/// there (attributes_mask 0x203070); ramd answers them in FUSE_STATX
/// (fuse_tests.rs), but Linux 6.18 drops them: `fuse_do_statx`
/// (fs/fuse/dir.c) fills the kstat from the reply's basic fields and btime
/// only, and its cached path (`fuse_update_get_attr`) has nowhere to keep
/// them, so statx shows the VFS's own mask (0x203000) and no flag.
const XFS_IO_SCRIPT: &str = r#"
cd "$1"
x() { xfs_io -r -c "$1" "$2" 2>&1 | sed 's/^xfs_io: //'; }
echo x > f; mkdir d
for c in "chattr +i" "lsattr" "chattr -i" "chattr +a" "chattr +d" "chattr +A" "lsattr" \
         "chattr -a -d -A" "lsattr" "chattr +s" "chattr +S" "chattr +t" "chattr +e" "chattr +x" \
         "chattr +P" "chattr +E" "chattr +f" "chattr +n" "chattr +C" "lsattr" "chproj 5"; do
  echo "== $c"; x "$c" f
done
x "chattr +t" d; x "chattr +P" d; x "chattr +i" d; x "lsattr" d
if touch d/new 2>/dev/null; then echo "created in +i dir"; else echo "refused in +i dir"; fi
x "chattr -i" d
x "chattr +i" f
if sh -c 'echo y >> f' 2>/dev/null; then echo "appended to +i"; else echo "refused append to +i"; fi
lsattr f | cut -d' ' -f1
x "chattr -i" f
"#;

#[test]
fn xfs_io_chattr_and_lsattr_work_as_on_tmpfs() {
    for t in ["xfs_io", "lsattr", "touch"] {
        require_tool(t);
    }
    for args in DATA_PATHS {
        let disk = FsDisk::mount(args);
        let out = same_as_tmpfs(&disk, "xfsio", XFS_IO_SCRIPT);
        assert!(
            out.contains("== lsattr\n---a-Ad---------- f \n"),
            "{args:?}: {out}"
        );
        assert!(out.contains("refused append to +i\n"), "{args:?}: {out}");
        assert!(
            out.contains("== chattr +s\ncannot set flags on f: Operation not supported\n"),
            "{args:?}: {out}"
        );
    }
}

/// SEEK_DATA and SEEK_HOLE right after writes the kernel still holds in
/// its page cache: a 1-byte pwrite at offset 2, one at 1 MiB, and pages
/// written through a shared mapping still mapped (xfs_io's seek prints
/// "EOF" for ENXIO). The last line reads the mapped bytes back.
const SEEK_SCRIPT: &str = r#"
cd "$1"
xfs_io -f -c "pwrite -q 2 1" -c "seek -d 0" -c "seek -h 0" -c "pwrite -q 1048576 4096" \
  -c "seek -h 0" -c "seek -d 4096" -c "seek -h 1048576" -c "seek -d 1052672" w | grep -v Whence
xfs_io -f -c "truncate 2M" -c "mmap -w 0 2M" -c "mwrite -S 0x61 1048576 4096" \
  -c "seek -d 0" -c "seek -h 1048576" -c "munmap" m | grep -v Whence
od -An -c -j 1048576 -N 2 m
"#;

/// Many files written and seeked at once (more than a ring queue's
/// entries): each seek waits for a write-back whose WRITEs need a free
/// worker or ring entry. Then every file's data and holes.
const SEEK_MANY_SCRIPT: &str = r#"
cd "$1"
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do
  ( for j in 1 2 3 4 5 6 7 8; do
      xfs_io -f -c "pwrite -q $((j * 8192)) 4096" -c "seek -d 0" -c "mmap -w 0 64k" \
        -c "mwrite -S 0x62 $((j * 4096)) 100" -c "seek -h 0" -c "munmap" f$i >/dev/null || echo "f$i: xfs_io failed"
    done ) &
done
wait
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo "f$i"; xfs_io -r -c "seek -a -r 0" f$i; done
"#;

#[test]
fn seek_data_sees_writes_not_yet_written_back_as_on_tmpfs() {
    require_tool("xfs_io");
    // Both cache modes, one worker on /dev/fuse (the seek's answer must
    // not wait on the only worker), and the kernel data path.
    let modes: [&[&str]; 4] = [
        CACHE_MODES[0],
        CACHE_MODES[1],
        &[
            "--size",
            "64M",
            "--threads",
            "1",
            "--fuse-transport",
            "dev",
            "--data-path",
            "store",
        ],
        KERNEL_PATH,
    ];
    for args in modes {
        let disk = FsDisk::mount(args);
        let out = same_as_tmpfs(&disk, "seek", SEEK_SCRIPT);
        assert!(out.starts_with("DATA\t0\nHOLE\t3\n"), "{args:?}: {out}");
        assert!(
            out.contains("DATA\t1048576\nHOLE\t1052672\n"),
            "{args:?}: {out}"
        );
        let out = same_as_tmpfs(&disk, "seekmany", SEEK_MANY_SCRIPT);
        assert!(!out.contains("failed"), "{args:?}: {out}");
    }
}

/// chattr (FS_IOC_SETFLAGS, then FS_IOC_FSSETXATTR) on a regular file and
/// a directory: each change must move ctime. Before each, the kernel's
/// coarse clock is let pass the inode's ctime (polled, with a deadline).
const CHATTR_CTIME_C: &str = r#"
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static long long ctime_of(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0) { perror("fstat"); exit(2); }
    return st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec;
}

static void after(long long t) {
    struct timespec now, start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        clock_gettime(CLOCK_REALTIME_COARSE, &now);
        if (now.tv_sec * 1000000000LL + now.tv_nsec > t) return;
        struct timespec m;
        clock_gettime(CLOCK_MONOTONIC, &m);
        if (m.tv_sec - start.tv_sec > 10) { printf("the coarse clock stayed behind\n"); exit(1); }
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
}

static void check(const char *what, int fd) {
    long long t = ctime_of(fd);
    after(t);
    int flags = FS_NODUMP_FL;
    if (ioctl(fd, FS_IOC_SETFLAGS, &flags) != 0) { perror("FS_IOC_SETFLAGS"); exit(2); }
    printf("%s: setflags moved ctime: %s\n", what, ctime_of(fd) > t ? "yes" : "no");
    t = ctime_of(fd);
    after(t);
    struct fsxattr fa;
    if (ioctl(fd, FS_IOC_FSGETXATTR, &fa) != 0) { perror("FS_IOC_FSGETXATTR"); exit(2); }
    fa.fsx_xflags &= ~FS_XFLAG_NODUMP;
    if (ioctl(fd, FS_IOC_FSSETXATTR, &fa) != 0) { perror("FS_IOC_FSSETXATTR"); exit(2); }
    printf("%s: fssetxattr moved ctime: %s\n", what, ctime_of(fd) > t ? "yes" : "no");
}

int main(int argc, char **argv) {
    if (argc != 3 || chdir(argv[1]) != 0) { perror("chdir"); return 2; }
    if (argv[2][0] == 'f') {
        int fd = open("f", O_CREAT | O_RDWR, 0644);
        if (fd < 0 || write(fd, "x", 1) != 1) { perror("f"); return 2; }
        check("file", fd);
    } else {
        if (mkdir("d", 0755) != 0) { perror("mkdir"); return 2; }
        int fd = open("d", O_RDONLY | O_DIRECTORY);
        if (fd < 0) { perror("d"); return 2; }
        check("dir", fd);
    }
    return 0;
}
"#;

#[test]
fn chattr_moves_ctime_as_on_tmpfs() {
    let prog = c_program("chattrctime", CHATTR_CTIME_C);
    let (file, dir) = (
        format!("{} \"$1\" file", prog.path.display()),
        format!("{} \"$1\" dir", prog.path.display()),
    );
    // The write-back cache (the default): directories only. For a regular
    // file the kernel keeps ctime itself and never takes ramd's
    // (fuse_change_attributes_i keeps the inode's own ctime while
    // fuse_get_cache_mask has STATX_CTIME), and Linux 6.18's
    // fuse_fileattr_set (fs/fuse/ioctl.c) sends FUSE_IOCTL without moving
    // that ctime as its setxattr, link, rename and unlink paths do
    // (fuse_update_ctime): nothing a server answers can move it.
    let disk = FsDisk::mount(CACHE_MODES[0]);
    let out = same_as_tmpfs(&disk, "chattrctime", &dir);
    assert_eq!(
        out,
        "dir: setflags moved ctime: yes\ndir: fssetxattr moved ctime: yes\n"
    );
    for args in [CACHE_MODES[1], KERNEL_PATH] {
        let disk = FsDisk::mount(args);
        for script in [&file, &dir] {
            let out = same_as_tmpfs(&disk, "chattrctime", script);
            assert!(!out.contains(": no"), "{args:?}: {out}");
            fs::remove_dir_all(disk.join("chattrctime")).unwrap();
        }
    }
}

/// A directory listed while names come and go (python's os.scandir, which
/// reads with getdents64 as ls and find do): 3000 names, several READDIRPLUS
/// replies; after the first 100 entries, 500 names go (some listed, some
/// not) and 300 new come; after 1000 more, a further 300 come. Every name
/// that was there throughout must be listed exactly once and no name twice,
/// as POSIX asks; which of the names that came or went show up may differ,
/// so only those rules are compared with tmpfs. Then `ls | wc -l`, `find`
/// and `rm -r` of the directory.
const LISTING_PY: &str = r#"
import os, sys
d = os.path.join(sys.argv[1], "many")
os.mkdir(d)
names = ["f%05d" % i for i in range(3000)]
for n in names:
    open(os.path.join(d, n), "w").close()
gone = set(names[::6])
came = set()
seen = []
it = os.scandir(d)
for i, e in enumerate(it):
    seen.append(e.name)
    if i == 100:
        for n in gone:
            os.unlink(os.path.join(d, n))
        for j in range(300):
            came.add("new%04d" % j)
            open(os.path.join(d, "new%04d" % j), "w").close()
    if i == 1100:
        for j in range(300, 600):
            came.add("new%04d" % j)
            open(os.path.join(d, "new%04d" % j), "w").close()
it.close()
kept = set(names) - gone
counts = {}
for n in seen:
    counts[n] = counts.get(n, 0) + 1
print("twice", sorted(n for n, c in counts.items() if c > 1))
print("kept missing", sorted(kept - set(seen)))
print("unknown", sorted(set(seen) - set(names) - came))
now = sorted(os.listdir(d))
print("listed after", len(now), now == sorted(kept | came))
"#;

#[test]
fn a_listing_returns_every_name_that_stays_exactly_once_as_on_tmpfs() {
    let disk = FsDisk::mount(&["--size", "64M"]);
    let script = format!(
        "{} -c '{}' \"$1\" && ls \"$1/many\" | wc -l && find \"$1/many\" | wc -l && rm -r \"$1/many\" && ls -A \"$1\" | wc -l",
        python().display(),
        LISTING_PY.replace('\'', "'\\''")
    );
    let out = same_as_tmpfs(&disk, "listing", &script);
    assert_eq!(
        out,
        "twice []\nkept missing []\nunknown []\nlisted after 3100 True\n3100\n3101\n0\n"
    );
}

/// A directory's atime as listings move it, under relatime and under
/// strictatime: listed twice unchanged; listed after its atime was set
/// back; listed after chmod, after setfattr and after chattr moved its
/// ctime (each a moment after the listing before: the clock must have
/// moved on, and a coarse tick is at most 10 ms). The kernel keeps
/// listings itself once OPENDIR is answered ENOSYS; ramd must drop a
/// kept listing whenever the next one should move atime.
const DIR_ATIME_SCRIPT: &str = r#"
set -e
cd "$1"
mkdir d
touch d/f
at() { stat -c %x d; }
step() {
  before=$(at)
  sleep 0.02
  "$@"
  ls d >/dev/null
  if [ "$(at)" = "$before" ]; then echo "$1 kept"; else echo "$1 moved"; fi
}
ls d >/dev/null
step true
step touch -a -d '2001-01-01 00:00:00' d
step chmod 700 d
step setfattr -n user.x -v 1 d
step chattr +d d
"#;

#[test]
fn listings_move_a_directorys_atime_as_on_tmpfs() {
    require_tool("setfattr");
    require_tool("chattr");
    let disk = FsDisk::mount(&["--size", "64M"]);
    let out = same_as_tmpfs(&disk, "diratime", DIR_ATIME_SCRIPT);
    assert_eq!(
        out, "true kept\ntouch moved\nchmod moved\nsetfattr moved\nchattr moved\n",
        "relatime"
    );
    disk.stop();
    let disk = FsDisk::mount(&["--size", "64M", "--strictatime"]);
    let out = same_as_tmpfs_mounted(&disk, "size=64M,strictatime", "diratime", DIR_ATIME_SCRIPT);
    assert_eq!(
        out, "true moved\ntouch moved\nchmod moved\nsetfattr moved\nchattr moved\n",
        "strictatime"
    );
}
