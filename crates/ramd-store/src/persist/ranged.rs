//! Reading an object from object storage: `Remote::reader`, and
//! `ObjectReader`, which keeps ranged GETs in flight ahead of the parser
//! and hands their bytes over in order.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::sync::mpsc;

use futures::StreamExt;
use object_store::{GetOptions, GetRange};

use crate::error::Result;

use super::reader::Pieces;
use super::remote::{block_on, runtime, Remote};

impl Remote {
    /// Reads object `name`, which the MANIFEST says is `expect` bytes, from
    /// start to end ahead of the caller; returns the reader and the
    /// object's length (the server's: a different one is the parser's to
    /// report). Up to `RANGE` bytes are one GET; a larger object is read as
    /// `RANGE`-byte ranged GETs, `RANGES_IN_FLIGHT` at once, handed over in
    /// order (`ObjectReader`). One HTTP stream is what a load from a server
    /// on the same host is bound by (its sender, not ramd's parser), so
    /// several make it faster; on a real S3 they hide each request's
    /// latency too.
    pub(super) fn reader(&self, name: &str, expect: u64) -> Result<(ObjectReader, u64)> {
        let key = self.key(name);
        let first = |ranged: bool| {
            let opts = GetOptions {
                range: ranged.then_some(GetRange::Bounded(0..RANGE)),
                ..GetOptions::default()
            };
            block_on(self.store().get_opts(&key, opts))
        };
        let got = match first(expect > RANGE) {
            // An empty object has no first range (416): one plain GET,
            // and the parser says how short it is.
            Err(e) if expect > RANGE && is_bad_range(&e) => first(false),
            got => got,
        }
        .map_err(|e| self.error(name, e))?;
        let len = got.meta.size;
        let mut r = ObjectReader {
            me: self.clone_handle(),
            name: name.to_string(),
            len,
            e_tag: got.meta.e_tag.clone(),
            next: got.range.end,
            parts: VecDeque::new(),
            cur: bytes::Bytes::new(),
            failed: None,
        };
        let range = got.range.clone();
        let (tx, chunks) = mpsc::channel();
        let task = runtime().spawn(stream_part(got.into_stream(), tx));
        r.parts.push_back(Part {
            range,
            got: 0,
            chunks,
            task,
        });
        r.fill();
        Ok((r, len))
    }
}

/// What a ranged read of a large object asks for in one GET, and how many
/// such GETs are in flight at once: the reader holds at most
/// `RANGES_IN_FLIGHT * RANGE` bytes (96 MiB) ahead of the parser. Against
/// SeaweedFS on the same host, 8 MiB ranges cost the server enough per
/// request to lose to rclone's four long ones; 16 MiB × 6 (or 24 × 4,
/// 32 × 4) drew level with it (BENCHMARKS.md).
const RANGE: u64 = 16 << 20;
const RANGES_IN_FLIGHT: usize = 6;

/// Whether a ranged GET was refused for its range (an empty object).
fn is_bad_range(e: &object_store::Error) -> bool {
    let text = e.to_string();
    text.contains("<Code>InvalidRange</Code>") || text.contains("status code: 416")
}

/// Hands the body of one GET to the reader chunk by chunk as it arrives;
/// its first error ends it. The channel is unbounded: one part's bytes,
/// at most `RANGE`, wait in it.
async fn stream_part(
    mut body: futures::stream::BoxStream<'static, object_store::Result<bytes::Bytes>>,
    tx: mpsc::Sender<object_store::Result<bytes::Bytes>>,
) {
    while let Some(chunk) = body.next().await {
        let failed = chunk.is_err();
        if tx.send(chunk).is_err() || failed {
            return; // the reader is gone, or learns why
        }
    }
}

/// An object's bytes, in order, fetched as ranges some way ahead
/// (`Remote::reader`): each part is one GET whose body a task on the
/// runtime streams into the part's channel; the reader takes the oldest
/// part's chunks as they come and, once it is whole, starts the next
/// range. Every range after the first must be of the same version of the
/// object (`If-Match` its first e-tag, and the same length): a segment
/// rewritten between two ranges fails the read rather than mixing two.
/// The client library retries each GET (and a body cut short, from where
/// it stopped) as it retries every request (`Remote::connect`).
pub(super) struct ObjectReader {
    me: Remote,
    name: String,
    len: u64,
    e_tag: Option<String>,
    /// Where the next range to request starts.
    next: u64,
    /// The ranges requested and not yet read whole, oldest first.
    parts: VecDeque<Part>,
    /// What `Read` has not handed over yet of the chunk it took last.
    cur: bytes::Bytes,
    /// The first failure, returned again to any later read.
    failed: Option<String>,
}

/// One ranged GET in flight or done.
struct Part {
    range: std::ops::Range<u64>,
    /// Bytes of it the reader has taken.
    got: u64,
    chunks: mpsc::Receiver<object_store::Result<bytes::Bytes>>,
    task: tokio::task::JoinHandle<()>,
}

impl ObjectReader {
    /// Requests ranges until `RANGES_IN_FLIGHT` are in flight or the
    /// object is all requested.
    fn fill(&mut self) {
        while self.parts.len() < RANGES_IN_FLIGHT && self.next < self.len {
            let range = self.next..(self.next + RANGE).min(self.len);
            self.next = range.end;
            let (tx, chunks) = mpsc::channel();
            let (store, key) = (self.me.store().clone(), self.me.key(&self.name));
            let (len, e_tag, want) = (self.len, self.e_tag.clone(), range.clone());
            let task = runtime().spawn(async move {
                let opts = GetOptions {
                    range: Some(GetRange::Bounded(want.clone())),
                    if_match: e_tag.clone(),
                    ..GetOptions::default()
                };
                let got = match store.get_opts(&key, opts).await {
                    Ok(got) => got,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                // A server that ignores If-Match still names the version
                // it sent.
                if got.meta.size != len || (e_tag.is_some() && got.meta.e_tag != e_tag) {
                    let _ = tx.send(Err(object_store::Error::Precondition {
                        path: key.to_string(),
                        source: format!(
                            "now {} bytes, e-tag {:?}",
                            got.meta.size,
                            got.meta.e_tag.as_deref().unwrap_or("none")
                        )
                        .into(),
                    }));
                    return;
                }
                stream_part(got.into_stream(), tx).await
            });
            self.parts.push_back(Part {
                range,
                got: 0,
                chunks,
                task,
            });
        }
    }

    /// A failure of range `range`: what went wrong, naming the bytes
    /// (the parser names the object).
    fn fail(&mut self, range: &std::ops::Range<u64>, why: String) -> io::Error {
        let text = format!(
            "bytes {}..{} of {}: {why}",
            range.start, range.end, self.len
        );
        self.failed = Some(text.clone());
        for p in self.parts.drain(..) {
            p.task.abort();
        }
        io::Error::other(text)
    }
}

impl ObjectReader {
    /// The next chunk of the object as the server sent it; `None` at the
    /// end.
    fn next_chunk(&mut self) -> io::Result<Option<bytes::Bytes>> {
        loop {
            if let Some(why) = &self.failed {
                return Err(io::Error::other(why.clone()));
            }
            let Some(p) = self.parts.front_mut() else {
                return Ok(None); // the end of the object
            };
            let want = p.range.end - p.range.start;
            match p.chunks.recv() {
                Ok(Ok(b)) if p.got + b.len() as u64 <= want => {
                    p.got += b.len() as u64;
                    return Ok(Some(b));
                }
                Ok(Ok(_)) => {
                    let range = p.range.clone();
                    return Err(self.fail(&range, "the server sent more than asked".into()));
                }
                Ok(Err(object_store::Error::Precondition { .. })) => {
                    let range = p.range.clone();
                    let why = format!(
                        "the object changed while it was being read (its first bytes were \
                         e-tag {}): it was rewritten since the MANIFEST named it, so nothing \
                         of it is used",
                        self.e_tag.as_deref().unwrap_or("none")
                    );
                    return Err(self.fail(&range, why));
                }
                Ok(Err(e)) => {
                    let (range, why) = (p.range.clone(), self.me.explain(&e));
                    return Err(self.fail(&range, why));
                }
                // The part's stream ended (its sender went).
                Err(_) if p.got == want => {
                    self.parts.pop_front();
                    self.fill();
                }
                Err(_) => {
                    let (range, got) = (p.range.clone(), p.got);
                    let why = format!("the server's answer ended after {got} bytes");
                    return Err(self.fail(&range, why));
                }
            }
        }
    }
}

/// A load parses the chunks where they lie (`InPlace`).
impl Pieces for ObjectReader {
    type Piece = bytes::Bytes;

    fn next_piece(&mut self) -> io::Result<Option<bytes::Bytes>> {
        self.next_chunk()
    }
}

impl Read for ObjectReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            match self.next_chunk()? {
                Some(b) => self.cur = b,
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.cur.len());
        out[..n].copy_from_slice(&self.cur[..n]);
        bytes::Buf::advance(&mut self.cur, n);
        Ok(n)
    }
}

impl Drop for ObjectReader {
    fn drop(&mut self) {
        // Ranges still in flight are not wanted any more.
        for p in self.parts.drain(..) {
            p.task.abort();
        }
    }
}
