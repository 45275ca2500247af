//! `ramd`: the daemon and its commands. Storage lives in `ramd-store`, the
//! protocols in `ramd-nbd` and `ramd-fs`; this binary parses the command
//! line, sets up resources before the first client, and reports status.

mod cli;
mod config;
mod control;
mod image_cmd;
mod units;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::{json, Value};

use cli::{Cli, Command, DiskSize, Listen, ServeArgs};
use ramd_fs::{Fs, FsConfig, FuseOptions};
use ramd_nbd::{Export, Exports, Listener, Server, ServerConfig};
use ramd_store::persist::{self, DiskKind, ImageDir, PersistStatus, Persister};
use ramd_store::{Scanner, Store, StoreConfig, PAGE_SIZE};
use units::human;

fn main() {
    // fuser's session warns when it finds its mount already gone at exit,
    // which is how every clean stop ends: keep that one module quiet.
    env_logger::Builder::from_env(
        env_logger::Env::new().filter_or("RAMD_LOG", "info,fuser::session=error"),
    )
    .format_target(false)
    .init();
    let mut cli = Cli::parse();
    if let Command::Serve(ServeArgs {
        config: Some(path),
        disk,
        ..
    }) = &cli.command
    {
        // The file's flags go before the command line's, which then win.
        match config::disk_flags(path, disk.as_deref()) {
            Ok(flags) => {
                cli = Cli::parse_from(config::splice(std::env::args_os().collect(), flags))
            }
            Err(e) => {
                eprintln!("ramd: error: {e:#}");
                std::process::exit(2);
            }
        }
    }
    let run_dir = cli.run_dir.clone().unwrap_or_else(default_run_dir);
    let result = match cli.command {
        Command::Serve(args) if args.mount.is_some() => serve_fs(args, &run_dir),
        Command::Serve(args) => serve_block(args, &run_dir),
        Command::Status(args) => control::status(&run_dir, args.name.as_deref(), args.json),
        Command::Snapshot(a) => control::snapshot(&run_dir, &a.name, a.full, a.json),
        Command::Image(cmd) => image_cmd::run(cmd),
    };
    if let Err(e) = result {
        eprintln!("ramd: error: {e:#}");
        std::process::exit(1);
    }
}

/// /run/ramd for root; otherwise the user's runtime dir.
fn default_run_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run/ramd");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => PathBuf::from(d).join("ramd"),
        None => PathBuf::from(format!("/tmp/ramd-{uid}")),
    }
}

fn make_run_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating run directory {}", dir.display()))
}

/// Runs `stop(n)` on the n-th SIGINT or SIGTERM (n = 1, 2, ...).
fn on_stop_signals(mut stop: impl FnMut(u32) + Send + 'static) -> Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("installing signal handlers")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for (n, sig) in (1..).zip(signals.forever()) {
                log::info!("signal {sig}: stopping");
                stop(n);
            }
        })?;
    Ok(())
}

fn disk_size(args: &ServeArgs) -> Result<DiskSize> {
    args.size.with_context(|| {
        format!(
            "disk {:?} needs a size: give --size SIZE (or `size = \"SIZE\"` in its config table)",
            args.name
        )
    })
}

/// The store settings every kind of disk takes from the command line.
fn store_config(args: &ServeArgs, size: u64) -> StoreConfig {
    StoreConfig {
        warm_pool: args.warm_pool,
        track_changes: args.image.is_some(),
        compress: args.compress,
        compress_after: args.compress_after,
        recompress: args.recompress,
        idle_after: args.idle_after,
        ..StoreConfig::new(size)
    }
}

/// Background compression and compaction, if the disk compresses; it runs
/// until the returned handle is dropped.
fn start_scanner(store: &Arc<Store>, args: &ServeArgs) -> Result<Option<Scanner>> {
    if !args.compress.is_none() || !args.recompress.is_none() {
        log::info!(
            "compression {} ({}), pages idle {:?} {}, {} background thread(s)",
            args.compress,
            if args.compress_after.is_zero() {
                "as pages are written".to_string()
            } else {
                format!("once untouched {:?}", args.compress_after)
            },
            args.idle_after,
            if args.recompress.is_none() {
                "are kept as they are".to_string()
            } else {
                format!("are re-packed with {}", args.recompress)
            },
            args.compress_threads
        );
    }
    Scanner::start(store.clone(), args.compress_threads as usize)
        .context("starting the background compression threads")
}

/// Checks the persistence flags, and opens and checks the image if there is
/// one: returns it with the disk's size (the image's, unless new).
fn open_image(
    args: &ServeArgs,
    kind: DiskKind,
    size: Option<u64>,
) -> Result<Option<(ImageDir, u64)>> {
    if args.autosave.is_some_and(|d| d.is_zero()) {
        bail!("--autosave must be longer than 0s");
    }
    let Some(dir) = &args.image else {
        if args.flush == "persist" {
            bail!("--flush persist needs --image DIR: a flush has nowhere to persist to");
        }
        return Ok(None);
    };
    Ok(Some(persist::open_image(dir, kind, size)?))
}

/// Sets up saving: the save thread and, with --flush persist, the store's
/// flush hook. `meta` serializes a filesystem's tree.
fn start_persister(
    args: &ServeArgs,
    store: &Arc<Store>,
    image: ImageDir,
    kind: DiskKind,
    size: u64,
    meta: Option<(persist::MetaFn, Option<Vec<u8>>)>,
) -> Result<(Arc<Persister>, Option<std::thread::JoinHandle<()>>)> {
    let mut p = Persister::new(
        store.clone(),
        image,
        kind,
        size,
        args.autosave,
        args.flush == "persist",
    );
    if let Some((meta, loaded)) = meta {
        p.set_meta(meta, loaded.as_deref());
    }
    let p = Arc::new(p);
    if args.flush == "persist" {
        // Weak: the store must not keep its own persister alive.
        let weak = Arc::downgrade(&p);
        store.set_flush_hook(Box::new(move || match weak.upgrade() {
            Some(p) => p.flush(),
            None => Ok(()),
        }));
    }
    let thread = p.start().context("starting the save thread")?;
    Ok((p, thread))
}

/// A disk's persister and its save thread, if it has an image.
type Saving = Option<(Arc<Persister>, Option<std::thread::JoinHandle<()>>)>;

/// The disk's control socket, `RUN_DIR/NAME.ctl`.
fn start_control(
    run_dir: &Path,
    name: &str,
    status: control::StatusFn,
    persister: &Saving,
) -> Result<control::ControlServer> {
    control::ControlServer::start(
        run_dir.join(format!("{name}.ctl")),
        control::Handlers {
            status,
            snapshot: snapshot_fn(persister),
        },
    )
}

/// The clean stop's save; an error is reported but the old image stays.
fn final_save(persister: Saving) -> Result<()> {
    let Some((p, thread)) = persister else {
        return Ok(());
    };
    p.stop(thread);
    let saved = p.save(false);
    p.close();
    saved
        .map(|_| ())
        .context("saving at stop (the image keeps its previous save)")
}

fn snapshot_fn(p: &Saving) -> Option<control::SnapshotFn> {
    let (p, _) = p.as_ref()?;
    let p = p.clone();
    Some(Arc::new(move |full| {
        p.save(full)
            .map(|r| {
                let mut v = serde_json::to_value(r).expect("report serializes");
                v["path"] = p.status().image.into();
                v
            })
            .map_err(|e| format!("{e:#}"))
    }))
}

fn persist_status(p: &Saving) -> Value {
    let status = p
        .as_ref()
        .map_or_else(PersistStatus::none, |(p, _)| p.status());
    serde_json::to_value(status).expect("status serializes")
}

/// The status row of a disk: the store's figures plus `extra`.
fn status_row(store: &Store, extra: Value) -> Value {
    let mut v = serde_json::to_value(store.stats()).expect("stats serialize");
    let obj = v.as_object_mut().expect("stats are an object");
    obj.extend(extra.as_object().expect("extra is an object").clone());
    obj.insert("pid".into(), std::process::id().into());
    v
}

fn serve_block(args: ServeArgs, run_dir: &Path) -> Result<()> {
    let size = match args.size {
        Some(DiskSize::Unlimited) => bail!(
            "a block disk needs a size in bytes: `unlimited` is for filesystem disks (--mount)"
        ),
        Some(DiskSize::Bytes(n)) => Some(n),
        None => None,
    };
    let image = open_image(&args, DiskKind::Block, size)?;
    let size = match &image {
        Some((_, n)) => *n,
        None => match disk_size(&args)? {
            DiskSize::Bytes(n) => n,
            DiskSize::Unlimited => unreachable!("refused above"),
        },
    };
    // Everything that can fail is set up before the first client is accepted.
    make_run_dir(run_dir)?;
    // An image may hold compressed pages whatever --compress says now:
    // leave room for their allocator's slack, as a compressed disk does.
    let loading = image.as_ref().is_some_and(|(i, _)| i.manifest().is_some());
    let max_memory = args
        .max_memory
        .or(loading.then(|| ramd_store::default_max_memory(size, true)));
    let store = Arc::new(
        Store::new(StoreConfig {
            max_memory,
            ..store_config(&args, size)
        })
        .with_context(|| format!("disk {:?}", args.name))?,
    );
    let persister = match image {
        Some((image, size)) => {
            if image.manifest().is_some() {
                persist::load(&image, &store)?;
            }
            Some(start_persister(
                &args,
                &store,
                image,
                DiskKind::Block,
                size,
                None,
            )?)
        }
        None => None,
    };
    warn_if_overcommitted(&store);
    let _scanner = start_scanner(&store, &args)?;

    let listener = match &args.listen {
        None => Listener::bind_unix(run_dir.join(format!("{}.sock", args.name))),
        Some(Listen::Unix(p)) => Listener::bind_unix(p.clone()),
        Some(Listen::Tcp(a)) => Listener::bind_tcp(*a),
    }
    .context("NBD listen socket")?;
    let uri = listener.uri(&args.name);

    let server = Server::new(
        Exports::new(vec![Export {
            name: args.name.clone(),
            description: format!("ramd block disk {}", args.name),
            store: store.clone(),
            read_only: args.read_only,
        }]),
        ServerConfig {
            threads: args.threads as usize,
            max_connections: args.max_connections as usize,
            ..ServerConfig::default()
        },
    );

    let status_fn: control::StatusFn = {
        let (server, store, name, uri) = (
            server.clone(),
            store.clone(),
            args.name.clone(),
            uri.clone(),
        );
        let read_only = args.read_only;
        let persister = persister.as_ref().map(|(p, _)| (p.clone(), None));
        Arc::new(move || {
            let mut extra = json!({
                "name": name, "kind": "block", "uri": uri, "read_only": read_only,
                "connections": server.connections(),
            });
            extend(&mut extra, persist_status(&persister));
            vec![status_row(&store, extra)]
        })
    };
    let _control = start_control(run_dir, &args.name, status_fn, &persister)?;
    {
        let server = server.clone();
        on_stop_signals(move |_| server.stop())?;
    }

    log::info!(
        "block disk {:?}: size {} ({} bytes), max memory {}{}",
        args.name,
        human(store.size()),
        store.size(),
        human(store.max_memory()),
        if args.read_only { ", read-only" } else { "" }
    );
    // The URI alone on stdout: scripts wait for this line, then connect.
    println!("{uri}");

    server.run(&listener).context("serving NBD")?;
    final_save(persister)?;
    log::info!("stopped");
    Ok(())
}

fn extend(obj: &mut Value, more: Value) {
    if let (Some(o), Value::Object(m)) = (obj.as_object_mut(), more) {
        o.extend(m);
    }
}

/// Checks a mount point before anything is allocated.
fn check_mount_point(dir: &Path) -> Result<PathBuf> {
    let meta = std::fs::metadata(dir).with_context(|| format!("mount point {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("mount point {} is not a directory", dir.display());
    }
    if ramd_fs::is_mount_point(dir) {
        bail!(
            "mount point {} is busy: something is already mounted there (umount it first)",
            dir.display()
        );
    }
    dir.canonicalize()
        .with_context(|| format!("mount point {}", dir.display()))
}

fn serve_fs(args: ServeArgs, run_dir: &Path) -> Result<()> {
    let dir = check_mount_point(args.mount.as_deref().expect("serve_fs needs --mount"))?;
    make_run_dir(run_dir)?;
    let mem_total = ramd_store::mem_total().unwrap_or(1 << 30);
    // An image records an unlimited fs disk's size as 0.
    let given = args.size.map(|s| match s {
        DiskSize::Bytes(n) => n,
        DiskSize::Unlimited => 0,
    });
    let image = open_image(&args, DiskKind::Fs, given)?;
    let size = match &image {
        Some((_, 0)) => None,
        Some((_, n)) => Some(*n),
        None => match disk_size(&args)? {
            DiskSize::Bytes(n) => Some(n),
            DiskSize::Unlimited => None,
        },
    };
    // Default budget: every page of `size`, plus room for the page tables
    // of many small files and for inodes and names (1/8 of size, ≥ 64 MiB).
    // ramfs mode: the host's memory, still guarded by the host reserve.
    let loading = image.as_ref().is_some_and(|(i, _)| i.manifest().is_some());
    let compressed = !args.compress.is_none() || !args.recompress.is_none() || loading;
    let max_memory = args.max_memory.unwrap_or(match size {
        Some(n) => {
            ramd_store::default_max_memory(n, compressed).saturating_add((n / 8).max(64 << 20))
        }
        None => mem_total,
    });
    let nr_inodes = args.nr_inodes.unwrap_or(mem_total / PAGE_SIZE as u64 / 2);
    let store = Arc::new(
        Store::new(StoreConfig {
            max_memory: Some(max_memory),
            page_limit: size.map(|n| n.div_ceil(PAGE_SIZE as u64)),
            ..store_config(&args, ramd_store::MAX_SIZE)
        })
        .with_context(|| format!("disk {:?}", args.name))?,
    );
    let fs_config = FsConfig {
        size,
        nr_inodes,
        mode: args.mode,
        uid: args.uid,
        gid: args.gid,
        noatime: args.noatime,
    };
    let (fs, image, loaded) = match image {
        Some((image, _)) if image.manifest().is_some() => {
            let meta = persist::load(&image, &store)?.expect("fs images have a tree");
            let fs = Fs::load(store.clone(), fs_config, &meta).map_err(|e| {
                anyhow::anyhow!("loading image {}: the tree: {e}", image.path().display())
            })?;
            (fs, Some(image), Some(meta))
        }
        image => (
            Fs::new(store.clone(), fs_config)
                .map_err(|e| anyhow::anyhow!("creating the filesystem: errno {}", e.get()))?,
            image.map(|(i, _)| i),
            None,
        ),
    };
    let fs = Arc::new(fs);
    let persister = match image {
        Some(image) => {
            let f = fs.clone();
            let meta: persist::MetaFn = Box::new(move || f.save_meta());
            Some(start_persister(
                &args,
                &store,
                image,
                DiskKind::Fs,
                size.unwrap_or(0),
                Some((meta, loaded)),
            )?)
        }
        None => None,
    };
    warn_if_overcommitted(&store);
    let _scanner = start_scanner(&store, &args)?;
    let status_fn: control::StatusFn = {
        let (fs, store, name) = (fs.clone(), store.clone(), args.name.clone());
        let mount = dir.display().to_string();
        let persister = persister.as_ref().map(|(p, _)| (p.clone(), None));
        Arc::new(move || {
            let mut extra = json!({ "name": name, "kind": "fs", "mount": mount, "uri": mount });
            extend(&mut extra, persist_status(&persister));
            let mut row = status_row(&store, extra);
            let obj = row.as_object_mut().expect("object");
            // A filesystem's size is its capacity, not the store's address space.
            let (used, limit) = store.pages_used();
            obj.insert("size".into(), size.unwrap_or(0).into());
            obj.insert("unlimited".into(), size.is_none().into());
            obj.insert("used_bytes".into(), (used * PAGE_SIZE as u64).into());
            obj.insert("page_limit".into(), limit.into());
            let fs_stats = serde_json::to_value(fs.stats()).expect("stats serialize");
            obj.extend(fs_stats.as_object().expect("object").clone());
            vec![row]
        })
    };
    // The control socket first: a name already in use fails before mounting.
    let _control = start_control(run_dir, &args.name, status_fn, &persister)?;
    let sync: Option<ramd_fs::fuse::SyncFn> = (args.flush == "persist").then(|| {
        let store = store.clone();
        let f: ramd_fs::fuse::SyncFn = Arc::new(move || store.flush().map_err(|e| e.errno()));
        f
    });
    let session = ramd_fs::mount(
        fs.clone(),
        &dir,
        args.threads as usize,
        FuseOptions {
            writeback_cache: args.writeback_cache,
            sync,
        },
    )
    .with_context(|| format!("mounting {}", dir.display()))?;
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        // The FUSE connection's number in fusectl is the mount's device
        // minor. (Not from stat(2): the session is not serving yet.)
        let conn = ramd_fs::mount_device(&dir)
            .map(|(_, minor)| minor)
            .with_context(|| format!("{} is not in mountinfo after mounting", dir.display()))?;
        let dir = dir.clone();
        let stopping = stopping.clone();
        on_stop_signals(move |n| {
            stopping.store(true, std::sync::atomic::Ordering::SeqCst);
            if n == 1 {
                stop_mount(&dir)
            } else {
                abort_fuse_connection(conn)
            }
        })?;
    }

    log::info!(
        "filesystem disk {:?} at {}: size {}, max memory {}, {} inodes",
        args.name,
        dir.display(),
        size.map_or("unlimited".into(), human),
        human(max_memory),
        nr_inodes
    );
    println!("{}", dir.display());

    match session.run() {
        // A detached mount ends with the connection aborted by the kernel
        // once its last file closes (or by us on a second signal).
        Err(e)
            if e.raw_os_error() == Some(libc::ECONNABORTED)
                && stopping.load(std::sync::atomic::Ordering::SeqCst) => {}
        r => r.context("serving FUSE")?,
    }
    final_save(persister)?;
    log::info!("unmounted; stopped");
    Ok(())
}

/// Unmounts `dir`; if files are still open there, detaches it (it vanishes
/// from the namespace now, and ramd exits once the last file is closed).
fn stop_mount(dir: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: umount2 takes a NUL-terminated path we own.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        return;
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EBUSY) {
        log::warn!("unmounting {}: {e}", dir.display());
        return;
    }
    // SAFETY: as above.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        log::warn!(
            "{} is busy: detached; ramd stops when its last open file is closed \
             (signal again to stop now and fail those files' I/O)",
            dir.display()
        );
    } else {
        let e = std::io::Error::last_os_error();
        log::warn!("detaching {}: {e}", dir.display());
    }
}

/// Ends a FUSE connection through fusectl: pending and future requests of
/// open files fail, and the session returns.
fn abort_fuse_connection(conn: u32) {
    let base = Path::new("/sys/fs/fuse/connections");
    let abort = base.join(conn.to_string()).join("abort");
    if !abort.exists() {
        // fusectl is usually mounted by systemd; mount it if it is not.
        let _ = std::process::Command::new("mount")
            .args(["-t", "fusectl", "fusectl"])
            .arg(base)
            .status();
    }
    match std::fs::write(&abort, "1") {
        Ok(()) => log::warn!("aborted FUSE connection {conn}: open files get ENOTCONN"),
        Err(e) => log::warn!("aborting FUSE connection via {}: {e}", abort.display()),
    }
}

/// A sparse disk may promise more than the host has (as tmpfs may); say so.
fn warn_if_overcommitted(store: &Store) {
    if let Some(avail) = ramd_store::mem_available() {
        if store.max_memory() > avail {
            log::warn!(
                "max memory {} exceeds the host's available memory {}: writes will get \
                 ENOSPC once the host is down to its reserve of {}",
                human(store.max_memory()),
                human(avail),
                human(ramd_store::default_host_reserve())
            );
        }
    }
}
