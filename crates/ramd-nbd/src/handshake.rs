//! Fixed newstyle negotiation: greeting, client flags, then options until
//! the client picks an export (EXPORT_NAME or GO) or leaves.
//!
//! Every malformed option gets the error reply the protocol prescribes and
//! the negotiation goes on; only a broken framing (wrong magic, absurd
//! length, unknown export on EXPORT_NAME, which has no error reply) ends
//! the connection.

use std::io::{self, Read, Write};
use std::sync::Arc;

use crate::proto::*;
use crate::{Export, Exports};

/// Option data larger than this is refused with ERR_TOO_BIG (after being
/// skipped); larger than `MAX_OPTION_SKIP` the client is dropped.
const MAX_OPTION_LEN: u32 = 64 << 10;
const MAX_OPTION_SKIP: u32 = 1 << 20;

/// What transmission needs to know about the negotiated session.
pub(crate) struct Session {
    pub export: Arc<Export>,
    pub structured: bool,
    /// base:allocation was selected for this export.
    pub block_status: bool,
    pub flags: u16,
}

pub(crate) enum Outcome {
    Transmit(Session),
    /// The client aborted, went away, or broke the framing (logged).
    Closed,
}

/// Transmission flags: what the export can do, truthfully.
pub(crate) fn transmission_flags(export: &Export, structured: bool) -> u16 {
    let mut f = TF_HAS_FLAGS | TF_SEND_FLUSH | TF_CAN_MULTI_CONN | TF_SEND_CACHE;
    if export.read_only {
        f |= TF_READ_ONLY;
    } else {
        f |= TF_SEND_FUA | TF_SEND_TRIM | TF_SEND_WRITE_ZEROES | TF_SEND_FAST_ZERO;
    }
    if structured {
        // Reads are always answered in one chunk, so DF is honoured.
        f |= TF_SEND_DF;
    }
    f
}

struct Negotiation<'a, S> {
    s: &'a mut S,
    exports: &'a Exports,
    peer: &'a str,
    structured: bool,
    /// Export for which base:allocation was last selected.
    meta_for: Option<Arc<Export>>,
}

pub(crate) fn negotiate<S: Read + Write>(
    s: &mut S,
    exports: &Exports,
    peer: &str,
) -> io::Result<Outcome> {
    write_greeting(s)?;
    s.flush()?;
    let client_flags = read_u32(s)?;
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0
        || client_flags & FLAG_C_FIXED_NEWSTYLE == 0
    {
        log::warn!("{peer}: unsupported client flags {client_flags:#x}; disconnecting");
        return Ok(Outcome::Closed);
    }
    let no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;
    let mut n = Negotiation {
        s,
        exports,
        peer,
        structured: false,
        meta_for: None,
    };
    loop {
        if let Some(outcome) = n.one_option(no_zeroes)? {
            return Ok(outcome);
        }
    }
}

impl<S: Read + Write> Negotiation<'_, S> {
    /// Handles one option; `Some` when negotiation is over.
    fn one_option(&mut self, no_zeroes: bool) -> io::Result<Option<Outcome>> {
        let magic = read_u64(self.s)?;
        if magic != IHAVEOPT {
            log::warn!("{}: bad option magic {magic:#x}; disconnecting", self.peer);
            return Ok(Some(Outcome::Closed));
        }
        let opt = read_u32(self.s)?;
        let len = read_u32(self.s)?;
        if len > MAX_OPTION_LEN {
            if len > MAX_OPTION_SKIP {
                log::warn!(
                    "{}: option {opt} with {len} bytes of data; disconnecting",
                    self.peer
                );
                return Ok(Some(Outcome::Closed));
            }
            discard(self.s, len as u64)?;
            return self.reply(opt, REP_ERR_TOO_BIG, b"option data too large");
        }
        let mut data = vec![0; len as usize];
        self.s.read_exact(&mut data)?;
        let data = &data[..];

        match Opt::from(opt) {
            Opt::ExportName => self.export_name(data, no_zeroes),
            Opt::Abort => {
                // The client may already be gone; an ACK is courtesy.
                let _ = self.send(opt, REP_ACK, &[]);
                Ok(Some(Outcome::Closed))
            }
            Opt::List if !data.is_empty() => {
                self.reply(opt, REP_ERR_INVALID, b"LIST takes no data")
            }
            Opt::List => {
                for e in self.exports.iter() {
                    let mut d = (e.name.len() as u32).to_be_bytes().to_vec();
                    d.extend_from_slice(e.name.as_bytes());
                    d.extend_from_slice(e.description.as_bytes());
                    self.send(opt, REP_SERVER, &d)?;
                }
                self.reply(opt, REP_ACK, &[])
            }
            Opt::StartTls => self.reply(opt, REP_ERR_UNSUP, b"TLS is not supported yet"),
            Opt::Info | Opt::Go => self.info_or_go(opt, data),
            Opt::StructuredReply if !data.is_empty() => {
                self.reply(opt, REP_ERR_INVALID, b"STRUCTURED_REPLY takes no data")
            }
            Opt::StructuredReply => {
                self.structured = true;
                self.reply(opt, REP_ACK, &[])
            }
            Opt::ListMetaContext | Opt::SetMetaContext => self.meta_context(opt, data),
            Opt::Other(_) => self.reply(opt, REP_ERR_UNSUP, b"option not supported"),
        }
    }

    fn send(&mut self, opt: u32, reply: u32, data: &[u8]) -> io::Result<()> {
        self.s.write_all(&option_reply(opt, reply, data))
    }

    /// Sends a final reply to an option; negotiation continues.
    fn reply(&mut self, opt: u32, reply: u32, data: &[u8]) -> io::Result<Option<Outcome>> {
        if reply & (1 << 31) != 0 {
            log::info!(
                "{}: option {opt} refused: {}",
                self.peer,
                String::from_utf8_lossy(data)
            );
        }
        self.send(opt, reply, data)?;
        self.s.flush()?;
        Ok(None)
    }

    fn session(&self, export: Arc<Export>) -> Session {
        let block_status = self
            .meta_for
            .as_ref()
            .is_some_and(|m| Arc::ptr_eq(m, &export));
        Session {
            flags: transmission_flags(&export, self.structured),
            export,
            structured: self.structured,
            block_status,
        }
    }

    fn export_name(&mut self, data: &[u8], no_zeroes: bool) -> io::Result<Option<Outcome>> {
        let export = std::str::from_utf8(data)
            .ok()
            .filter(|n| n.len() <= MAX_STRING)
            .and_then(|n| self.exports.find(n));
        let Some(export) = export else {
            // EXPORT_NAME has no error reply: the protocol says disconnect.
            log::warn!(
                "{}: unknown export {:?}; disconnecting",
                self.peer,
                String::from_utf8_lossy(data)
            );
            return Ok(Some(Outcome::Closed));
        };
        let session = self.session(export);
        let mut b = session.export.store.size().to_be_bytes().to_vec();
        b.extend_from_slice(&session.flags.to_be_bytes());
        if !no_zeroes {
            b.extend_from_slice(&[0; 124]);
        }
        self.s.write_all(&b)?;
        self.s.flush()?;
        Ok(Some(Outcome::Transmit(session)))
    }

    fn info_or_go(&mut self, opt: u32, data: &[u8]) -> io::Result<Option<Outcome>> {
        let mut d = OptData(data);
        let parsed = (|| {
            let name = d.string()?;
            let n = d.u16()? as usize;
            let infos: Vec<u16> = (0..n).map(|_| d.u16()).collect::<Option<_>>()?;
            d.is_empty().then_some((name, infos))
        })();
        let Some((name, infos)) = parsed else {
            return self.reply(opt, REP_ERR_INVALID, b"malformed INFO/GO request");
        };
        let Some(export) = self.exports.find(name) else {
            let msg = format!("no export named {name:?}");
            return self.reply(opt, REP_ERR_UNKNOWN, msg.as_bytes());
        };
        let session = self.session(export);
        let e = &session.export;
        let mut info = INFO_EXPORT.to_be_bytes().to_vec();
        info.extend_from_slice(&e.store.size().to_be_bytes());
        info.extend_from_slice(&session.flags.to_be_bytes());
        self.send(opt, REP_INFO, &info)?;
        if infos.contains(&INFO_NAME) {
            let mut d = INFO_NAME.to_be_bytes().to_vec();
            d.extend_from_slice(e.name.as_bytes());
            self.send(opt, REP_INFO, &d)?;
        }
        if infos.contains(&INFO_DESCRIPTION) {
            let mut d = INFO_DESCRIPTION.to_be_bytes().to_vec();
            d.extend_from_slice(e.description.as_bytes());
            self.send(opt, REP_INFO, &d)?;
        }
        // Always sent: the limits are the protocol's defaults, so a client
        // that did not ask loses nothing by seeing them.
        let mut bs = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        for v in [1u32, 4096, MAX_PAYLOAD] {
            bs.extend_from_slice(&v.to_be_bytes());
        }
        self.send(opt, REP_INFO, &bs)?;
        self.reply(opt, REP_ACK, &[])?;
        Ok((Opt::from(opt) == Opt::Go).then_some(Outcome::Transmit(session)))
    }

    fn meta_context(&mut self, opt: u32, data: &[u8]) -> io::Result<Option<Outcome>> {
        let set = Opt::from(opt) == Opt::SetMetaContext;
        if set {
            // Any SET replaces the previous selection, even a failed one.
            self.meta_for = None;
            if !self.structured {
                return self.reply(opt, REP_ERR_INVALID, b"negotiate STRUCTURED_REPLY first");
            }
        }
        let mut d = OptData(data);
        let parsed = (|| {
            let name = d.string()?;
            let n = d.u32()?;
            let queries: Vec<&str> = (0..n).map(|_| d.string()).collect::<Option<_>>()?;
            d.is_empty().then_some((name, queries))
        })();
        let Some((name, queries)) = parsed else {
            return self.reply(opt, REP_ERR_INVALID, b"malformed META_CONTEXT request");
        };
        let Some(export) = self.exports.find(name) else {
            let msg = format!("no export named {name:?}");
            return self.reply(opt, REP_ERR_UNKNOWN, msg.as_bytes());
        };
        let wanted = if set {
            queries.contains(&BASE_ALLOCATION)
        } else {
            // LIST: no query means all; "base:" means the whole namespace.
            queries.is_empty()
                || queries
                    .iter()
                    .any(|q| *q == "base:" || *q == BASE_ALLOCATION)
        };
        if wanted {
            let mut d = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
            d.extend_from_slice(BASE_ALLOCATION.as_bytes());
            self.send(opt, REP_META_CONTEXT, &d)?;
            if set {
                self.meta_for = Some(export);
            }
        }
        self.reply(opt, REP_ACK, &[])
    }
}
