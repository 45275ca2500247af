//! Compression: packing a page with a codec, decoding a compressed page
//! or a frame member (with a per-request frame cache), promotion of pages
//! read again, codec ids, and `compress_page` for image tools.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use crate::codec::{self, Codec};
use crate::error::{Error, Result};
use crate::sys::PAGE_SIZE;
use crate::zs::{self, Handle};

use super::frame::{frame_len, FRAME_HEADER};
use super::table::{page_mut, Chunk, ChunkSpan, Slot};
use super::{Store, CHUNK_PAGES};

/// A compressed page is kept only if its object is at most this big; above
/// it the page is stored raw (decompressing for a 6% saving is a poor trade).
pub(crate) const MAX_PACKED: usize = PAGE_SIZE - PAGE_SIZE / 16;

impl Store {
    /// Hot/cold tiering: compressed pages read whole a second time since the
    /// scanner's last pass go back to raw, so a working set that is read
    /// again and again is served at memory speed. Best
    /// effort: skipped when memory is short. Pages are decompressed again
    /// under the write lock: what the read saw may have been rewritten since
    /// (even into the same object), so `out` cannot be trusted here.
    pub(crate) fn promote(&self, span: &ChunkSpan, cold: u64) {
        let mut map = self.shard(span.chunk).write();
        let Some(chunk) = map.get_mut(&span.chunk) else {
            return;
        };
        let mut frame = FrameCache::default();
        for ps in span.pages().filter(|ps| cold & 1 << ps.slot != 0) {
            let slot = chunk.get(ps.slot);
            if !matches!(slot, Slot::Packed { .. } | Slot::Frame(_)) {
                continue;
            }
            // Reads must not take the memory writes need: promote only
            // below the mark where the scanner starts compressing anyway.
            if self.c.memory_used.load(Relaxed) + PAGE_SIZE as u64 > self.pressure_mark() {
                return;
            }
            let Ok(p) = self.alloc_page(false) else {
                return;
            };
            // SAFETY: fresh frame, not yet shared.
            let page = unsafe { page_mut(p) };
            if self
                .decode_into(slot, chunk, &mut frame, ps.slot, page)
                .is_err()
            {
                self.free_page(p);
                return;
            }
            self.replace(chunk, ps.slot, Slot::Raw { p, hot: true }, true);
        }
    }

    /// Builds the slot for `data` compressed with `codec`, or a raw page if
    /// it does not compress to `MAX_PACKED`. If `old` is a compressed
    /// object of the same class, or a raw frame that the result needs, it
    /// is reused in place; then the caller must hold the write lock.
    pub(crate) fn pack(&self, codec: Codec, data: &[u8], old: Slot, bg: bool) -> Result<Slot> {
        let mut out = [0u8; MAX_PACKED];
        let n = timed(&self.c.compress_ns, || {
            codec::compress(codec, data, &mut out)
        });
        let Some(n) = n else {
            if let Slot::Raw { p, .. } = old {
                // Keep the frame the page already has (the caller may be
                // compressing that very frame: then there is nothing to copy).
                if !std::ptr::eq(data.as_ptr(), p.as_ptr()) {
                    // SAFETY: the caller holds the write lock over `old`.
                    unsafe { page_mut(p) }.copy_from_slice(data);
                }
                return Ok(Slot::Raw { p, hot: false });
            }
            let p = self.alloc_page(bg)?;
            // SAFETY: fresh frame, not yet shared.
            unsafe { page_mut(p) }.copy_from_slice(data);
            return Ok(Slot::Raw { p, hot: false });
        };
        let h = match old {
            Slot::Packed { h, .. } if h.capacity() == zs::rounded(n) => h,
            _ => match self.alloc_object(n, bg) {
                Ok(h) => h,
                // A new zspage does not fit: a raw page may, better than
                // ENOSPC (the old slot's own frame, if it has one). It is
                // left hot, for the scanner to compress when memory allows.
                Err(Error::NoSpace { .. } | Error::SharedNoSpace { .. }) => {
                    let p = match old {
                        Slot::Raw { p, .. } => p,
                        _ => self.alloc_page(bg)?,
                    };
                    if !std::ptr::eq(data.as_ptr(), p.as_ptr()) {
                        // SAFETY: a fresh frame, or the old slot's frame under
                        // the caller's write lock.
                        unsafe { page_mut(p) }.copy_from_slice(data);
                    }
                    return Ok(Slot::Raw { p, hot: true });
                }
                Err(e) => return Err(e),
            },
        };
        // SAFETY: `h` is fresh, or the old slot's object, whose owner (the
        // caller, under the write lock) is replacing it with this one.
        unsafe { self.zs.write(h, &out[..n]) };
        Ok(Slot::Packed {
            zstd: matches!(codec, Codec::Zstd(_)),
            h,
            len: n as u16,
        })
    }

    pub(crate) fn alloc_object(&self, len: usize, bg: bool) -> Result<Handle> {
        self.zs.alloc(
            len,
            &self.pool,
            |b| self.reserve_for(b, bg),
            |b| self.unreserve(b),
        )
    }

    pub(crate) fn free_object(&self, h: Handle) {
        self.zs.free(h, &self.pool, |b| self.unreserve(b));
    }

    /// Decompresses page `i` (`slot`, compressed) into `dst` (4 KiB).
    pub(crate) fn decode_into(
        &self,
        slot: Slot,
        chunk: &Chunk,
        frame: &mut FrameCache,
        i: usize,
        dst: &mut [u8],
    ) -> Result<()> {
        timed(&self.c.decompress_ns, || match slot {
            Slot::Packed { zstd, h, len } => {
                let codec = if zstd { Codec::Zstd(0) } else { Codec::Lz4 };
                let mut tmp = [0u8; PAGE_SIZE];
                // SAFETY: the object is this slot's and the caller holds the
                // shard lock, so it neither changes nor goes away.
                let src = match unsafe { self.zs.slice(h, len as usize) } {
                    Some(s) => s,
                    None => {
                        unsafe { self.zs.read(h, &mut tmp[..len as usize]) };
                        &tmp[..len as usize]
                    }
                };
                codec::decompress(codec, src, dst)
            }
            Slot::Frame(h) => frame.page(self, chunk.vals[i], h, i, dst),
            _ => unreachable!("decode of an uncompressed slot"),
        })
    }

    /// A frame's header: first slot, page count, codec, compressed length.
    ///
    /// SAFETY: the caller holds the shard lock of a slot naming `h`.
    pub(crate) unsafe fn frame_header(&self, h: Handle) -> [u8; FRAME_HEADER] {
        let mut header = [0u8; FRAME_HEADER];
        self.zs.read(h, &mut header);
        header
    }
}

/// The frame last decompressed while one shard lock is held, so that a
/// request over many pages of one frame decompresses it once.
#[derive(Default)]
pub(crate) struct FrameCache {
    val: Option<u64>,
    data: Vec<u8>,
    start: usize,
}

impl FrameCache {
    pub(crate) fn page(
        &mut self,
        store: &Store,
        val: u64,
        h: Handle,
        i: usize,
        dst: &mut [u8],
    ) -> Result<()> {
        if self.val != Some(val) {
            // SAFETY: the caller holds the shard lock of a slot naming `h`.
            let header = unsafe { store.frame_header(h) };
            let (start, n, len) = (header[0] as usize, header[1] as usize, frame_len(&header));
            if n == 0 || start + n > CHUNK_PAGES || FRAME_HEADER + len > h.capacity() {
                return Err(Error::Corrupt(format!("frame header {header:?}")));
            }
            let mut packed = vec![0u8; FRAME_HEADER + len];
            unsafe { store.zs.read(h, &mut packed) };
            self.data.resize(n * PAGE_SIZE, 0);
            codec::decompress(
                codec_of(header[2])?,
                &packed[FRAME_HEADER..],
                &mut self.data,
            )?;
            self.val = Some(val);
            self.start = start;
        }
        let k = i
            .checked_sub(self.start)
            .filter(|k| k * PAGE_SIZE < self.data.len());
        let Some(k) = k else {
            return Err(Error::Corrupt(format!("page {i} outside its frame")));
        };
        dst.copy_from_slice(&self.data[k * PAGE_SIZE..(k + 1) * PAGE_SIZE]);
        Ok(())
    }
}

pub(crate) fn codec_id(c: Codec) -> u8 {
    match c {
        Codec::None => 0,
        Codec::Lz4 => 1,
        Codec::Zstd(_) => 2,
    }
}

pub(crate) fn codec_of(id: u8) -> Result<Codec> {
    match id {
        1 => Ok(Codec::Lz4),
        2 => Ok(Codec::Zstd(0)),
        _ => Err(Error::Corrupt(format!("frame codec id {id}"))),
    }
}

/// Compresses one page as a store would keep it: `Some((zstd, len))` if
/// `codec` shrinks it to at most `MAX_PACKED` bytes of `out`, else `None`
/// (the page stays raw). For tools that build images (`ramd image import`).
pub fn compress_page(
    codec: Codec,
    page: &[u8],
    out: &mut [u8; PAGE_SIZE],
) -> Option<(bool, usize)> {
    if codec.is_none() {
        return None;
    }
    let n = codec::compress(codec, page, &mut out[..MAX_PACKED])?;
    Some((matches!(codec, Codec::Zstd(_)), n))
}

/// Runs `f`, adding its elapsed time to `counter`. Codec calls are pure
/// computation, so this is their CPU time unless threads outnumber cores
/// and the call is preempted. (The thread CPU clock would say it exactly,
/// but it is a system call, ~0.5 µs here, and timing only some calls with
/// it was measured to overstate them by 3-20%: the system call itself slows
/// the compression that follows it.)
pub(crate) fn timed<T>(counter: &AtomicU64, f: impl FnOnce() -> T) -> T {
    let start = std::time::Instant::now();
    let r = f();
    counter.fetch_add(start.elapsed().as_nanos() as u64, Relaxed);
    r
}
