//! Images in object storage (`--image s3://bucket/prefix`) against a real
//! S3 server: SeaweedFS's `weed mini` on loopback (scripts/install-test-tools
//! builds it), one per test, with its own data directory, ports and
//! credentials. ramd is driven as a user drives it: serve, write with
//! qemu-io or through a mount, stop, serve again, read back.

mod common;
mod fs_common;
mod lossy_proxy;
mod restore_common;

use common::*;
use fs_common::FsDisk;
use lossy_proxy::{Lose, LossyProxy};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt};
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tempfile::TempDir;

const ACCESS_KEY: &str = "ramdtestkey";
const SECRET_KEY: &str = "ramdtestsecret0123456789";
const BUCKET: &str = "ramdtest";
/// How long SeaweedFS may take to answer S3 requests after it starts.
const WEED_DEADLINE: Duration = Duration::from_secs(90);

/// `weed`: on PATH, or where `go install` puts it.
fn weed_bin() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let gopath = Command::new("go")
        .args(["env", "GOPATH"])
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("bin"));
    let home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join("go/bin"));
    std::env::split_paths(&path)
        .chain(gopath)
        .chain(home)
        .map(|d| d.join("weed"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "SeaweedFS's `weed` is not installed (not on PATH nor in $(go env GOPATH)/bin): \
                 run scripts/install-test-tools"
            )
        })
}

/// A SeaweedFS server (`weed mini`: master, volume, filer and S3 in one
/// process) on loopback, killed on drop.
struct Weed {
    child: Option<Child>,
    s3_port: u16,
    filer_port: u16,
    /// The master's HTTP and gRPC ports, as `weed shell -master` takes
    /// them (`PORT.GRPC`).
    master: String,
    dir: TempDir,
}

impl Weed {
    fn start() -> Weed {
        let bin = weed_bin();
        let mut dir = scratch();
        let config = dir.path().join("s3.json");
        fs::write(
            &config,
            format!(
                r#"{{"identities":[{{"name":"ramd","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
            ),
        )
        .unwrap();
        // Ports are picked free and then given to weed: another test's
        // server may take one first. A server that exits while starting is
        // started again on other ports; one that neither answers nor exits
        // by the deadline fails the test with its log.
        let mut tries = Vec::new();
        for attempt in 0..3 {
            let mut w = Weed::spawn(&bin, dir, &config, attempt);
            let client = w.client();
            let deadline = std::time::Instant::now() + WEED_DEADLINE;
            loop {
                if block_on(client.list_with_delimiter(None)).is_ok() {
                    return w;
                }
                if let Some(status) = w.child.as_mut().unwrap().try_wait().unwrap() {
                    tries.push(format!(
                        "attempt {attempt}: weed exited ({status}):\n{}",
                        w.log_tail()
                    ));
                    w.child = None;
                    break;
                }
                if std::time::Instant::now() >= deadline {
                    panic!(
                        "SeaweedFS did not answer S3 requests within {WEED_DEADLINE:?}:\n{}",
                        w.log_tail()
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            dir = std::mem::replace(&mut w.dir, scratch());
        }
        panic!("SeaweedFS did not start:\n{}", tries.join("\n"));
    }

    /// `weed mini` on fresh ports, its data in `dir/data-ATTEMPT`.
    fn spawn(bin: &Path, dir: TempDir, config: &Path, attempt: usize) -> Weed {
        let data = dir.path().join(format!("data-{attempt}"));
        fs::create_dir(&data).unwrap();
        let mut ports: Vec<u16> = Vec::new();
        while ports.len() < 10 {
            let p = free_tcp_port();
            if !ports.contains(&p) {
                ports.push(p);
            }
        }
        let flag = |name: &str, i: usize| format!("-{name}={}", ports[i]);
        let log = fs::File::create(dir.path().join("weed.log")).unwrap();
        let child = Command::new(bin)
            .arg("mini")
            .arg(format!("-dir={}", data.display()))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1"])
            .args([
                flag("master.port", 0),
                flag("master.port.grpc", 1),
                flag("volume.port", 2),
                flag("volume.port.grpc", 3),
                flag("filer.port", 4),
                flag("filer.port.grpc", 5),
                flag("s3.port", 6),
                flag("s3.port.grpc", 7),
                flag("admin.port", 8),
                flag("admin.port.grpc", 9),
            ])
            .args([
                "-admin.port.legacy=0",
                "-admin.ui=false",
                "-webdav=false",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
            ])
            .arg(format!("-s3.config={}", config.display()))
            .arg(format!("-bucket={BUCKET}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn weed");
        Weed {
            child: Some(child),
            s3_port: ports[6],
            filer_port: ports[4],
            master: format!("{}.{}", ports[0], ports[1]),
            dir,
        }
    }

    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.dir.path().join("weed.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.s3_port)
    }

    /// The environment ramd takes its endpoint and credentials from.
    fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY".into(), SECRET_KEY.into()),
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_ENDPOINT_URL".into(), self.endpoint()),
            ("AWS_ALLOW_HTTP".into(), "true".into()),
        ]
    }

    /// The test's own client, to look at what ramd wrote.
    fn client(&self) -> AmazonS3 {
        AmazonS3Builder::new()
            .with_bucket_name(BUCKET)
            .with_access_key_id(ACCESS_KEY)
            .with_secret_access_key(SECRET_KEY)
            .with_region("us-east-1")
            .with_endpoint(self.endpoint())
            .with_allow_http(true)
            .build()
            .expect("S3 client")
    }

    /// The objects directly under `prefix`: name and size.
    fn objects(&self, prefix: &str) -> Vec<(String, u64)> {
        let l = block_on(self.client().list_with_delimiter(Some(&Key::from(prefix))))
            .unwrap_or_else(|e| panic!("listing {prefix}: {e}"));
        l.objects
            .iter()
            .map(|o| (o.location.filename().unwrap().to_string(), o.size))
            .collect()
    }

    fn read(&self, key: &str) -> String {
        let got = block_on(async {
            let r = self.client().get(&Key::from(key)).await?;
            r.bytes().await
        })
        .unwrap_or_else(|e| panic!("reading {key}: {e}"));
        String::from_utf8_lossy(&got).into_owned()
    }

    /// The multipart uploads the server holds unfinished in the bucket:
    /// SeaweedFS keeps each as a directory under `/buckets/BUCKET/.uploads`
    /// of its filer, which lists them over HTTP (S3 clients cannot: ramd's
    /// client library has no ListMultipartUploads).
    fn incomplete_uploads(&self) -> Vec<String> {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(("127.0.0.1", self.filer_port))
            .unwrap_or_else(|e| panic!("the filer on port {}: {e}", self.filer_port));
        write!(
            c,
            "GET /buckets/{BUCKET}/.uploads/?limit=1000 HTTP/1.0\r\nAccept: application/json\r\n\r\n"
        )
        .unwrap();
        let mut reply = String::new();
        c.read_to_string(&mut reply).unwrap();
        let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
        if head.starts_with("HTTP/1.1 404") || head.starts_with("HTTP/1.0 404") {
            return Vec::new(); // no upload was ever started
        }
        assert!(head.contains(" 200 "), "filer listing: {reply}");
        let v: Value = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("filer listing is not JSON ({e}): {reply}"));
        v["Entries"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|e| e["FullPath"].as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Runs `commands` (one a line) in `weed shell`, the server's own
    /// administration tool; returns what it printed.
    fn shell(&self, commands: &str) -> String {
        let script = self.dir.path().join("shell-commands");
        fs::write(&script, commands).unwrap();
        let weed = weed_bin();
        let line = format!(
            "{} shell -master=127.0.0.1:{} < {}",
            weed.display(),
            self.master,
            script.display()
        );
        let out = run(&mut cmd("sh", ["-c", &line]), CMD_TIMEOUT);
        assert!(out.success(), "{line}: {}\n{}", out.stdout, out.stderr);
        // It says some things on stdout and others on stderr.
        format!("{}{}", out.stdout, out.stderr)
    }

    /// Whether the server takes a small object under `key` now.
    fn takes_writes(&self, key: &str) -> bool {
        block_on(self.client().put(&Key::from(key), b"probe".to_vec().into())).is_ok()
    }

    fn signal(&self, sig: i32) {
        let pid = self.child.as_ref().unwrap().id() as i32;
        // SAFETY: a signal to our own child.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
    }
}

impl Drop for Weed {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("weed log (last lines):\n{}", self.log_tail());
        }
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn pairs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

fn url(prefix: &str) -> String {
    format!("s3://{BUCKET}/{prefix}")
}

/// `ramd serve ARGS` with `env`, in a fresh run dir (kept in `run`).
fn serve(run: &Path, args: &[&str], env: &[(String, String)]) -> Ramd {
    try_serve(run, args, env).unwrap_or_else(|(status, stderr)| {
        panic!("ramd serve {args:?} did not become ready ({status}); stderr:\n{stderr}")
    })
}

/// A block disk of `size` saving to `local`, replicated to `img`.
fn serve_replicating(
    run: &Path,
    size: &str,
    local: &Path,
    img: &str,
    env: &[(String, String)],
) -> Ramd {
    let args = [
        "--size",
        size,
        "--image",
        local.to_str().unwrap(),
        "--replicate",
        img,
    ];
    serve(run, &args, env)
}

fn try_serve(
    run: &Path,
    args: &[&str],
    env: &[(String, String)],
) -> Result<Ramd, (String, String)> {
    fs::create_dir_all(run).unwrap();
    Ramd::try_start_in_with(run, args, &pairs(env), None)
}

/// `ramd serve --image IMG` once the lease of a killed writer of `img`
/// has expired (the environment's RAMD_LEASE_SECS should be short).
fn serve_once_expired(run: &Path, img: &str, env: &[(String, String)]) -> Ramd {
    let mut next = None;
    wait_until(
        Duration::from_secs(60),
        "a new writer to take over the killed one's expired lease",
        || match try_serve(run, &["--image", img], env) {
            Ok(r) => {
                next = Some(r);
                true
            }
            Err((_, err)) => {
                assert!(err.contains("is in use"), "not a lease refusal:\n{err}");
                false
            }
        },
    );
    next.unwrap()
}

/// `ramd ARGS` (offline commands, snapshot) with `env`.
fn ramd(run: &Path, args: &[&str], env: &[(String, String)]) -> Output {
    let mut c = Command::new(ramd_bin());
    c.arg("--run-dir").arg(run).args(args).envs(pairs(env));
    run_cmd(&mut c)
}

fn run_cmd(c: &mut Command) -> Output {
    run(c, CMD_TIMEOUT)
}

fn snapshot(run: &Path, name: &str, env: &[(String, String)]) -> Value {
    let out = ramd(run, &["snapshot", name, "--json"], env).ok();
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("snapshot JSON ({e}): {out}"))
}

/// The disk behind `uri`, copied out whole.
fn export(uri: &str, to: &Path) -> Vec<u8> {
    require_tool("nbdcopy");
    run_ok(&mut cmd("nbdcopy", [uri, to.to_str().unwrap()]));
    fs::read(to).unwrap()
}

fn assert_filled(disk: &[u8], at: u64, len: u64, byte: u8, what: &str) {
    let r = &disk[at as usize..(at + len) as usize];
    if let Some(i) = r.iter().position(|&b| b != byte) {
        panic!(
            "{what}: byte {} is {:#x}, not {byte:#x}",
            at as usize + i,
            r[i]
        );
    }
}

/// A block disk saved to S3 and loaded back: random data, a pattern, an
/// incremental snapshot that uploads only its pages, the lease released at
/// the stop, `ramd image info|verify|export|import` on URLs.
#[test]
fn block_disk_round_trip_with_incremental_snapshot() {
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let run = tmp.path().join("run");
    let data = tmp.path().join("data");
    random_file(&data, 8 * MIB);
    let img = url("disk");

    let d = serve(&run, &["--size", "64M", "--image", &img], &env);
    qemu_io(
        d.uri(),
        &[
            format!("write -s {} 0 8M", data.display()),
            "write -P 0x5a 32M 1M".into(),
        ],
    );
    let full = snapshot(&run, d.name(), &env);
    assert_eq!(full["full"], true, "{full}");
    assert_eq!(full["path"], img.as_str(), "{full}");
    qemu_io(d.uri(), &["write -P 0x77 16M 64k".into()]);
    let inc = snapshot(&run, d.name(), &env);
    assert_eq!(inc["full"], false, "{inc}");
    assert_eq!(field(&inc, "pages"), 16, "{inc}");

    // Each save is one object, of the size the save reports; the
    // incremental one holds its 16 pages, not the disk.
    let objects = w.objects("disk");
    let seg = |seq: u64| {
        let name = format!("seg-{seq:08}-");
        objects
            .iter()
            .find(|(n, _)| n.starts_with(&name))
            .unwrap_or_else(|| panic!("no segment object {name}* in {objects:?}"))
            .1
    };
    assert_eq!(seg(1), field(&full, "bytes"), "{objects:?}");
    assert_eq!(seg(2), field(&inc, "bytes"), "{objects:?}");
    assert!(
        seg(1) > 8 * MIB,
        "the full save is smaller than its data: {objects:?}"
    );
    assert!(
        seg(2) < 16 * (PAGE + 64) + 4096,
        "the incremental save uploaded more than its 16 pages: {objects:?}"
    );
    assert!(objects.iter().any(|(n, _)| n == "MANIFEST"), "{objects:?}");
    let lease = w.read("disk/LEASE");
    assert!(
        lease.contains(&format!("pid {}", d.pid())),
        "LEASE does not name the writer:\n{lease}"
    );
    drop(d);

    let lease = w.read("disk/LEASE");
    assert!(
        lease.contains("expires 0"),
        "the lease was not released at the stop:\n{lease}"
    );
    let verify = ramd(&run, &["image", "verify", &img], &env).ok();
    assert!(verify.contains(&format!("{img}: ok")), "{verify}");
    let info = ramd(&run, &["image", "info", &img], &env).ok();
    assert!(info.contains("block") && info.contains("64M"), "{info}");

    let d = serve(&run, &["--image", &img], &env);
    assert!(d.stderr().contains("loaded image"), "{}", d.stderr());
    let disk = export(d.uri(), &tmp.path().join("out"));
    assert_eq!(disk.len() as u64, 64 * MIB);
    assert!(
        disk[..(8 * MIB) as usize] == fs::read(&data).unwrap()[..],
        "the random 8M differ after the load"
    );
    assert_filled(&disk, 32 * MIB, MIB, 0x5a, "the pattern at 32M");
    assert_filled(
        &disk,
        16 * MIB,
        64 * KIB,
        0x77,
        "the incremental save's 64k",
    );
    assert_filled(&disk, 8 * MIB, 8 * MIB, 0, "what was never written");
    drop(d);

    // Offline: export the image from the URL to a raw file, import it to
    // another prefix; both are the disk.
    let raw = tmp.path().join("exported.raw");
    ramd(
        &run,
        &["image", "export", &img, "--to", raw.to_str().unwrap()],
        &env,
    )
    .ok();
    assert!(
        fs::read(&raw).unwrap() == disk,
        "the exported image differs"
    );
    let copy = url("imported");
    ramd(
        &run,
        &["image", "import", raw.to_str().unwrap(), &copy],
        &env,
    )
    .ok();
    let verify = ramd(&run, &["image", "verify", &copy], &env).ok();
    assert!(verify.contains(&format!("{copy}: ok")), "{verify}");
}

/// A filesystem disk (`--mount`) saved to S3: files written, stop,
/// remount from the image alone, the same files.
#[test]
fn fs_disk_round_trip() {
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let img = url("fs");
    let big = tmp.path().join("big");
    random_file(&big, 3 * MIB);

    let d = FsDisk::mount_with_env(&["--size", "64M", "--image", &img], &pairs(&env));
    fs::create_dir(d.join("dir")).unwrap();
    fs::copy(&big, d.join("dir/big")).unwrap();
    fs::write(d.join("small.txt"), b"kept in object storage\n").unwrap();
    std::os::unix::fs::symlink("dir/big", d.join("link")).unwrap();
    d.stop();

    let d = FsDisk::mount_with_env(&["--image", &img], &pairs(&env));
    assert!(d.stderr().contains("loaded image"), "{}", d.stderr());
    assert_same_file(&big, &d.join("dir/big"));
    assert_eq!(
        fs::read(d.join("small.txt")).unwrap(),
        b"kept in object storage\n"
    );
    assert_eq!(fs::read_link(d.join("link")).unwrap(), Path::new("dir/big"));
    d.stop();
}

/// A bucket over its quota (SeaweedFS then refuses writes to it): a save
/// fails, naming the image and what may be wrong, never the credentials;
/// the disk keeps serving, status says why, and the image keeps its last
/// save. Once the quota is lifted the next save lands (a full one, as after
/// any failed save) and the disk loads from it.
#[test]
fn a_bucket_over_its_quota_fails_saves_and_the_disk_keeps_serving() {
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let run = tmp.path().join("run");
    let img = url("over");
    let data = tmp.path().join("data");
    random_file(&data, 4 * MIB);
    let mut d = serve(&run, &["--size", "16M", "--image", &img], &env);
    // Random data: a pattern would be saved as FILL records, taking no room.
    qemu_io(d.uri(), &[format!("write -s {} 0 4M", data.display())]);
    let first = snapshot(&run, d.name(), &env);
    assert_eq!(first["full"], true, "{first}");
    let manifest = w.read("over/MANIFEST");

    // 1 MiB of quota, 4 MiB stored: enforcing it makes the bucket
    // read-only, once the master's figures (from the volume servers'
    // heartbeats) count what was stored.
    w.shell(&format!(
        "s3.bucket.quota -name={BUCKET} -op=set -sizeMB=1\n"
    ));
    let mut said = String::new();
    wait_until(
        Duration::from_secs(60),
        "SeaweedFS to find the bucket over its quota and make it read-only",
        || {
            said = w.shell("s3.bucket.quota.enforce -apply\n");
            said.contains("read only")
        },
    );
    wait_until(
        Duration::from_secs(30),
        &format!("the server to refuse writes to a bucket over its quota ({said})"),
        || !w.takes_writes("probe/over-quota"),
    );
    qemu_io(d.uri(), &["write -P 0x22 8M 1M".into()]);
    let out = ramd(&run, &["snapshot", d.name()], &env).failed();
    assert!(
        out.stderr.contains(&img) && out.stderr.contains("quota"),
        "the failed save names neither the image nor what may be wrong:\n{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains(SECRET_KEY) && !out.stderr.contains(ACCESS_KEY),
        "credentials in an error:\n{}",
        out.stderr
    );
    d.assert_alive();
    let served = |d: &Ramd, what: &str| {
        let disk = export(d.uri(), &tmp.path().join("disk"));
        assert!(
            disk[..4 * MIB as usize] == fs::read(&data).unwrap()[..],
            "{what}"
        );
        assert_filled(&disk, 8 * MIB, MIB, 0x22, what);
    };
    served(&d, "served after the failed save");
    let disk = d.stats();
    assert!(
        disk["last_save_error"]
            .as_str()
            .is_some_and(|e| e.contains(&img) && e.contains("quota")),
        "status does not say why the save failed: {disk}"
    );
    assert_eq!(
        w.read("over/MANIFEST"),
        manifest,
        "a failed save changed the MANIFEST"
    );

    w.shell(&format!("s3.bucket.quota -name={BUCKET} -op=remove\n"));
    wait_until(
        Duration::from_secs(30),
        "the server to take writes again once the quota is removed",
        || w.takes_writes("probe/quota-lifted"),
    );
    let next = snapshot(&run, d.name(), &env);
    assert_eq!(next["full"], true, "the save after a failed one: {next}");
    d.stop();
    let d = serve(&run, &["--image", &img], &env);
    served(&d, "loaded from the save made once the quota was lifted");
}

/// A MANIFEST edited by hand (its checksum no longer matches, or its
/// checksum line removed): serving, `image verify` and `image ls` refuse,
/// naming the MANIFEST object and the byte offset at fault, and nothing
/// is written to the prefix.
#[test]
fn a_hand_edited_manifest_is_refused_naming_it() {
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let run = tmp.path().join("run");
    let img = url("edited");
    let mut d = serve(&run, &["--size", "16M", "--image", &img], &env);
    qemu_io(d.uri(), &["write -P 0x33 0 1M".into()]);
    d.stop();
    let manifest = w.read("edited/MANIFEST");
    let key = Key::from("edited/MANIFEST");
    let put = |text: String| block_on(w.client().put(&key, text.into_bytes().into())).unwrap();

    // A size changed by hand: the checksum line no longer matches.
    let size = manifest
        .lines()
        .find(|l| l.starts_with("size "))
        .unwrap_or_else(|| panic!("no size line in {manifest}"));
    put(manifest.replace(size, "size 33554432"));
    // The checksum line taken out too: no longer a MANIFEST at all.
    let unsummed: String = manifest
        .lines()
        .filter(|l| !l.starts_with("crc32c "))
        .map(|l| format!("{l}\n"))
        .collect();
    for (edited, says) in [
        (manifest.replace(size, "size 33554432"), "checksum"),
        (unsummed, "no checksum line"),
    ] {
        put(edited.clone());
        let objects = w.objects("edited");
        let (status, err) = try_serve(&run, &["--image", &img], &env)
            .map(|_| ())
            .expect_err("served an image whose MANIFEST was edited by hand");
        assert!(
            err.contains(&format!("{img}/MANIFEST"))
                && err.contains("offset")
                && err.contains(says),
            "({status}) the refusal does not name the MANIFEST, offset and fault:\n{err}"
        );
        for args in [["image", "verify", &img], ["image", "ls", &img]] {
            let out = ramd(&run, &args, &env).failed();
            assert!(
                out.stderr.contains(&format!("{img}/MANIFEST")) && out.stderr.contains(says),
                "{args:?}:\n{}",
                out.stderr
            );
        }
        assert_eq!(
            w.read("edited/MANIFEST"),
            edited,
            "the MANIFEST was rewritten"
        );
        let lease_free = |o: &Vec<(String, u64)>| {
            o.iter()
                .filter(|(n, _)| n != "LEASE")
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(
            lease_free(&w.objects("edited")),
            lease_free(&objects),
            "objects were written or removed"
        );
    }
}

/// A second `ramd serve` of one prefix is refused while the first holds
/// its lease, naming the holder and when the lease ends; after the first's
/// clean stop it starts and loads what the first saved.
#[test]
fn second_writer_is_refused_naming_the_holder() {
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let img = url("shared");
    let first = serve(
        &tmp.path().join("a"),
        &["--size", "16M", "--image", &img],
        &env,
    );
    qemu_io(first.uri(), &["write -P 0x42 0 1M".into()]);

    let (status, err) = match try_serve(&tmp.path().join("b"), &["--image", &img], &env) {
        Ok(_) => panic!("a second writer of {img} started while the first holds the lease"),
        Err(e) => e,
    };
    let host = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    for want in [
        img.as_str(),
        "lease is held by",
        host.trim(),
        &format!("pid {}", first.pid()),
        "until",
    ] {
        assert!(
            err.contains(want),
            "refusal ({status}) lacks {want:?}:\n{err}"
        );
    }
    drop(first);

    let second = serve(&tmp.path().join("b"), &["--image", &img], &env);
    qemu_io(second.uri(), &["read -P 0x42 0 1M".into()]);
}

/// Four writers started at the same moment on one new prefix: exactly one
/// gets the lease and serves; every other is refused, naming the holder's
/// pid; the winner's saves commit and load.
#[test]
fn writers_racing_for_one_prefix_one_wins_cleanly() {
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let img = url("raced");
    let barrier = std::sync::Barrier::new(4);
    let results: Vec<Result<Ramd, (String, String)>> = std::thread::scope(|s| {
        let tries: Vec<_> = (0..4)
            .map(|i| {
                let (run, env, img, barrier) =
                    (tmp.path().join(format!("w{i}")), &env, &img, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    try_serve(&run, &["--size", "16M", "--image", img], env)
                })
            })
            .collect();
        tries.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let mut won = Vec::new();
    let mut lost = Vec::new();
    for r in results {
        match r {
            Ok(d) => won.push(d),
            Err(e) => lost.push(e),
        }
    }
    assert_eq!(
        won.len(),
        1,
        "writers that started: {}; refusals: {lost:?}",
        won.len()
    );
    let winner = won.pop().unwrap();
    for (status, err) in lost {
        assert!(
            err.contains(&img)
                && err.contains("lease is held by")
                && err.contains(&format!("pid {}", winner.pid())),
            "a loser's refusal ({status}) does not name the winner:\n{err}"
        );
    }
    let run = winner.run_dir().to_path_buf();
    qemu_io(winner.uri(), &["write -P 0x5c 0 1M".into()]);
    let saved = snapshot(&run, winner.name(), &env);
    assert_eq!(saved["full"], true, "{saved}");
    drop(winner);
    let again = serve(&tmp.path().join("again"), &["--image", &img], &env);
    qemu_io(again.uri(), &["read -P 0x5c 0 1M".into()]);
}

/// kill -9 of the writer: its lease is left to expire (a short one here),
/// then a new writer takes it over and loads the last committed save, not
/// what was written after it.
#[test]
fn killed_writer_lease_expires_and_last_commit_loads() {
    let w = Weed::start();
    let mut env = w.env();
    env.push(("RAMD_LEASE_SECS".into(), "3".into()));
    let tmp = scratch();
    let img = url("killed");
    let run = tmp.path().join("run");
    let mut d = serve(&run, &["--size", "16M", "--image", &img], &env);
    qemu_io(d.uri(), &["write -P 0x11 0 1M".into()]);
    snapshot(&run, d.name(), &env);
    qemu_io(
        d.uri(),
        &["write -P 0x22 0 1M".into(), "write -P 0x33 4M 1M".into()],
    );
    d.stop_with(libc::SIGKILL);

    let next = serve_once_expired(&tmp.path().join("next"), &img, &env);
    assert!(
        next.stderr().contains("took the lease"),
        "{}",
        next.stderr()
    );
    qemu_io(
        next.uri(),
        &["read -P 0x11 0 1M".into(), "read -P 0 4M 1M".into()],
    );
}

/// Wrong credentials, a missing bucket and an endpoint that is down: the
/// disk does not start, and the error names the URL and says what to do,
/// never the credentials.
#[test]
fn clear_errors_for_credentials_bucket_and_endpoint() {
    let w = Weed::start();
    let tmp = scratch();
    let run = tmp.path().join("run");
    let wrong_secret = "not-the-secret-0123456789";

    let mut bad = w.env();
    bad[1].1 = wrong_secret.into();
    let img = url("creds");
    let (_, err) = try_serve(&run, &["--size", "16M", "--image", &img], &bad)
        .err()
        .expect("wrong credentials: ramd started");
    for want in [img.as_str(), "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        assert!(
            err.contains(want),
            "wrong-credentials error lacks {want:?}:\n{err}"
        );
    }
    assert!(
        !err.contains(wrong_secret) && !err.contains(ACCESS_KEY),
        "the error shows a credential:\n{err}"
    );
    let out = ramd(&run, &["image", "info", &img], &bad).failed();
    assert!(
        out.stderr.contains(&img) && out.stderr.contains("AWS_ACCESS_KEY_ID"),
        "{}",
        out.stderr
    );

    let env = w.env();
    let missing = "s3://no-such-bucket-here/disk";
    let (_, err) = try_serve(&run, &["--size", "16M", "--image", missing], &env)
        .err()
        .expect("missing bucket: ramd started");
    assert!(
        err.contains(missing) && err.contains("bucket no-such-bucket-here does not exist"),
        "missing-bucket error:\n{err}"
    );

    let mut down = w.env();
    let closed = free_tcp_port();
    down[3].1 = format!("http://127.0.0.1:{closed}");
    down.push(("RAMD_S3_TIMEOUT".into(), "2".into()));
    let (_, err) = try_serve(&run, &["--size", "16M", "--image", &img], &down)
        .err()
        .expect("endpoint down: ramd started");
    assert!(
        err.contains(&img) && err.contains("did not answer") && err.contains(&closed.to_string()),
        "endpoint-down error:\n{err}"
    );
}

/// The server stopped (SIGSTOP) when a save starts: the save fails with an
/// error naming the image, the disk keeps serving, the previous save is
/// still the image; once the server is back the stop's save succeeds and
/// everything loads.
#[test]
fn server_stopped_during_a_save() {
    let w = Weed::start();
    let mut env = w.env();
    // Requests give up within seconds rather than the default half minute.
    env.push(("RAMD_S3_TIMEOUT".into(), "2".into()));
    let tmp = scratch();
    let run = tmp.path().join("run");
    let img = url("stalled");
    let mut d = serve(&run, &["--size", "16M", "--image", &img], &env);
    qemu_io(d.uri(), &["write -P 0x61 0 1M".into()]);
    let first = snapshot(&run, d.name(), &env);
    qemu_io(d.uri(), &["write -P 0x62 2M 1M".into()]);

    w.signal(libc::SIGSTOP);
    let out = ramd(&run, &["snapshot", d.name()], &env).failed();
    w.signal(libc::SIGCONT);
    assert!(
        out.stderr.contains(&img),
        "the failed save does not name the image:\n{}",
        out.stderr
    );
    d.assert_alive();
    qemu_io(
        d.uri(),
        &["read -P 0x61 0 1M".into(), "read -P 0x62 2M 1M".into()],
    );
    let disk = d.stats();
    assert!(
        disk["last_save_error"]
            .as_str()
            .is_some_and(|e| e.contains(&img)),
        "status does not say why the save failed: {disk}"
    );

    let info = ramd(&run, &["image", "info", &img, "--json"], &env).ok();
    let info: Value = serde_json::from_str(&info).unwrap();
    let chain = info["chain"]
        .as_array()
        .expect("chain in image info --json");
    assert_eq!(chain.len(), 1, "{info}");
    assert_eq!(chain[0]["seq"], first["seq"], "{info}");
    let verify = ramd(&run, &["image", "verify", &img], &env).ok();
    assert!(verify.contains("ok"), "{verify}");

    d.stop();
    // The failed save's segment, if its upload completed, was debris: the
    // stop's save removed it.
    let info = ramd(&run, &["image", "info", &img, "--json"], &env).ok();
    let info: Value = serde_json::from_str(&info).unwrap();
    let named: Vec<String> = info["chain"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| format!("seg-{:08}-{:016x}", field(s, "seq"), field(s, "time_ns")))
        .collect();
    for (name, _) in w.objects("stalled") {
        assert!(
            !name.starts_with("seg-") || named.contains(&name),
            "{name} is not in the MANIFEST's chain {named:?}"
        );
    }
    let d = serve(&run, &["--image", &img], &env);
    qemu_io(
        d.uri(),
        &["read -P 0x61 0 1M".into(), "read -P 0x62 2M 1M".into()],
    );
}

/// A writer that cannot renew its lease (stopped with SIGSTOP past the
/// lease's term) loses it to a new writer: once running again it refuses
/// to save, status says why, its data can be saved to a directory instead,
/// and the new writer's saves stay the image.
#[test]
fn writer_that_lost_its_lease_stops_saving() {
    let w = Weed::start();
    let mut env = w.env();
    env.push(("RAMD_LEASE_SECS".into(), "3".into()));
    let tmp = scratch();
    let img = url("lost");
    let run_a = tmp.path().join("a");
    let run_b = tmp.path().join("b");
    let mut a = serve(&run_a, &["--size", "16M", "--image", &img], &env);
    qemu_io(a.uri(), &["write -P 0x11 0 1M".into()]);
    snapshot(&run_a, a.name(), &env);

    // SAFETY: signals to our own child.
    unsafe { libc::kill(a.pid() as i32, libc::SIGSTOP) };
    let mut b = None;
    wait_until(
        Duration::from_secs(60),
        "a new writer to take over the stopped one's expired lease",
        || match try_serve(&run_b, &["--image", &img], &env) {
            Ok(r) => {
                b = Some(r);
                true
            }
            Err((_, err)) => {
                assert!(err.contains("is in use"), "not a lease refusal:\n{err}");
                false
            }
        },
    );
    let b = b.unwrap();
    qemu_io(
        b.uri(),
        &["read -P 0x11 0 1M".into(), "write -P 0x44 0 1M".into()],
    );
    snapshot(&run_b, b.name(), &env);
    // SAFETY: as above.
    unsafe { libc::kill(a.pid() as i32, libc::SIGCONT) };

    qemu_io(a.uri(), &["write -P 0x22 0 1M".into()]);
    // Status says so as soon as its renewal finds out, before any save.
    wait_until(
        Duration::from_secs(60),
        "the old writer's status to say its lease is lost",
        || {
            let s = a.stats();
            s["last_save_error"]
                .as_str()
                .is_some_and(|e| e.contains("lost the lease"))
        },
    );
    let s = a.stats();
    let err = s["last_save_error"].as_str().unwrap();
    assert!(
        err.contains(&format!("pid {}", b.pid())),
        "status does not name the new holder: {err}"
    );
    assert_eq!(field(&s, "save_failures"), 0, "{s}");
    let out = ramd(&run_a, &["snapshot", a.name()], &env).failed();
    assert!(out.stderr.contains("lost the lease"), "{}", out.stderr);
    // The way out the error names: a full save to a directory, which is
    // its image from then on; the stop saves there.
    let rescue = tmp.path().join("rescue");
    ramd(
        &run_a,
        &["snapshot", a.name(), "--to", rescue.to_str().unwrap()],
        &env,
    )
    .ok();
    a.stop();
    let r = serve(
        &tmp.path().join("r"),
        &["--image", rescue.to_str().unwrap()],
        &[],
    );
    qemu_io(r.uri(), &["read -P 0x22 0 1M".into()]);

    // The image is b's: nothing of a's refused saves.
    drop(b);
    let c = serve(&tmp.path().join("c"), &["--image", &img], &env);
    qemu_io(c.uri(), &["read -P 0x44 0 1M".into()]);
}

/// `image = "s3://..."` in a config file is the same as the flag; status
/// names the URL.
#[test]
fn config_key_image_takes_a_url() {
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let run = tmp.path().join("run");
    let img = url("fromconfig");
    let config = tmp.path().join("ramd.toml");
    fs::write(
        &config,
        format!("[disk.cfg]\nsize = \"16M\"\nimage = \"{img}\"\n"),
    )
    .unwrap();
    let d = serve(
        &run,
        &["--config", config.to_str().unwrap(), "--disk", "cfg"],
        &env,
    );
    let status = status_json(&run);
    let disk = disk_entry(&status, "cfg").expect("disk cfg in status");
    assert_eq!(disk["image"], img.as_str(), "{disk}");
    qemu_io(d.uri(), &["write -P 0x5 0 64k".into()]);
    drop(d);
    assert!(
        w.objects("fromconfig").iter().any(|(n, _)| n == "MANIFEST"),
        "{:?}",
        w.objects("fromconfig")
    );
    let d = serve(&run, &["--image", &img], &env);
    qemu_io(d.uri(), &["read -P 0x5 0 64k".into()]);
}

/// ramd killed in the middle of a save (part way through the segment's
/// upload, or with the segment uploaded and the MANIFEST not yet put): the
/// next writer, once the dead one's lease expires, loads the previous save,
/// and the dead save's segment is debris, removed.
#[test]
fn crash_during_a_save_keeps_the_previous_save() {
    let w = Weed::start();
    let mut env = w.env();
    env.push(("RAMD_LEASE_SECS".into(), "3".into()));
    let tmp = scratch();
    let data = tmp.path().join("data");
    random_file(&data, 4 * MIB);
    for (i, crash) in ["pages:300", "manifest-written"].iter().enumerate() {
        let img = url(&format!("crash{i}"));
        let run = tmp.path().join(format!("run{i}"));
        let d = serve(&run, &["--size", "16M", "--image", &img], &env);
        qemu_io(d.uri(), &["write -P 0x31 0 1M".into()]);
        drop(d);

        let mut crashing = env.clone();
        crashing.push(("RAMD_TEST_CRASH".into(), crash.to_string()));
        let mut d = serve(&run, &["--image", &img], &crashing);
        qemu_io(d.uri(), &[format!("write -s {} 0 4M", data.display())]);
        ramd(&run, &["snapshot", d.name()], &env).failed();
        d.wait_exit(STOP_DEADLINE);

        let mut next = None;
        wait_until(
            Duration::from_secs(60),
            "a new writer to take over the crashed one's lease",
            || match try_serve(&run, &["--image", &img], &env) {
                Ok(r) => {
                    next = Some(r);
                    true
                }
                Err((_, err)) => {
                    assert!(
                        err.contains("is in use"),
                        "{crash}: not a lease refusal:\n{err}"
                    );
                    false
                }
            },
        );
        let next = next.unwrap();
        qemu_io(next.uri(), &["read -P 0x31 0 1M".into()]);
        let segs: Vec<String> = w
            .objects(&format!("crash{i}"))
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| n.starts_with("seg-"))
            .collect();
        assert!(
            segs.len() == 1 && segs[0].starts_with("seg-00000001-"),
            "{crash}: debris left after the next start: {segs:?}"
        );
    }
}

/// `ramd image ls|prune` on a URL as on a directory: ls lists the chain,
/// prune is refused while a writer holds the lease and afterwards removes
/// segment objects no MANIFEST names (only those); the disk's identity is
/// in the object-store image and comes back with it; import onto a prefix
/// that holds an image is refused.
#[test]
fn image_ls_prune_and_identity_on_a_url() {
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let run = tmp.path().join("run");
    let img = url("tools");
    let d = serve(&run, &["--size", "16M", "--image", &img], &env);
    qemu_io(d.uri(), &["write -P 0x21 0 64k".into()]);
    snapshot(&run, d.name(), &env);
    qemu_io(d.uri(), &["write -P 0x22 1M 4k".into()]);
    snapshot(&run, d.name(), &env);
    let id_of = |run: &Path, name: &str| {
        let status = status_json(run);
        disk_entry(&status, name).expect("the disk in status")["id"]
            .as_str()
            .expect("an id in status")
            .to_string()
    };
    let id = id_of(&run, d.name());

    let out = ramd(&run, &["image", "prune", &img], &env).failed();
    let pid = format!("pid {}", d.pid());
    for want in [img.as_str(), "lease is held by", pid.as_str()] {
        assert!(
            out.stderr.contains(want),
            "prune refusal lacks {want:?}:\n{}",
            out.stderr
        );
    }
    drop(d);

    let info: Value =
        serde_json::from_str(&ramd(&run, &["image", "info", &img, "--json"], &env).ok()).unwrap();
    assert_eq!(info["id"], id.as_str(), "{info}");
    let ls = ramd(&run, &["image", "ls", &img], &env).ok();
    let rows: Vec<&str> = ls.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{ls}");
    assert!(
        rows[0].contains("full") && rows[1].contains("incremental"),
        "{ls}"
    );
    // ls --json: info's chain, each save with the MANIFEST that names it.
    let mut chain: Value =
        serde_json::from_str(&ramd(&run, &["image", "ls", &img, "--json"], &env).ok()).unwrap();
    for s in chain.as_array_mut().unwrap() {
        let named = s.as_object_mut().unwrap().remove("manifest");
        assert_eq!(named, Some(Value::from("MANIFEST")), "{s}");
    }
    assert_eq!(chain, info["chain"], "ls --json is not info's chain");

    // A segment object of a save that never committed, and an object
    // that is not ramd's.
    let put = |key: &str, data: &[u8]| {
        block_on(w.client().put(
            &Key::from(key),
            object_store::PutPayload::from(data.to_vec()),
        ))
        .unwrap_or_else(|e| panic!("putting {key}: {e}"));
    };
    let debris = "seg-00000009-0000000000000001";
    put(&format!("tools/{debris}"), &[7u8; 3000]);
    put("tools/notes.txt", b"not ramd's");
    // The record of an upload the server no longer has (completed, or
    // aborted already): only the record goes.
    let record = "seg-00000010-0000000000000002.upload";
    put(&format!("tools/{record}"), b"no-such-upload-0123456789");
    let manifest = w.read("tools/MANIFEST");
    let out: Value =
        serde_json::from_str(&ramd(&run, &["image", "prune", &img, "--json"], &env).ok()).unwrap();
    let mut removed: Vec<&str> = out["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    removed.sort();
    assert_eq!(removed, [debris, record], "{out}");
    assert_eq!(field(&out, "bytes"), 3000 + 25, "{out}");
    let names: Vec<String> = w.objects("tools").into_iter().map(|(n, _)| n).collect();
    assert!(
        !names.iter().any(|n| n == debris || n == record),
        "{names:?}"
    );
    assert!(names.iter().any(|n| n == "notes.txt"), "{names:?}");
    assert_eq!(
        w.read("tools/MANIFEST"),
        manifest,
        "prune changed the MANIFEST"
    );
    let again = ramd(&run, &["image", "prune", &img], &env).ok();
    assert!(again.contains("no debris"), "{again}");

    // The lease prune took is given back: a writer starts at once, as
    // the same disk.
    let d = serve(&run, &["--image", &img], &env);
    assert_eq!(id_of(&run, d.name()), id, "the disk came back as another");
    qemu_io(
        d.uri(),
        &["read -P 0x21 0 64k".into(), "read -P 0x22 1M 4k".into()],
    );
    drop(d);

    let manifest = w.read("tools/MANIFEST");
    let raw = tmp.path().join("raw");
    fs::write(&raw, vec![1u8; 8192]).unwrap();
    let out = ramd(
        &run,
        &["image", "import", raw.to_str().unwrap(), &img],
        &env,
    )
    .failed();
    assert!(
        out.stderr.contains(&img) && out.stderr.contains("holds an image already"),
        "{}",
        out.stderr
    );
    assert_eq!(
        w.read("tools/MANIFEST"),
        manifest,
        "import changed the image"
    );

    // Nor does `snapshot --to` replace an image in object storage.
    let other_run = tmp.path().join("other");
    let other = serve(
        &other_run,
        &["--size", "16M", "--image", &url("other")],
        &env,
    );
    let out = ramd(&other_run, &["snapshot", other.name(), "--to", &img], &env).failed();
    assert!(
        out.stderr.contains(&img) && out.stderr.contains("is not empty"),
        "{}",
        out.stderr
    );
    assert_eq!(
        w.read("tools/MANIFEST"),
        manifest,
        "snapshot --to replaced the image"
    );
}

/// A writer killed part way through a segment's multipart upload leaves
/// the upload unfinished on the server, and its record
/// (`seg-N-T.upload`); the next writer, once it holds the lease, aborts
/// the upload (the server drops it and its parts) and removes the record.
#[test]
fn killed_upload_is_aborted_by_the_next_writer() {
    let w = Weed::start();
    let mut env = w.env();
    env.push(("RAMD_LEASE_SECS".into(), "3".into()));
    let tmp = scratch();
    let data = tmp.path().join("data");
    random_file(&data, 64 * MIB);
    let img = url("mpu");
    let run = tmp.path().join("run");
    let d = serve(&run, &["--size", "96M", "--image", &img], &env);
    qemu_io(d.uri(), &["write -P 0x31 0 1M".into()]);
    drop(d);
    assert!(
        w.incomplete_uploads().is_empty(),
        "{:?}",
        w.incomplete_uploads()
    );

    // A save of 64 MiB: once its upload's record is there, the server is
    // stopped (the upload cannot finish) and ramd killed, then the server
    // goes on.
    let mut d = serve(&run, &["--image", &img], &env);
    qemu_io(d.uri(), &[format!("write -s {} 0 64M", data.display())]);
    let mut snap = Command::new(ramd_bin());
    snap.arg("--run-dir")
        .arg(&run)
        .args(["snapshot", d.name()])
        .envs(pairs(&env));
    let _snap = Background::spawn(&mut snap);
    let is_record = |n: &String| n.starts_with("seg-00000002-") && n.ends_with(".upload");
    wait_until(
        Duration::from_secs(60),
        "the save's upload to be recorded",
        || w.objects("mpu").iter().any(|(n, _)| is_record(n)),
    );
    w.signal(libc::SIGSTOP);
    d.stop_with(libc::SIGKILL);
    w.signal(libc::SIGCONT);
    let records: Vec<String> = w
        .objects("mpu")
        .into_iter()
        .map(|(n, _)| n)
        .filter(is_record)
        .collect();
    assert_eq!(records.len(), 1, "{:?}", w.objects("mpu"));
    let left = w.incomplete_uploads();
    assert_eq!(
        left.len(),
        1,
        "the server holds no unfinished upload: {left:?}"
    );

    let mut next = None;
    wait_until(
        Duration::from_secs(60),
        "a new writer to take over the killed one's lease",
        || match try_serve(&run, &["--image", &img], &env) {
            Ok(r) => {
                next = Some(r);
                true
            }
            Err((_, err)) => {
                assert!(err.contains("is in use"), "not a lease refusal:\n{err}");
                false
            }
        },
    );
    let next = next.unwrap();
    assert!(
        next.stderr()
            .contains("aborted the incomplete multipart upload"),
        "{}",
        next.stderr()
    );
    wait_until(
        Duration::from_secs(30),
        "the server to drop the aborted upload",
        || w.incomplete_uploads().is_empty(),
    );
    let names: Vec<String> = w.objects("mpu").into_iter().map(|(n, _)| n).collect();
    assert!(
        !names
            .iter()
            .any(|n| n.ends_with(".upload") || n.starts_with("seg-00000002")),
        "{names:?}"
    );
    qemu_io(next.uri(), &["read -P 0x31 0 1M".into()]);
}

/// `ramd image ls IMAGE --json`: the chain of a directory or a URL.
fn chain_of(run: &Path, image: &str, env: &[(String, String)]) -> Value {
    serde_json::from_str(&ramd(run, &["image", "ls", image, "--json"], env).ok()).unwrap()
}

/// Waits until the replica's chain is the local image's.
fn wait_replicated(run: &Path, local: &Path, img: &str, env: &[(String, String)]) -> Value {
    let local = local.to_str().unwrap();
    let mut chain = Value::Null;
    wait_until(
        Duration::from_secs(90),
        "the replica's chain to be the local image's",
        || {
            chain = chain_of(run, local, env);
            let remote = ramd(run, &["image", "ls", img, "--json"], env);
            remote.success()
                && serde_json::from_str::<Value>(&remote.stdout).ok() == Some(chain.clone())
        },
    );
    chain
}

/// The segment objects of `prefix`.
fn segment_objects(w: &Weed, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = w
        .objects(prefix)
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n.starts_with("seg-"))
        .collect();
    names.sort();
    names
}

/// The object names a chain (`image ls --json`) has in object storage.
fn chain_objects(chain: &Value) -> Vec<String> {
    let mut names: Vec<String> = chain
        .as_array()
        .unwrap()
        .iter()
        .map(|s| format!("seg-{:08}-{:016x}", field(s, "seq"), field(s, "time_ns")))
        .collect();
    names.sort();
    names
}

/// `--image DIR --replicate URL`: a save committed locally reaches the
/// replica (the local MANIFEST's bytes, so the same disk identity);
/// `ramd down` says the replica is up to date; with the directory gone,
/// the disk is served from the URL alone with the same data and identity.
#[test]
fn replica_restores_a_lost_disk() {
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let run = tmp.path().join("run");
    let local = tmp.path().join("local");
    let data = tmp.path().join("data");
    random_file(&data, 8 * MIB);
    let img = url("replica");

    let mut d = serve_replicating(&run, "64M", &local, &img, &env);
    qemu_io(
        d.uri(),
        &[
            format!("write -s {} 0 8M", data.display()),
            "write -P 0x5a 32M 1M".into(),
        ],
    );
    let save = snapshot(&run, d.name(), &env);
    let chain = wait_replicated(&run, &local, &img, &env);
    assert_eq!(chain.as_array().unwrap().len(), 1, "{chain}");
    assert_eq!(
        fs::read_to_string(local.join("MANIFEST")).unwrap(),
        w.read("replica/MANIFEST"),
        "the replica's MANIFEST is not the local one"
    );
    let s = d.stats();
    let r = &s["replica"];
    assert_eq!(r["url"], img.as_str(), "{s}");
    assert_eq!(r["replicated_seq"], save["seq"], "{s}");
    assert_eq!(field(r, "saves_behind"), 0, "{s}");
    assert!(field(r, "bytes_uploaded") >= field(&save, "bytes"), "{s}");
    assert!(r["last_error"].is_null(), "{s}");
    let id = s["id"].as_str().unwrap().to_string();
    let table = ramd(&run, &["status"], &env).ok();
    assert!(
        table.contains(&format!("replica of {}: {img}", d.name()))
            && table.contains("0 save(s) behind"),
        "{table}"
    );
    for secret in [ACCESS_KEY, SECRET_KEY] {
        assert!(!d.stderr().contains(secret), "a credential in the log");
        assert!(!s.to_string().contains(secret), "a credential in status");
    }
    let lease = w.read("replica/LEASE");
    assert!(lease.contains(&format!("pid {}", d.pid())), "{lease}");

    // Written after the last snapshot: the stop's save ships it too.
    qemu_io(d.uri(), &["write -P 0x66 40M 64k".into()]);
    let before = export(d.uri(), &tmp.path().join("before"));
    let down = ramd(&run, &["down", d.name()], &env).ok();
    assert!(
        down.contains("stopped, saved") && down.contains(&format!("replicated to {img}")),
        "{down}"
    );
    d.wait_exit(STOP_DEADLINE);
    assert!(
        w.read("replica/LEASE").contains("expires 0"),
        "the replica's lease was not released"
    );
    assert_eq!(
        fs::read_to_string(local.join("MANIFEST")).unwrap(),
        w.read("replica/MANIFEST"),
        "the stop's save did not reach the replica"
    );

    // The host lost its disk: served from the replica alone.
    fs::remove_dir_all(&local).unwrap();
    let run2 = tmp.path().join("run2");
    let d = serve(&run2, &["--image", &img], &env);
    let after = export(d.uri(), &tmp.path().join("after"));
    assert!(after == before, "the disk served from the replica differs");
    assert_eq!(
        d.stats()["id"],
        id.as_str(),
        "the restored disk is another disk"
    );
}

/// Several saves, one of them full: the replica's chain follows the local
/// one, and the segments of the chain the full save replaced are gone
/// from the prefix.
#[test]
fn replica_follows_full_saves_and_drops_the_old_chain() {
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let run = tmp.path().join("run");
    let local = tmp.path().join("local");
    let img = url("follow");
    let d = serve_replicating(&run, "16M", &local, &img, &env);
    qemu_io(d.uri(), &["write -P 0x11 0 1M".into()]);
    snapshot(&run, d.name(), &env);
    qemu_io(d.uri(), &["write -P 0x12 1M 64k".into()]);
    snapshot(&run, d.name(), &env);
    let chain = wait_replicated(&run, &local, &img, &env);
    assert_eq!(chain.as_array().unwrap().len(), 2, "{chain}");
    assert_eq!(segment_objects(&w, "follow"), chain_objects(&chain));

    ramd(&run, &["snapshot", d.name(), "--full"], &env).ok();
    qemu_io(d.uri(), &["write -P 0x13 2M 64k".into()]);
    snapshot(&run, d.name(), &env);
    let chain = wait_replicated(&run, &local, &img, &env);
    let segs = chain.as_array().unwrap();
    assert_eq!(segs.len(), 2, "{chain}");
    assert_eq!(segs[0]["full"], true, "{chain}");
    assert_eq!(field(&segs[0], "seq"), 3, "{chain}");
    assert_eq!(
        segment_objects(&w, "follow"),
        chain_objects(&chain),
        "the replaced chain's segments are still in the prefix"
    );
    drop(d);

    let d = serve(&tmp.path().join("run2"), &["--image", &img], &env);
    qemu_io(
        d.uri(),
        &[
            "read -P 0x11 0 1M".into(),
            "read -P 0x12 1M 64k".into(),
            "read -P 0x13 2M 64k".into(),
        ],
    );
}

/// The object store stopped (SIGSTOP) while saves go on: local saves
/// succeed, status shows the replica's error and how far behind it is;
/// once the server runs again the replica catches up.
#[test]
fn replica_catches_up_after_the_server_stops() {
    let w = Weed::start();
    let mut env = w.env();
    env.push(("RAMD_S3_TIMEOUT".into(), "2".into()));
    env.push(("RAMD_LEASE_SECS".into(), "6".into()));
    let tmp = scratch();
    let run = tmp.path().join("run");
    let local = tmp.path().join("local");
    let img = url("lagging");
    let d = serve_replicating(&run, "16M", &local, &img, &env);
    qemu_io(d.uri(), &["write -P 0x21 0 1M".into()]);
    snapshot(&run, d.name(), &env);
    wait_replicated(&run, &local, &img, &env);

    w.signal(libc::SIGSTOP);
    qemu_io(d.uri(), &["write -P 0x22 1M 1M".into()]);
    snapshot(&run, d.name(), &env);
    qemu_io(d.uri(), &["write -P 0x23 2M 1M".into()]);
    let last = snapshot(&run, d.name(), &env);
    // Every save since save 1, the replicated one: two, or three when the
    // chain's size made the last a compaction (its changes, then the full
    // save).
    let behind = field(&last, "seq") - 1;
    assert!((2..=3).contains(&behind), "{last}");
    wait_until(
        Duration::from_secs(60),
        &format!("status to show the replica failing and {behind} saves behind"),
        || {
            let r = d.stats()["replica"].clone();
            r["last_error"].as_str().is_some_and(|e| e.contains(&img))
                && field(&r, "saves_behind") == behind
        },
    );
    let s = d.stats();
    assert!(s["last_save_error"].is_null(), "a local save failed: {s}");
    let err = s["replica"]["last_error"].as_str().unwrap();
    assert!(
        !err.contains(SECRET_KEY) && !err.contains(ACCESS_KEY),
        "{err}"
    );
    // One line for the spell, however many retries and causes.
    let logged = d
        .stderr()
        .lines()
        .filter(|l| l.contains("replicating image") && l.contains("failed"))
        .count();
    assert_eq!(logged, 1, "not logged once:\n{}", d.stderr());

    w.signal(libc::SIGCONT);
    wait_replicated(&run, &local, &img, &env);
    wait_until(
        Duration::from_secs(30),
        "status to show the replica caught up",
        || {
            let r = d.stats()["replica"].clone();
            r["last_error"].is_null()
                && field(&r, "saves_behind") == 0
                && r["replicated_seq"] == last["seq"]
        },
    );
    assert!(
        d.stderr().contains("works again"),
        "the recovery was not logged:\n{}",
        d.stderr()
    );
    drop(d);
    let d = serve(&tmp.path().join("run2"), &["--image", &img], &env);
    qemu_io(
        d.uri(),
        &[
            "read -P 0x21 0 1M".into(),
            "read -P 0x22 1M 1M".into(),
            "read -P 0x23 2M 1M".into(),
        ],
    );
}

/// What `--replicate` refuses: no --image, a non-s3 URL, an image that is
/// a URL itself, a prefix whose lease another ramd holds (a second
/// replicating writer, or a restore while the primary runs), and a prefix
/// that holds another disk.
#[test]
fn replicate_refusals() {
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let run = tmp.path().join("run");
    let dir = |n: &str| tmp.path().join(n).to_str().unwrap().to_string();
    let img = url("refused");
    let refused = |args: &[&str], wants: &[&str]| {
        let (_, err) = try_serve(&run, args, &env)
            .err()
            .unwrap_or_else(|| panic!("ramd serve {args:?} started"));
        for want in wants {
            assert!(err.contains(want), "{args:?}: lacks {want:?}:\n{err}");
        }
    };
    refused(&["--size", "16M", "--replicate", &img], &["--image"]);
    let other = dir("other");
    refused(
        &["--size", "16M", "--image", &dir("a"), "--replicate", &other],
        &[&other, "s3://BUCKET/PREFIX"],
    );
    refused(
        &["--size", "16M", "--image", &url("x"), "--replicate", &img],
        &[&img, "local directory"],
    );
    refused(
        &["--size", "16M", "--image", &img, "--replicate", &img],
        &[&img, "--image itself"],
    );

    let first = serve(
        &tmp.path().join("first"),
        &["--size", "16M", "--image", &dir("b"), "--replicate", &img],
        &env,
    );
    let pid = format!("pid {}", first.pid());
    refused(
        &["--size", "16M", "--image", &dir("c"), "--replicate", &img],
        &[&img, "lease is held by", &pid],
    );
    refused(&["--image", &img], &[&img, "lease is held by", &pid]);
    drop(first);

    // The prefix now holds disk b's replica: disk c is another disk.
    refused(
        &["--size", "16M", "--image", &dir("c"), "--replicate", &img],
        &[&img, "another disk's image"],
    );

    // Disk b served from the replica saves there: b's directory is now
    // behind its replica, which replicating would replace.
    let from_url = serve(&tmp.path().join("url"), &["--image", &img], &env);
    qemu_io(from_url.uri(), &["write -P 0x7 0 64k".into()]);
    drop(from_url);
    refused(
        &["--image", &dir("b"), "--replicate", &img],
        &[&img, "does not have", "another ramd saved"],
    );
}

/// The replica's server refuses the credentials: the disk starts all the
/// same and saves locally; the failure is logged once (not per retry) and
/// status says why the replica lags, never showing a credential.
#[test]
fn replica_with_wrong_credentials_serves_and_says_so() {
    let w = Weed::start();
    let wrong_secret = "not-the-secret-0123456789";
    let mut env = w.env();
    env[1].1 = wrong_secret.into();
    env.push(("RAMD_REPLICA_WAIT".into(), "4".into()));
    let tmp = scratch();
    let run = tmp.path().join("run");
    let local = tmp.path().join("local");
    let img = url("creds");
    let mut d = serve_replicating(&run, "16M", &local, &img, &env);
    qemu_io(d.uri(), &["write -P 0x31 0 1M".into()]);
    let save = snapshot(&run, d.name(), &env);
    assert_eq!(save["full"], true, "{save}");
    wait_until(
        Duration::from_secs(60),
        "status to say the replica lags for want of credentials",
        || {
            let r = d.stats()["replica"].clone();
            r["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("AWS_SECRET_ACCESS_KEY"))
                && field(&r, "saves_behind") == 1
        },
    );
    let s = d.stats();
    assert!(s["last_save_error"].is_null(), "the local save failed: {s}");
    assert!(s["replica"]["replicated_seq"].is_null(), "{s}");
    let err = d.stderr();
    for secret in [wrong_secret, ACCESS_KEY] {
        assert!(!err.contains(secret), "a credential in the log:\n{err}");
        assert!(
            !s.to_string().contains(secret),
            "a credential in status: {s}"
        );
    }
    // A stop waits RAMD_REPLICA_WAIT for the replica, then says what it
    // lacks; by then the replica was retried several times (1 s, 2 s, ...),
    // and one line says it failed.
    let down = ramd(&run, &["down", d.name()], &env).ok();
    assert!(
        down.contains("stopped, saved") && down.contains("NOT replicated") && down.contains(&img),
        "{down}"
    );
    d.wait_exit(STOP_DEADLINE);
    let lines = d
        .stderr()
        .lines()
        .filter(|l| l.contains("refused these credentials"))
        .count();
    assert!(
        lines == 2,
        "not once at start and once at the stop:\n{}",
        d.stderr()
    );
    let names: Vec<String> = w.objects("creds").into_iter().map(|(n, _)| n).collect();
    assert!(names.is_empty(), "{names:?}");
}

/// A filesystem disk replicated: files written, a clean stop (which ships
/// its save), the directory lost, mounted again from the replica alone.
#[test]
fn fs_disk_replica_restores() {
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let local = tmp.path().join("local");
    let img = url("fsrep");
    let big = tmp.path().join("big");
    random_file(&big, 3 * MIB);

    let d = FsDisk::mount_with_env(
        &[
            "--size",
            "64M",
            "--image",
            local.to_str().unwrap(),
            "--replicate",
            &img,
        ],
        &pairs(&env),
    );
    fs::create_dir(d.join("dir")).unwrap();
    fs::copy(&big, d.join("dir/big")).unwrap();
    fs::write(d.join("small.txt"), b"kept in the replica\n").unwrap();
    d.stop();
    assert_eq!(
        fs::read_to_string(local.join("MANIFEST")).unwrap(),
        w.read("fsrep/MANIFEST"),
        "the stop's save did not reach the replica"
    );

    fs::remove_dir_all(&local).unwrap();
    let d = FsDisk::mount_with_env(&["--image", &img], &pairs(&env));
    assert_same_file(&big, &d.join("dir/big"));
    assert_eq!(
        fs::read(d.join("small.txt")).unwrap(),
        b"kept in the replica\n"
    );
    d.stop();
}

/// `env` with ramd's requests going through `proxy` instead.
fn via(env: &[(String, String)], proxy: &LossyProxy) -> Vec<(String, String)> {
    let mut env = env.to_vec();
    for (k, v) in &mut env {
        if k == "AWS_ENDPOINT_URL" {
            *v = proxy.endpoint();
        }
    }
    env
}

/// Writes `len` random bytes at `at` over NBD, and into `model` (the
/// disk as the test knows it).
fn write_random(uri: &str, dir: &Path, model: &mut [u8], at: u64, len: u64) {
    let data = dir.join(format!("data-{at}-{len}"));
    random_file(&data, len);
    qemu_io(uri, &[format!("write -s {} {at} {len}", data.display())]);
    model[at as usize..(at + len) as usize].copy_from_slice(&fs::read(&data).unwrap());
}

/// The disk served from `img` straight from SeaweedFS, once its killed
/// writer's lease expired, is `model`, byte for byte.
fn assert_loads_as(run: &Path, img: &str, env: &[(String, String)], model: &[u8], out: &Path) {
    let d = serve_once_expired(run, img, env);
    let disk = export(d.uri(), out);
    assert_eq!(disk.len(), model.len());
    if let Some(i) = (0..disk.len()).find(|&i| disk[i] != model[i]) {
        panic!(
            "{img} loads with byte {i} = {:#x}, not the {:#x} written",
            disk[i], model[i]
        );
    }
}

/// A MANIFEST put that the server applied but whose answer was lost on a
/// reset connection: the client library puts it again, the server refuses
/// that (its condition names the MANIFEST before), and ramd finds the
/// MANIFEST is byte for byte the one it put: the save is committed, and
/// so are the ones after. Both kinds of conditional put: the first save
/// of a new prefix (If-None-Match) and a later one (If-Match).
#[test]
fn manifest_commit_whose_answer_was_lost() {
    let w = Weed::start();
    let mut direct = w.env();
    // The killed writer's lease expires soon.
    direct.push(("RAMD_LEASE_SECS".into(), "6".into()));
    let proxy = LossyProxy::start(w.s3_port);
    let env = via(&direct, &proxy);
    let tmp = scratch();
    let run = tmp.path().join("run");
    let img = url("lost-answer");
    let mut model = vec![0u8; (16 * MIB) as usize];
    let mut d = serve(&run, &["--size", "16M", "--image", &img], &env);

    write_random(d.uri(), tmp.path(), &mut model, 0, 4 * MIB);
    proxy.arm(Lose::Close);
    let first = snapshot(&run, d.name(), &env);
    assert_eq!(proxy.lost(), 1, "the first save's MANIFEST put was not hit");
    assert_eq!(first["full"], true, "{first}");

    write_random(d.uri(), tmp.path(), &mut model, 6 * MIB, MIB);
    proxy.arm(Lose::Close);
    let second = snapshot(&run, d.name(), &env);
    assert_eq!(
        proxy.lost(),
        2,
        "the second save's MANIFEST put was not hit"
    );
    assert_eq!(second["full"], false, "{second}");

    write_random(d.uri(), tmp.path(), &mut model, 10 * MIB, 2 * MIB);
    let third = snapshot(&run, d.name(), &env);
    assert_eq!(third["full"], false, "{third}");
    assert_eq!(field(&d.stats(), "save_failures"), 0, "{}", d.stats());
    // Killed: the image is what the saves committed, nothing of a stop.
    d.stop_with(libc::SIGKILL);

    let info = ramd(&run, &["image", "info", &img, "--json"], &direct).ok();
    let info: Value = serde_json::from_str(&info).unwrap();
    let seqs: Vec<u64> = info["chain"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| field(s, "seq"))
        .collect();
    assert_eq!(
        seqs,
        [
            first["seq"].as_u64().unwrap(),
            field(&second, "seq"),
            field(&third, "seq")
        ],
        "{info}"
    );
    assert_loads_as(
        &tmp.path().join("r"),
        &img,
        &direct,
        &model,
        &tmp.path().join("out"),
    );
}

/// A MANIFEST put that the server applied but that timed out (the answer
/// never came): the save fails, as ramd cannot know. The next save's put
/// is refused by the server (the failed one is there), ramd finds the
/// MANIFEST is the failed put's, byte for byte, and commits over it.
#[test]
fn manifest_commit_that_timed_out_but_was_applied() {
    let w = Weed::start();
    let mut direct = w.env();
    // The held answer fails the put in seconds; the killed writer's
    // lease expires soon.
    direct.push(("RAMD_S3_TIMEOUT".into(), "2".into()));
    direct.push(("RAMD_LEASE_SECS".into(), "6".into()));
    let proxy = LossyProxy::start(w.s3_port);
    let env = via(&direct, &proxy);
    let tmp = scratch();
    let run = tmp.path().join("run");
    let img = url("held-answer");
    let mut model = vec![0u8; (16 * MIB) as usize];
    let mut d = serve(&run, &["--size", "16M", "--image", &img], &env);

    write_random(d.uri(), tmp.path(), &mut model, 0, 4 * MIB);
    let first = snapshot(&run, d.name(), &env);
    write_random(d.uri(), tmp.path(), &mut model, 6 * MIB, MIB);
    proxy.arm(Lose::Hold);
    let out = ramd(&run, &["snapshot", d.name()], &env).failed();
    assert_eq!(proxy.lost(), 1, "the save's MANIFEST put was not hit");
    assert!(out.stderr.contains(&img), "{}", out.stderr);
    // It failed for ramd, yet the server holds it.
    let held = w.read("held-answer/MANIFEST");
    let failed_seq = field(&first, "seq") + 1;
    assert!(
        held.contains(&format!("\nseg {failed_seq} incr ")),
        "the held put was not applied:\n{held}"
    );

    write_random(d.uri(), tmp.path(), &mut model, 10 * MIB, 2 * MIB);
    let next = snapshot(&run, d.name(), &env);
    // A failed save makes the next one full.
    assert_eq!(next["full"], true, "{next}");
    assert!(field(&next, "seq") > failed_seq, "{next}");
    d.stop_with(libc::SIGKILL);

    let info = ramd(&run, &["image", "info", &img, "--json"], &direct).ok();
    let info: Value = serde_json::from_str(&info).unwrap();
    let chain = info["chain"].as_array().unwrap();
    assert_eq!(chain.len(), 1, "{info}");
    assert_eq!(chain[0]["seq"], next["seq"], "{info}");
    assert_loads_as(
        &tmp.path().join("r"),
        &img,
        &direct,
        &model,
        &tmp.path().join("out"),
    );
}

/// A 64 MiB disk of random data saved to `img` (straight to the server):
/// the data's file, and the name and size of the one segment object.
fn saved_random_image(
    w: &Weed,
    prefix: &str,
    env: &[(String, String)],
    tmp: &Path,
) -> (PathBuf, String, u64) {
    let run = tmp.join(format!("{prefix}-writer"));
    let data = tmp.join(format!("{prefix}-data"));
    random_file(&data, 64 * MIB);
    let d = serve(&run, &["--size", "64M", "--image", &url(prefix)], env);
    qemu_io(d.uri(), &[format!("write -s {} 0 64M", data.display())]);
    let full = snapshot(&run, d.name(), env);
    assert_eq!(full["full"], true, "{full}");
    drop(d);
    let segs: Vec<(String, u64)> = w
        .objects(prefix)
        .into_iter()
        .filter(|(n, _)| n.starts_with("seg-"))
        .collect();
    assert_eq!(segs.len(), 1, "one full save, one segment: {segs:?}");
    assert!(segs[0].1 > 64 * MIB, "random data stored smaller: {segs:?}");
    (data, segs[0].0.clone(), segs[0].1)
}

/// `ramd serve --image IMG` started on a thread (it returns once loaded,
/// or once it failed): its exit and stderr if it failed.
fn serve_in_background(
    run: &Path,
    img: &str,
    env: &[(String, String)],
) -> std::thread::JoinHandle<Result<(), (String, String)>> {
    let (run, img, env) = (run.to_path_buf(), img.to_string(), env.to_vec());
    std::thread::spawn(move || try_serve(&run, &["--image", &img], &env).map(drop))
}

/// A segment of several ranged GETs (64 MiB; a range is 16 MiB) loads as
/// ranges, fetched several at once and parsed in order: the disk served,
/// `ramd image export` and `ramd image restore` (to a directory) give the
/// source's bytes exactly. A proxy in between counts the ranges.
#[test]
fn large_segment_loads_as_ranges() {
    let w = Weed::start();
    let tmp = scratch();
    let (data, seg, len) = saved_random_image(&w, "ranges", &w.env(), tmp.path());
    let proxy = LossyProxy::start(w.s3_port);
    let env = via(&w.env(), &proxy);
    let run = tmp.path().join("run");
    let img = url("ranges");
    let want = sha256(&data);

    let d = serve(&run, &["--image", &img], &env);
    let out = tmp.path().join("loaded");
    export(d.uri(), &out);
    assert_eq!(sha256(&out), want, "the loaded disk differs from the data");
    drop(d);
    let mut starts = proxy.ranged_gets(&format!("/ranges/{seg}"));
    starts.sort_unstable();
    starts.dedup();
    assert!(
        starts.len() >= 4 && starts[0] == 0 && *starts.last().unwrap() < len,
        "a {len}-byte segment was not read as ranges: GETs from {starts:?}"
    );

    let (tmp, env, data) = (tmp.path(), &env, fs::read(&data).unwrap());
    restore_common::assert_image_is(&run, &img, env, &data, tmp, "the exported image");
    let to = restore_to(&run, env, &img, "1", tmp);
    restore_common::assert_image_is(&run, &to, env, &data, tmp, "the restored image");
}

/// `ramd image restore IMG --at SEQ` into a new directory under `tmp`,
/// which must say it restored save SEQ; the directory.
fn restore_to(run: &Path, env: &[(String, String)], img: &str, seq: &str, tmp: &Path) -> String {
    let to = tmp.join(format!("restored-{seq}"));
    let to = to.to_str().unwrap();
    let out = ramd(
        run,
        &["image", "restore", img, "--at", seq, "--to", to],
        env,
    )
    .ok();
    assert!(out.contains(&format!("restored save {seq} ")), "{out}");
    to.to_string()
}

/// Starts `ramd serve --image IMG` through `proxy`, which holds every
/// ranged GET after a segment's first, and returns once the load waits
/// on one.
fn load_held_past_the_first_range(
    run: &Path,
    img: &str,
    env: &[(String, String)],
    proxy: &LossyProxy,
) -> std::thread::JoinHandle<Result<(), (String, String)>> {
    proxy.hold_ranges();
    let loading = serve_in_background(run, img, env);
    wait_until(
        Duration::from_secs(60),
        "the load to ask for a range past the segment's first",
        || proxy.held() > 0,
    );
    loading
}

/// A segment rewritten while a load reads it (between its first range and
/// the next: the proxy holds the later ranges meanwhile) fails the load,
/// naming the object and the bytes, rather than loading a mix of the two.
#[test]
fn segment_rewritten_during_a_load_is_refused() {
    let w = Weed::start();
    let tmp = scratch();
    let (_, seg, len) = saved_random_image(&w, "rewritten", &w.env(), tmp.path());
    let proxy = LossyProxy::start(w.s3_port);
    let env = via(&w.env(), &proxy);
    let img = url("rewritten");

    let loading = load_held_past_the_first_range(&tmp.path().join("run"), &img, &env, &proxy);
    // The same length, one byte of the last page's record changed: were
    // the two versions mixed, the parser alone would see a bad checksum.
    let key = Key::from(format!("rewritten/{seg}"));
    let client = w.client();
    let mut bytes = block_on(async { client.get(&key).await?.bytes().await })
        .unwrap()
        .to_vec();
    assert_eq!(bytes.len() as u64, len);
    let at = bytes.len() - 2000;
    bytes[at] ^= 0xff;
    block_on(client.put(&key, bytes.into())).unwrap();
    proxy.release();

    let Err((status, stderr)) = loading.join().unwrap() else {
        panic!("a load of a segment rewritten half way succeeded");
    };
    assert!(status.starts_with("exited"), "{status}\n{stderr}");
    assert!(
        stderr.contains(&format!("{img}/{seg}: bytes "))
            && stderr.contains("changed while it was being read"),
        "the refusal does not name the object, its bytes and why:\n{stderr}"
    );
    assert!(
        !stderr.contains("checksum"),
        "the parser saw mixed data:\n{stderr}"
    );

    // Emptied: there is no first range to ask for; the load says how
    // short the object is.
    block_on(client.put(&key, Vec::new().into())).unwrap();
    let Err((_, stderr)) = try_serve(&tmp.path().join("run2"), &["--image", &img], &w.env()) else {
        panic!("a load of an emptied segment succeeded");
    };
    assert!(
        stderr.contains(&format!("{img}/{seg}"))
            && stderr.contains(&format!("file is 0 bytes, the MANIFEST says {len}")),
        "the refusal does not say the object is empty:\n{stderr}"
    );
}

/// The server stopped (SIGSTOP) while a load has read a segment's first
/// range and not the rest: the load fails once the client gives up
/// (retries included), naming the object and the bytes it lacked, and no
/// disk is served. The image is untouched: once the server runs again it
/// loads whole.
#[test]
fn server_stopped_during_a_load() {
    let w = Weed::start();
    let tmp = scratch();
    // Saved with the default timeout: a busy host may take seconds.
    let (data, seg, _) = saved_random_image(&w, "stopped-load", &w.env(), tmp.path());
    let mut direct = w.env();
    // The loader's requests give up within seconds; its lease (it cannot
    // release it while the server is stopped) expires soon.
    direct.push(("RAMD_S3_TIMEOUT".into(), "5".into()));
    direct.push(("RAMD_LEASE_SECS".into(), "10".into()));
    let proxy = LossyProxy::start(w.s3_port);
    let env = via(&direct, &proxy);
    let img = url("stopped-load");

    let loading = load_held_past_the_first_range(&tmp.path().join("run"), &img, &env, &proxy);
    w.signal(libc::SIGSTOP);
    proxy.release();
    let result = loading.join().unwrap();
    w.signal(libc::SIGCONT);
    let Err((status, stderr)) = result else {
        panic!("a load from a stopped server succeeded");
    };
    assert!(status.starts_with("exited"), "{status}\n{stderr}");
    assert!(
        stderr.contains(&format!("loading image {img}"))
            && stderr.contains(&format!("{img}/{seg}: bytes "))
            && stderr.contains("did not answer"),
        "the failure does not name the object, its bytes and why:\n{stderr}"
    );

    let d = serve_once_expired(&tmp.path().join("again"), &img, &direct);
    let out = tmp.path().join("loaded");
    export(d.uri(), &out);
    assert_eq!(sha256(&out), sha256(&data), "the image loads otherwise");
}

/// `--replicate` with `--keep-saves`: the chains the local image keeps
/// across full saves are kept in the replica too (their MANIFEST-N and
/// segments), so `ramd image ls` of the URL lists what the directory's
/// does and, with the directory gone, `ramd image restore URL --at SEQ`
/// of a save of a replaced chain gives that save's data exactly.
#[test]
fn replica_keeps_the_chains_the_local_image_keeps() {
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let run = tmp.path().join("run");
    let local = tmp.path().join("local");
    let img = url("kept-replica");
    let args = [
        "--size",
        "16M",
        "--image",
        local.to_str().unwrap(),
        "--replicate",
        &img,
        "--keep-saves",
        "1h",
    ];
    let d = serve(&run, &args, &env);
    let mut model = vec![0u8; (16 * MIB) as usize];
    // (seq, the disk as that save holds it)
    let mut saves: Vec<(u64, Vec<u8>)> = Vec::new();
    for (i, full) in [false, false, true, false].into_iter().enumerate() {
        write_random(d.uri(), tmp.path(), &mut model, i as u64 * 3 * MIB, MIB);
        let mut a = vec!["snapshot", d.name(), "--json"];
        if full {
            a.push("--full");
        }
        let s: Value = serde_json::from_str(&ramd(&run, &a, &env).ok()).unwrap();
        assert_eq!(s["full"], full || i == 0, "{s}");
        saves.push((field(&s, "seq"), model.clone()));
    }
    // The local image keeps the first chain (saves 1 and 2) as MANIFEST-N;
    // the replica lists the same saves once it is caught up.
    let chain = wait_replicated(&run, &local, &img, &env);
    let seqs: Vec<u64> = chain
        .as_array()
        .unwrap()
        .iter()
        .map(|s| field(s, "seq"))
        .collect();
    assert_eq!(
        seqs,
        saves.iter().map(|s| s.0).collect::<Vec<_>>(),
        "{chain}"
    );
    let kept = format!("MANIFEST-{:08}", saves[0].0);
    assert_eq!(
        fs::read_to_string(local.join(&kept)).unwrap(),
        w.read(&format!("kept-replica/{kept}")),
        "the replica's kept MANIFEST is not the local one"
    );
    drop(d);

    // The host lost its directory: the older chain's saves come back
    // from the replica alone.
    fs::remove_dir_all(&local).unwrap();
    for (seq, want) in &saves[..2] {
        let to = restore_to(&run, &env, &img, &seq.to_string(), tmp.path());
        let what = format!("save {seq}, restored from the replica");
        restore_common::assert_image_is(&run, &to, &env, want, tmp.path(), &what);
    }
}

/// `ramd image restore` of an image in object storage: every save of
/// three chains (two kept by --keep-saves across full saves), a time
/// between two, a prune by retention, bad input (restore_common.rs); the
/// restored images go to prefixes and to directories alike.
#[test]
fn restore_any_kept_save_of_a_prefix() {
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let dests: Vec<String> = (0..10)
        .map(|i| match i % 2 {
            0 => url(&format!("restored-{i}")),
            _ => tmp
                .path()
                .join(format!("restored-{i}"))
                .display()
                .to_string(),
        })
        .collect();
    restore_common::restore_scenario(&url("kept"), &dests, &env, tmp.path());
    // The dropped chain's segments are gone from the prefix, the kept one's
    // are there.
    let names: Vec<String> = w.objects("kept").into_iter().map(|(n, _)| n).collect();
    for seq in [1, 2] {
        let seg = format!("seg-{seq:08}-");
        assert!(!names.iter().any(|n| n.starts_with(&seg)), "{names:?}");
    }
    for seq in [3, 4, 5, 6] {
        let seg = format!("seg-{seq:08}-");
        assert!(names.iter().any(|n| n.starts_with(&seg)), "{names:?}");
    }
}

/// `snapshot --to s3://...` of a replicating disk is refused, saying why
/// and what to do, and writes nothing there; the disk, its image and the
/// replica carry on. `snapshot --to DIR` moves the image, and the replica
/// follows the new directory: it alone then loads every save's data.
#[test]
fn snapshot_to_a_url_of_a_replicating_disk() {
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let run = tmp.path().join("run");
    let local = tmp.path().join("local");
    let img = url("followed");
    let d = serve_replicating(&run, "16M", &local, &img, &env);
    qemu_io(d.uri(), &["write -P 0x51 0 1M".into()]);
    snapshot(&run, d.name(), &env);
    wait_replicated(&run, &local, &img, &env);

    let other = url("elsewhere");
    let out = ramd(&run, &["snapshot", d.name(), "--to", &other], &env).failed();
    for want in [
        img.as_str(),
        "--replicate",
        "--to DIR",
        local.to_str().unwrap(),
    ] {
        assert!(out.stderr.contains(want), "lacks {want:?}:\n{}", out.stderr);
    }
    assert!(
        w.objects("elsewhere").is_empty(),
        "{:?}",
        w.objects("elsewhere")
    );
    assert_eq!(
        disk_entry(&status_json(&run), d.name()).unwrap()["image"],
        local.to_str().unwrap()
    );

    qemu_io(d.uri(), &["write -P 0x52 2M 1M".into()]);
    snapshot(&run, d.name(), &env);
    wait_replicated(&run, &local, &img, &env);

    let moved = tmp.path().join("moved");
    ramd(
        &run,
        &["snapshot", d.name(), "--to", moved.to_str().unwrap()],
        &env,
    )
    .ok();
    qemu_io(d.uri(), &["write -P 0x53 4M 1M".into()]);
    snapshot(&run, d.name(), &env);
    wait_replicated(&run, &moved, &img, &env);
    drop(d);

    let r = serve(&tmp.path().join("r"), &["--image", &img], &env);
    qemu_io(
        r.uri(),
        &[
            "read -P 0x51 0 1M".into(),
            "read -P 0x52 2M 1M".into(),
            "read -P 0x53 4M 1M".into(),
        ],
    );
}

/// qemu-io's reads of a read-only export (it opens read-write unless
/// told otherwise, which a read-only export refuses).
fn qemu_read(uri: &str, cmds: &[&str]) {
    require_tool("qemu-io");
    let mut c = cmd("qemu-io", ["-r", "-f", "raw"]);
    for x in cmds {
        c.args(["-c", x]);
    }
    let out = run(c.arg(uri), CMD_TIMEOUT);
    let (stdout, stderr) = (out.stdout.clone(), out.stderr.clone());
    out.ok();
    assert!(
        !stdout.contains("failed") && !stdout.contains("error") && !stderr.contains("failed"),
        "qemu-io {cmds:?}: {stdout}{stderr}"
    );
}

/// `ramd promote NAME ARGS`.
fn promote(run: &Path, name: &str, args: &[&str], env: &[(String, String)]) -> Output {
    let mut all = vec!["promote", name];
    all.extend_from_slice(args);
    ramd(run, &all, env)
}

/// Waits until the standby's status says it applied save `seq` and is no
/// save behind; returns its `standby` status.
fn wait_applied(s: &Ramd, seq: u64) -> Value {
    let mut last = Value::Null;
    wait_until(
        Duration::from_secs(60),
        &format!("the standby to apply save {seq}"),
        || {
            last = s.stats()["standby"].clone();
            last["applied_seq"] == seq
                && last["saves_behind"] == 0
                && last["error"].is_null()
                && !last["last_poll_unix"].is_null()
        },
    );
    last
}

/// A writer and a standby on one prefix: the standby serves each save
/// read-only as it appears (new saves of the chain, then a full save that
/// starts a new chain and drops what was trimmed), refuses writes; the
/// writer is killed, `promote` waits for its lease to run out, and the
/// promoted disk takes writes and saves them, with the same identity.
#[test]
fn standby_follows_saves_and_is_promoted_when_the_writer_dies() {
    let w = Weed::start();
    let mut env = w.env();
    env.push(("RAMD_LEASE_SECS".into(), "3".into()));
    let tmp = scratch();
    let img = url("standby");
    let (run_w, run_s) = (tmp.path().join("w"), tmp.path().join("s"));
    let mut writer = serve(&run_w, &["--size", "16M", "--image", &img], &env);
    qemu_io(writer.uri(), &["write -P 0x11 0 2M".into()]);
    assert_eq!(snapshot(&run_w, writer.name(), &env)["seq"], 1);

    let standby = serve(
        &run_s,
        &["--image", &img, "--standby", "--standby-poll", "200ms"],
        &env,
    );
    let st = standby.stats();
    assert_eq!(st["read_only"], true, "{st}");
    let writer_id = writer.stats()["id"].clone();
    assert_eq!(st["id"], writer_id, "the standby is another disk");
    let sb = wait_applied(&standby, 1);
    assert!(
        sb["lease_holder"]
            .as_str()
            .is_some_and(|h| h.contains(&format!("pid {}", writer.pid()))),
        "status does not name the writer: {sb}"
    );
    qemu_read(standby.uri(), &["read -P 0x11 0 2M"]);
    // The server refuses writes (libnbd sends them anyway), and they
    // change nothing.
    nbd_script("readonly.py", &[standby.uri(), "any"]);
    let text = ramd(&run_s, &["status"], &env).ok();
    assert!(
        text.contains("standby") && text.contains(&format!("pid {}", writer.pid())),
        "{text}"
    );

    // An incremental save: applied, and the standby reads as the writer.
    qemu_io(
        writer.uri(),
        &["write -P 0x22 4M 1M".into(), "write -P 0x23 1M 4k".into()],
    );
    let inc = snapshot(&run_w, writer.name(), &env);
    assert_eq!(inc["full"], false, "{inc}");
    let sb = wait_applied(&standby, 2);
    assert!(
        field(&sb, "bytes_downloaded") >= field(&inc, "bytes"),
        "{sb} {inc}"
    );
    let a = export(writer.uri(), &tmp.path().join("w1"));
    let b = export(standby.uri(), &tmp.path().join("s1"));
    assert!(a == b, "the standby differs from the writer after save 2");

    // A full save of a new chain: what the writer trimmed since is gone on
    // the standby too (a full save names only the pages that hold data).
    qemu_io(
        writer.uri(),
        &["discard 0 1M".into(), "write -P 0x33 8M 1M".into()],
    );
    let full = ramd(
        &run_w,
        &["snapshot", writer.name(), "--full", "--json"],
        &env,
    )
    .ok();
    let full: Value = serde_json::from_str(full.trim()).unwrap();
    assert_eq!(full["full"], true, "{full}");
    wait_applied(&standby, 3);
    let a = export(writer.uri(), &tmp.path().join("w2"));
    let b = export(standby.uri(), &tmp.path().join("s2"));
    assert_filled(&b, 0, MIB, 0, "the trimmed 1M on the standby");
    assert!(
        a == b,
        "the standby differs from the writer after the full save"
    );

    // The writer dies holding its lease: promote waits until it runs out.
    writer.stop_with(libc::SIGKILL);
    let out = promote(&run_s, standby.name(), &["--wait", "60s"], &env).ok();
    assert!(out.contains("promoted"), "{out}");
    let st = standby.stats();
    assert_eq!(st["read_only"], false, "{st}");
    assert!(st["standby"].is_null(), "{st}");
    assert_eq!(st["id"], writer_id, "the promoted disk changed identity");
    // Writable for a new connection, and saves as a writer.
    qemu_io(standby.uri(), &["write -P 0x44 12M 1M".into()]);
    let saved = snapshot(&run_s, standby.name(), &env);
    assert_eq!(saved["full"], false, "{saved}");
    let promoted = export(standby.uri(), &tmp.path().join("p"));
    assert_filled(&promoted, 12 * MIB, MIB, 0x44, "the promoted disk's write");
    let id = standby.stats()["id"].clone();
    drop(standby);

    let fresh = serve(&tmp.path().join("fresh"), &["--image", &img], &env);
    assert_eq!(fresh.stats()["id"], id, "the image changed identity");
    let loaded = export(fresh.uri(), &tmp.path().join("f"));
    assert!(
        loaded == promoted,
        "the image differs from the promoted disk"
    );
}

/// `promote` while the writer lives: refused at once without --force
/// (naming the holder and when its lease runs out); with --force the
/// standby takes over, and the old writer's next save fails without
/// touching the image, which holds the promoted disk's saves.
#[test]
fn promote_force_fences_off_a_live_writer() {
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let img = url("force");
    let (run_w, run_s) = (tmp.path().join("w"), tmp.path().join("s"));
    let mut writer = serve(&run_w, &["--size", "8M", "--image", &img], &env);
    qemu_io(writer.uri(), &["write -P 0x11 0 1M".into()]);
    snapshot(&run_w, writer.name(), &env);
    let standby = serve(&run_s, &["--image", &img, "--standby"], &env);
    let writer_id = writer.stats()["id"].clone();
    assert_eq!(standby.stats()["id"], writer_id);

    let out = promote(&run_s, standby.name(), &["--wait", "0s"], &env).failed();
    assert!(
        out.stderr.contains(&format!("pid {}", writer.pid()))
            && out.stderr.contains("until")
            && out.stderr.contains("--force"),
        "the refusal does not name the holder, its expiry and --force: {}",
        out.stderr
    );
    assert!(standby.stats()["standby"].is_object(), "still a standby");

    let out = promote(&run_s, standby.name(), &["--force"], &env).ok();
    assert!(out.contains("promoted"), "{out}");
    assert_eq!(standby.stats()["id"], writer_id);

    // The old writer's next save is refused: the promotion's commit fenced
    // it off (or, if its lease renewal came first, it knows it lost it).
    qemu_io(writer.uri(), &["write -P 0x22 0 1M".into()]);
    let out = ramd(&run_w, &["snapshot", writer.name()], &env).failed();
    assert!(
        out.stderr.contains("another writer committed") || out.stderr.contains("lost the lease"),
        "{}",
        out.stderr
    );
    qemu_io(standby.uri(), &["write -P 0x33 2M 1M".into()]);
    snapshot(&run_s, standby.name(), &env);
    let out = ramd(&run_w, &["snapshot", writer.name()], &env).failed();
    assert!(
        out.stderr.contains("another writer committed") || out.stderr.contains("lost the lease"),
        "{}",
        out.stderr
    );
    // Its stop would hold its unsaved data; it is given up here.
    writer.stop_with(libc::SIGKILL);
    drop(standby);

    let fresh = serve(&tmp.path().join("fresh"), &["--image", &img], &env);
    qemu_io(
        fresh.uri(),
        &["read -P 0x11 0 1M".into(), "read -P 0x33 2M 1M".into()],
    );
}

/// What `--standby` refuses, and `promote` of a disk that is not one.
#[test]
fn standby_refusals() {
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let run = tmp.path().join("run");
    let dir = tmp.path().join("dir");
    let refused = |args: &[&str], want: &str| {
        let (_, err) = try_serve(&run, args, &env)
            .map(|_| ())
            .expect_err(&format!("{args:?} started"));
        assert!(err.contains(want), "{args:?}: {err}");
    };
    refused(
        &["--standby", "--image", dir.to_str().unwrap()],
        "a standby follows an image in object storage",
    );
    refused(&["--standby", "--size", "8M"], "--image");
    refused(
        &["--standby", "--image", &url("empty")],
        "holds no save yet",
    );
    refused(
        &[
            "--standby",
            "--image",
            &url("x"),
            "--mount",
            tmp.path().to_str().unwrap(),
            "--data-path",
            "kernel",
        ],
        "--standby with --data-path kernel",
    );
    refused(
        &["--standby", "--image", &url("x"), "--replicate", &url("y")],
        "--standby with --replicate",
    );

    let d = serve(&run, &["--size", "8M", "--image", &url("plain")], &env);
    let out = promote(&run, d.name(), &["--force"], &env).failed();
    assert!(out.stderr.contains("is not a standby"), "{}", out.stderr);
    snapshot(&run, d.name(), &env);
    // A standby does not save (its writer does), and stops cleanly
    // without a save (the drop checks its exit status).
    let run_s = tmp.path().join("s");
    let s = serve(
        &run_s,
        &["--name", "sb", "--image", &url("plain"), "--standby"],
        &env,
    );
    let out = ramd(&run_s, &["snapshot", "sb"], &env).failed();
    assert!(out.stderr.contains("is a standby"), "{}", out.stderr);
    drop(s);
}

/// A standby's reads while its writer saves again and again: each read of
/// the range sees one whole save (one fill byte throughout), never a save
/// half applied, and the reads see the saves in order.
#[test]
fn standby_reads_see_whole_saves() {
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let img = url("whole");
    let (run_w, run_s) = (tmp.path().join("w"), tmp.path().join("s"));
    let writer = serve(&run_w, &["--size", "16M", "--image", &img], &env);
    qemu_io(writer.uri(), &["write -P 1 0 8M".into()]);
    snapshot(&run_w, writer.name(), &env);
    let standby = serve(
        &run_s,
        &["--image", &img, "--standby", "--standby-poll", "100ms"],
        &env,
    );
    wait_applied(&standby, 1);
    let stop = tmp.path().join("stop");
    let reader = Background::spawn(&mut nbd_script_cmd(
        "whole_saves.py",
        &[
            standby.uri(),
            &(8 * MIB).to_string(),
            stop.to_str().unwrap(),
        ],
    ));
    let saves = 12u64;
    for k in 2..=saves {
        qemu_io(writer.uri(), &[format!("write -P {k} 0 8M")]);
        let s = snapshot(&run_w, writer.name(), &env);
        // Each applied before the next: the reader meets every one.
        wait_applied(&standby, field(&s, "seq"));
    }
    fs::write(&stop, b"").unwrap();
    let out = reader.finish_ok();
    let seen: Vec<u64> = out
        .lines()
        .find_map(|l| l.strip_prefix("patterns "))
        .unwrap_or_else(|| panic!("{out}"))
        .split(',')
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]) && seen.last() == Some(&saves),
        "the reads did not see the saves in order, ending with the last: {seen:?}"
    );
}

/// A standby's iSCSI LUN is write-protected (qemu's writes fail) until the
/// promotion; then the same LUN takes writes. The writer stopped cleanly,
/// so its lease is free and `promote --wait 0s` succeeds at once.
#[test]
fn standby_over_iscsi_is_write_protected_until_promoted() {
    require_tool("qemu-io");
    let w = Weed::start();
    let env = w.env();
    let tmp = scratch();
    let img = url("iscsi");
    let run_w = tmp.path().join("w");
    let run_s = tmp.path().join("s");
    let mut writer = serve(&run_w, &["--size", "8M", "--image", &img], &env);
    qemu_io(writer.uri(), &["write -P 0x11 0 1M".into()]);
    writer.stop();
    let iqn = "iqn.2026-11.org.example:standby";
    let port = free_tcp_port().to_string();
    let standby = serve(
        &run_s,
        &[
            "--image",
            &img,
            "--standby",
            "--iscsi",
            &port,
            "--iscsi-target",
            iqn,
        ],
        &env,
    );
    let lun = format!("iscsi://127.0.0.1:{port}/{iqn}/0");
    qemu_read(&lun, &["read -P 0x11 0 1M"]);
    let out = run(
        &mut cmd("qemu-io", ["-f", "raw", "-c", "write -P 0x22 0 64k", &lun]),
        CMD_TIMEOUT,
    );
    assert!(
        !out.success() || out.stdout.contains("failed") || out.stderr.contains("failed"),
        "qemu-io wrote to a standby's LUN: {out:?}"
    );
    qemu_read(&lun, &["read -P 0x11 0 1M"]);

    promote(&run_s, standby.name(), &["--wait", "0s"], &env).ok();
    qemu_io(&lun, &["write -P 0x22 0 1M".into()]);
    qemu_io(standby.uri(), &["read -P 0x22 0 1M".into()]);
}

/// The fio job the failover tests verify: each 4 KiB page of `size` bytes
/// from `offset` written once, in an order `seed` fixes, each with a
/// crc32c header (which also names the page's offset), so a later
/// `--verify_only` run of the same job checks every page it wrote.
fn verified_job(offset: &str, size: &str, seed: &str) -> Vec<String> {
    [
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=16",
        "--verify=crc32c",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        format!("--offset={offset}"),
        format!("--size={size}"),
        format!("--randseed={seed}"),
    ])
    .collect()
}

fn opts<'a>(job: &'a [String], more: &[&'a str]) -> Vec<&'a str> {
    job.iter()
        .map(String::as_str)
        .chain(more.iter().copied())
        .collect()
}

/// The image's last committed save, as its MANIFEST names it.
fn committed_seq(run: &Path, img: &str, env: &[(String, String)]) -> u64 {
    let info: Value =
        serde_json::from_str(&ramd(run, &["image", "info", img, "--json"], env).ok()).unwrap();
    info["chain"]
        .as_array()
        .and_then(|c| c.last())
        .and_then(|s| s["seq"].as_u64())
        .unwrap_or_else(|| panic!("no chain in image info --json: {info}"))
}

/// Failover under fio: a writer autosaving every second takes fio's
/// random 4 KiB writes (crc32c verify headers); `ramd snapshot` commits
/// them; fio keeps writing elsewhere (those writes may be lost) until the
/// writer is killed with SIGKILL. The standby is promoted (`force`: at
/// once, taking the dead writer's live lease; else once it expires), and
/// fio's verify-only run of the first job passes on it: every page fio
/// wrote before the commit is there. The promoted disk takes fio's writes
/// and verifies them, the old writer started again is refused naming the
/// new holder, and the image, loaded afresh, holds both jobs.
///
/// `poll` is the standby's: with `force` it is long, so the standby
/// applies nothing after its start and the promotion itself must fetch
/// every save the writer committed since.
fn failover_under_fio(force: bool, poll: &str) {
    require_tool("fio");
    let w = Weed::start();
    let mut env = w.env();
    env.push(("RAMD_LEASE_SECS".into(), "3".into()));
    let tmp = scratch();
    let img = url("failover");
    let (run_w, run_s) = (tmp.path().join("w"), tmp.path().join("s"));
    let fio_dir = tmp.path().join("fio");
    fs::create_dir(&fio_dir).unwrap();
    let mut writer = serve(
        &run_w,
        &["--size", "64M", "--image", &img, "--autosave", "1s"],
        &env,
    );
    // The standby needs a save to load.
    snapshot(&run_w, writer.name(), &env);
    let standby = serve(
        &run_s,
        &["--image", &img, "--standby", "--standby-poll", poll],
        &env,
    );
    let first = wait_applied(&standby, 1);
    assert_eq!(first["saves_applied"], 0, "{first}");

    // Paced so that autosaves commit while it writes.
    let before = verified_job("0", "32M", "2311");
    let job = fio(
        writer.uri(),
        &fio_dir,
        "before",
        &opts(&before, &["--do_verify=0", "--rate_iops=2000"]),
    );
    assert_eq!(io_bytes(&job, "write"), 32 * MIB, "{job}");
    let saved = field(&snapshot(&run_w, writer.name(), &env), "seq");
    let autosaves = saved - 2;
    assert!(autosaves > 0, "no autosave committed while fio wrote");

    // Writes after the commit, until the kill: an autosave commits some.
    let after = verified_job("32M", "16M", "2312");
    let mut c = cmd(
        "fio",
        opts(
            &after,
            &[
                "--name=after",
                "--ioengine=nbd",
                // One process: a job process has its own session, which
                // Background's kill of fio's process group would miss.
                "--thread",
                "--time_based",
                "--runtime=600",
                "--rate_iops=500",
            ],
        ),
    );
    c.arg(format!("--uri={}", writer.uri()))
        .current_dir(&fio_dir);
    let mut late = Background::spawn(&mut c);
    wait_until(
        Duration::from_secs(60),
        "an autosave of fio's later writes",
        || {
            late.assert_running();
            writer.stats()["last_save"]["seq"]
                .as_u64()
                .is_some_and(|s| s > saved)
        },
    );
    if !force {
        // The standby follows: it holds the commit before the kill.
        wait_until(
            Duration::from_secs(60),
            &format!("the standby to apply save {saved}"),
            || field(&standby.stats()["standby"], "applied_seq") >= saved,
        );
    }
    writer.stop_with(libc::SIGKILL);
    drop(late);
    let last = committed_seq(&tmp.path().join("info"), &img, &env);
    assert!(last > saved, "{last} {saved}");

    let args: &[&str] = match force {
        true => &["--force", "--json"],
        false => &["--wait", "60s", "--json"],
    };
    let out = promote(&run_s, standby.name(), args, &env).ok();
    let promoted: Value = serde_json::from_str(out.trim()).unwrap();
    // Its own save follows the writer's last: none was skipped or lost.
    assert_eq!(promoted["seq"], last + 1, "{promoted}");
    let st = standby.stats();
    assert_eq!(st["read_only"], false, "{st}");
    assert!(st["standby"].is_null(), "{st}");

    // Every page fio wrote before the commit, as it wrote it.
    let verify = opts(&before, &["--verify_only", "--verify_state_load=1"]);
    let job = fio(standby.uri(), &fio_dir, "before", &verify);
    assert_eq!(io_bytes(&job, "read"), 32 * MIB, "{job}");

    // The promoted disk takes writes (a new connection is writable).
    let more = verified_job("48M", "16M", "2313");
    let job = fio(
        standby.uri(),
        &fio_dir,
        "promoted",
        &opts(&more, &["--do_verify=1"]),
    );
    assert_eq!(io_bytes(&job, "read"), 16 * MIB, "{job}");
    snapshot(&run_s, standby.name(), &env);

    // The old writer, started again, finds the lease the standby holds.
    let (_, err) = try_serve(&run_w, &["--image", &img], &env)
        .map(|_| ())
        .expect_err("the old writer started again beside the promoted standby");
    assert!(
        err.contains("is in use") && err.contains(&format!("pid {}", standby.pid())),
        "the refusal does not name the promoted standby (pid {}): {err}",
        standby.pid()
    );

    // A clean stop saves and releases the lease; a fresh load holds both.
    drop(standby);
    let fresh = serve(&tmp.path().join("fresh"), &["--image", &img], &env);
    let job = fio(fresh.uri(), &fio_dir, "before", &verify);
    assert_eq!(io_bytes(&job, "read"), 32 * MIB, "{job}");
    let job = fio(
        fresh.uri(),
        &fio_dir,
        "promoted",
        &opts(&more, &["--verify_only"]),
    );
    assert_eq!(io_bytes(&job, "read"), 16 * MIB, "{job}");
}

#[test]
fn failover_under_fio_once_the_lease_expires() {
    failover_under_fio(false, "200ms");
}

#[test]
fn failover_under_fio_with_force() {
    failover_under_fio(true, "10m");
}

/// One node of a mounted tree as a client sees it: its path, type,
/// permissions, size, mtime and content (a file's bytes, a link's target).
#[derive(Debug, PartialEq)]
struct Node {
    path: String,
    kind: &'static str,
    mode: u32,
    size: u64,
    mtime: (i64, i64),
    content: Vec<u8>,
}

/// Every node under `root`, sorted by path.
fn tree_of(root: &Path) -> Vec<Node> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
            let (kind, content) = if m.is_dir() {
                todo.push(p.clone());
                ("dir", Vec::new())
            } else if m.file_type().is_symlink() {
                let t = fs::read_link(&p).unwrap();
                ("symlink", t.as_os_str().as_bytes().to_vec())
            } else {
                (
                    "file",
                    fs::read(&p).unwrap_or_else(|e| panic!("{p:?}: {e}")),
                )
            };
            out.push(Node {
                path: p.strip_prefix(root).unwrap().display().to_string(),
                kind,
                mode: m.mode(),
                size: m.size(),
                mtime: (m.mtime(), m.mtime_nsec()),
                content,
            });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// What the writer's kernel still caches (write-back data, times) goes to
/// ramd, so that the next save holds what a client of the writer sees.
fn sync_mount(dir: &Path) {
    let f = fs::File::open(dir).unwrap();
    // SAFETY: syncfs(2) on an fd we hold.
    let r = unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&f)) };
    assert_eq!(r, 0, "syncfs {dir:?}: {}", std::io::Error::last_os_error());
}

/// Saves the writer's tree (after a syncfs) and waits until the standby
/// applied that save; runs `check` (before anything lists a directory,
/// which would refresh what the kernel caches); then both mounts show the
/// same tree.
fn save_and_follow(
    writer: &FsDisk,
    standby: &FsDisk,
    env: &[(String, String)],
    full: bool,
    check: impl FnOnce(),
) {
    sync_mount(writer.path());
    let mut args = vec!["snapshot", writer.name(), "--json"];
    if full {
        args.push("--full");
    }
    let out = ramd(writer.run_dir(), &args, env).ok();
    let s: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(s["full"], full, "{s}");
    let seq = field(&s, "seq");
    wait_until(
        Duration::from_secs(60),
        &format!("the standby to apply save {seq}"),
        || {
            let sb = standby.status()["standby"].clone();
            sb["applied_seq"] == seq && sb["saves_behind"] == 0 && sb["error"].is_null()
        },
    );
    check();
    let (a, b) = (tree_of(writer.path()), tree_of(standby.path()));
    if a != b {
        let diff: Vec<_> = a
            .iter()
            .zip(b.iter())
            .filter(|(x, y)| x != y)
            .take(3)
            .collect();
        panic!(
            "after save {seq} the standby's tree differs from the writer's ({} vs {} nodes): \
             {diff:#?}",
            a.len(),
            b.len()
        );
    }
}

/// `mount(2)` `MS_REMOUNT` of `dir`, read-only or not, as mount(8) does
/// when no helper is installed.
fn remount(dir: &Path, ro: bool) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    let flags = libc::MS_REMOUNT | if ro { libc::MS_RDONLY } else { 0 };
    // SAFETY: mount(2) with a NUL-terminated path we own, no data.
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            c.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "remount {dir:?}: {}", std::io::Error::last_os_error());
}

fn errno_of(r: std::io::Result<impl std::fmt::Debug>) -> i32 {
    r.expect_err("succeeded").raw_os_error().unwrap_or(-1)
}

/// A filesystem standby (`--standby --mount`), its writer on `data_path`:
/// mounted read-only, it follows the saves of files created, rewritten,
/// renamed and deleted (the tree, contents, modes, sizes and mtimes equal
/// the writer's after each), also through file descriptors and names the
/// kernel cached before the save: an open file reads its new content, a
/// name looked up as missing appears, and an open file the writer deleted
/// answers ENOENT. Promoted, its mount turns read-write: with `--force`
/// while the writer lives (whose next save is then refused), or once the
/// lease of a killed writer ran out (a new writer is then refused); the
/// image loads as the promoted disk.
fn fs_standby_follows_and_is_promoted(data_path: &str, writer_dies: bool) {
    use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
    let w = Weed::start();
    let mut env = w.env();
    env.push(("RAMD_LEASE_SECS".into(), "3".into()));
    let img = url(&format!("fs-standby-{data_path}"));
    let writer = FsDisk::mount_with_env(
        &["--size", "64M", "--image", &img, "--data-path", data_path],
        &pairs(&env),
    );
    fs::create_dir_all(writer.join("a/b")).unwrap();
    fs::write(writer.join("a/b/keep.txt"), b"first version\n").unwrap();
    fs::write(writer.join("doomed.txt"), vec![7u8; 100_000]).unwrap();
    fs::write(writer.join("moving.txt"), b"moves\n").unwrap();
    random_file(&writer.join("a/big"), 5 * MIB);
    std::os::unix::fs::symlink("a/b/keep.txt", writer.join("link")).unwrap();
    sync_mount(writer.path());
    let first = snapshot(writer.run_dir(), writer.name(), &env);
    assert_eq!(first["seq"], 1, "{first}");

    let standby = FsDisk::mount_with_env(
        &["--image", &img, "--standby", "--standby-poll", "200ms"],
        &pairs(&env),
    );
    let st = standby.status();
    assert_eq!(st["read_only"], true, "{st}");
    assert_eq!(st["data_path"], "store", "{st}");
    assert_eq!(
        st["id"],
        writer.status()["id"],
        "the standby is another disk"
    );
    assert_eq!(tree_of(writer.path()), tree_of(standby.path()));
    // Read-only as a read-only mount is, for every kind of change.
    assert_eq!(errno_of(fs::write(standby.join("new"), b"x")), libc::EROFS);
    assert_eq!(errno_of(fs::remove_file(standby.join("link"))), libc::EROFS);
    assert_eq!(
        errno_of(fs::set_permissions(
            standby.join("doomed.txt"),
            fs::Permissions::from_mode(0o600)
        )),
        libc::EROFS
    );

    // The mount helper's remount asks the disk first: rw is refused.
    let ctl = standby.run_dir().join(format!("{}.ctl", standby.name()));
    let err = ramd_daemon::control::request(&ctl, "remount rw", Some(CMD_TIMEOUT))
        .expect_err("a standby remounted rw");
    assert!(err.to_string().contains("is a standby"), "{err:#}");
    ramd_daemon::control::request(&ctl, "remount ro", Some(CMD_TIMEOUT)).unwrap();
    // Made read-write behind ramd's back (mount(2) as mount(8) without
    // the helper): ramd still refuses every change.
    remount(standby.path(), false);
    assert_eq!(errno_of(fs::write(standby.join("new"), b"x")), libc::EROFS);
    assert_eq!(
        errno_of(
            fs::OpenOptions::new()
                .write(true)
                .open(standby.join("doomed.txt"))
        ),
        libc::EROFS
    );
    assert_eq!(errno_of(fs::create_dir(standby.join("nd"))), libc::EROFS);
    assert_eq!(
        errno_of(fs::rename(standby.join("link"), standby.join("l2"))),
        libc::EROFS
    );
    assert_eq!(
        errno_of(fs::set_permissions(
            standby.join("doomed.txt"),
            fs::Permissions::from_mode(0o600)
        )),
        libc::EROFS
    );
    remount(standby.path(), true);
    assert_eq!(tree_of(writer.path()), tree_of(standby.path()));

    // What the kernel caches on the standby before the next save: open
    // files and their pages, attributes, names and a name's absence.
    let keep = fs::File::open(standby.join("a/b/keep.txt")).unwrap();
    let mut buf = [0u8; 64];
    let n = keep.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[..n], b"first version\n");
    let doomed = fs::File::open(standby.join("doomed.txt")).unwrap();
    assert_eq!(doomed.read_at(&mut buf, 0).unwrap(), 64);
    assert!(!standby.join("a/fresh.txt").exists());
    assert!(standby.join("moving.txt").exists());
    let big_mode = || {
        fs::metadata(standby.join("a/big"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(big_mode(), 0o644);

    // Rewritten in place, created, renamed, deleted, chmod, a new mtime.
    fs::write(writer.join("a/b/keep.txt"), b"second version, longer\n").unwrap();
    fs::write(writer.join("a/fresh.txt"), b"fresh\n").unwrap();
    fs::hard_link(writer.join("a/fresh.txt"), writer.join("hard.txt")).unwrap();
    fs::rename(writer.join("moving.txt"), writer.join("a/b/moved.txt")).unwrap();
    fs::remove_file(writer.join("doomed.txt")).unwrap();
    fs::set_permissions(writer.join("a/big"), fs::Permissions::from_mode(0o640)).unwrap();
    fs::File::options()
        .write(true)
        .open(writer.join("a/big"))
        .unwrap()
        .write_all_at(&[0xAB; 8192], MIB)
        .unwrap();
    save_and_follow(&writer, &standby, &env, false, || {
        let n = keep.read_at(&mut buf, 0).unwrap();
        assert_eq!(
            &buf[..n],
            b"second version, longer\n",
            "a file open across the apply reads the new save"
        );
        assert_eq!(
            fs::metadata(standby.join("a/b/keep.txt")).unwrap().len(),
            23,
            "the size the kernel cached"
        );
        assert_eq!(big_mode(), 0o640, "the mode the kernel cached");
        assert_eq!(
            errno_of(doomed.read_at(&mut buf, 0)),
            libc::ENOENT,
            "an open file its writer deleted"
        );
        assert_eq!(fs::read(standby.join("a/fresh.txt")).unwrap(), b"fresh\n");
        let (f, h) = (
            fs::metadata(standby.join("a/fresh.txt")).unwrap(),
            fs::metadata(standby.join("hard.txt")).unwrap(),
        );
        assert!(f.ino() == h.ino() && f.nlink() == 2, "a hard link");
        assert!(!standby.join("moving.txt").exists());
        assert!(standby.join("a/b/moved.txt").exists());
    });
    drop(doomed);

    // A directory renamed and another removed with its files; then a full
    // save, which starts a new chain.
    fs::rename(writer.join("a/b"), writer.join("c")).unwrap();
    fs::create_dir(writer.join("gone")).unwrap();
    fs::write(writer.join("gone/x"), b"x").unwrap();
    save_and_follow(&writer, &standby, &env, false, || {
        assert!(!standby.join("a/b").exists());
        assert_eq!(fs::read(standby.join("c/moved.txt")).unwrap(), b"moves\n");
        assert_eq!(fs::read(standby.join("gone/x")).unwrap(), b"x");
    });
    fs::remove_dir_all(writer.join("gone")).unwrap();
    fs::write(writer.join("c/keep.txt"), b"third\n").unwrap();
    save_and_follow(&writer, &standby, &env, true, || {
        let n = keep.read_at(&mut buf, 0).unwrap();
        assert_eq!(
            &buf[..n],
            b"third\n",
            "the open file after a renamed directory"
        );
        assert!(!standby.join("gone").exists());
    });
    drop(keep);

    // Killed, the writer leaves its lease to run out, which promote waits
    // for; alive, --force takes its lease over. Either way the mount turns
    // read-write.
    let mut writer = writer;
    let out = if writer_dies {
        writer.kill();
        promote(standby.run_dir(), standby.name(), &["--wait", "60s"], &env).ok()
    } else {
        promote(standby.run_dir(), standby.name(), &["--force"], &env).ok()
    };
    assert!(out.contains("promoted"), "{out}");
    let st = standby.status();
    assert_eq!(st["read_only"], false, "{st}");
    assert!(st["standby"].is_null(), "{st}");
    fs::write(
        standby.join("c/after.txt"),
        b"written after the promotion\n",
    )
    .unwrap();
    fs::remove_file(standby.join("a/fresh.txt")).unwrap();
    sync_mount(standby.path());
    let saved = snapshot(standby.run_dir(), standby.name(), &env);
    assert_eq!(saved["full"], false, "{saved}");
    if writer_dies {
        // A new writer of the prefix is refused: the promoted disk holds
        // the lease.
        let tmp = scratch();
        let dir = tmp.path().join("mnt");
        fs::create_dir(&dir).unwrap();
        let f = FsDisk::mount_at_env(&dir, &["--image", &img], &pairs(&env))
            .err()
            .expect("a second writer started");
        assert!(f.stderr.contains("is in use"), "{}", f.stderr);
    } else {
        fs::write(writer.join("late.txt"), b"too late\n").unwrap();
        let out = ramd(writer.run_dir(), &["snapshot", writer.name()], &env).failed();
        assert!(
            out.stderr.contains("another writer committed")
                || out.stderr.contains("lost the lease"),
            "{}",
            out.stderr
        );
        // Its stop would hold its unsaved data; it is given up here.
        writer.kill();
    }
    let promoted = tree_of(standby.path());
    drop(standby);

    let fresh = FsDisk::mount_with_env(&["--image", &img], &pairs(&env));
    assert_eq!(
        tree_of(fresh.path()),
        promoted,
        "the image differs from the promoted disk"
    );
}

#[test]
fn fs_standby_follows_a_store_path_writer() {
    fs_standby_follows_and_is_promoted("store", false);
}

#[test]
fn fs_standby_follows_a_kernel_path_writer() {
    fs_standby_follows_and_is_promoted("kernel", true);
}
