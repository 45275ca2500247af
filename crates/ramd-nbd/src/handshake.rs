//! Newstyle negotiation: greeting, client flags, then options until
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
    /// STARTTLS was acknowledged: the TLS handshake comes next, then
    /// [`negotiate_secure`] with the client's NO_ZEROES flag.
    StartTls {
        no_zeroes: bool,
    },
}

/// TLS during option negotiation (the NBD specification, "TLS support").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TlsPolicy {
    /// NOTLS: STARTTLS is refused (ERR_POLICY).
    Off,
    /// SELECTIVETLS with no TLS-only export: the client may upgrade.
    On,
    /// FORCEDTLS: every option but STARTTLS and ABORT gets ERR_TLS_REQD
    /// until TLS is up; EXPORT_NAME, which has no error reply, disconnects.
    Require,
    /// The negotiation already runs over TLS.
    Active,
}

/// Transmission flags: what the export can do, truthfully.
pub(crate) fn transmission_flags(export: &Export, structured: bool) -> u16 {
    let mut f = TF_HAS_FLAGS | TF_SEND_FLUSH | TF_CAN_MULTI_CONN | TF_SEND_CACHE;
    // A standby's store takes no writes until promoted; a client that
    // connects after the promotion gets a writable export.
    if export.read_only || export.store.standby() {
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
    /// The client set FIXED_NEWSTYLE. Without it, only EXPORT_NAME is
    /// served ("In non-fixed newstyle only one option can be set
    /// (`NBD_OPT_EXPORT_NAME`)", NBD specification); other options get
    /// ERR_INVALID, as nbdkit answers them.
    fixed: bool,
    structured: bool,
    /// Export for which base:allocation was last selected.
    meta_for: Option<Arc<Export>>,
    tls: TlsPolicy,
}

/// The greeting, the client's flags, then options until the client picks
/// an export, leaves, or (with `tls` On or Require) upgrades to TLS.
pub(crate) fn negotiate<S: Read + Write>(
    s: &mut S,
    exports: &Exports,
    peer: &str,
    tls: TlsPolicy,
) -> io::Result<Outcome> {
    write_greeting(s)?;
    s.flush()?;
    let client_flags = read_u32(s)?;
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        // "the server MUST drop the TCP connection if the client sets an
        // unknown flag" (the NBD specification, "Client flags").
        log::warn!("{peer}: unsupported client flags {client_flags:#x}; disconnecting");
        return Ok(Outcome::Closed);
    }
    let no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;
    let fixed = client_flags & FLAG_C_FIXED_NEWSTYLE != 0;
    options(s, exports, peer, fixed, no_zeroes, tls)
}

/// Options over TLS, after STARTTLS and the handshake. Nothing negotiated
/// before carries over (the NBD specification, `NBD_OPT_STARTTLS`): a fresh state.
pub(crate) fn negotiate_secure<S: Read + Write>(
    s: &mut S,
    exports: &Exports,
    peer: &str,
    no_zeroes: bool,
) -> io::Result<Outcome> {
    options(s, exports, peer, true, no_zeroes, TlsPolicy::Active)
}

fn options<S: Read + Write>(
    s: &mut S,
    exports: &Exports,
    peer: &str,
    fixed: bool,
    no_zeroes: bool,
    tls: TlsPolicy,
) -> io::Result<Outcome> {
    let mut n = Negotiation {
        s,
        exports,
        peer,
        fixed,
        structured: false,
        meta_for: None,
        tls,
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
            if len > MAX_OPTION_SKIP || Opt::from(opt) == Opt::ExportName {
                // EXPORT_NAME has no error reply: the protocol says disconnect.
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

        let required = self.tls == TlsPolicy::Require;
        if required && Opt::from(opt) == Opt::ExportName {
            // No error reply exists, and the export is not for plaintext.
            log::warn!(
                "{}: EXPORT_NAME without TLS, which is required; disconnecting",
                self.peer
            );
            return Ok(Some(Outcome::Closed));
        }
        if !self.fixed && Opt::from(opt) != Opt::ExportName {
            return self.reply(
                opt,
                REP_ERR_INVALID,
                b"only EXPORT_NAME without fixed newstyle",
            );
        }
        if required && !matches!(Opt::from(opt), Opt::StartTls | Opt::Abort) {
            return self.reply(
                opt,
                REP_ERR_TLS_REQD,
                b"TLS is required: send STARTTLS first",
            );
        }
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
            Opt::StartTls if !data.is_empty() => {
                self.reply(opt, REP_ERR_INVALID, b"STARTTLS takes no data")
            }
            Opt::StartTls => match self.tls {
                TlsPolicy::Off => self.reply(opt, REP_ERR_POLICY, b"TLS is off on this server"),
                TlsPolicy::Active => self.reply(opt, REP_ERR_INVALID, b"TLS is already active"),
                TlsPolicy::On | TlsPolicy::Require => {
                    self.send(opt, REP_ACK, &[])?;
                    self.s.flush()?;
                    Ok(Some(Outcome::StartTls { no_zeroes }))
                }
            },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzz::Script;
    use ramd_store::{Store, StoreConfig};
    use std::io::Cursor;

    fn exports(read_only: bool) -> Exports {
        let mut cfg = StoreConfig::new(1 << 20);
        cfg.host_reserve = 0;
        Exports::new(vec![Export {
            name: "disk".into(),
            description: "test disk".into(),
            store: Arc::new(Store::new(cfg).unwrap()),
            read_only,
            metrics: None,
        }])
    }

    fn option(opt: u32, data: &[u8]) -> Vec<u8> {
        option_request(opt, data)
    }

    fn string(s: &str) -> Vec<u8> {
        let mut v = (s.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(s.as_bytes());
        v
    }

    /// Runs a negotiation; returns the outcome and the option replies as
    /// (option, reply type, data), after the 18-byte greeting.
    /// One option reply: (option, reply type, data).
    type OptReply = (u32, u32, Vec<u8>);

    fn run(client: Vec<u8>, ex: &Exports) -> (io::Result<Outcome>, Vec<OptReply>) {
        run_tls(client, ex, TlsPolicy::Off)
    }

    fn run_tls(
        client: Vec<u8>,
        ex: &Exports,
        tls: TlsPolicy,
    ) -> (io::Result<Outcome>, Vec<OptReply>) {
        let mut s = Script {
            input: Cursor::new(client),
            output: Vec::new(),
        };
        let outcome = negotiate(&mut s, ex, "test", tls);
        (outcome, parse_replies(&s.output[18..]))
    }

    fn parse_replies(mut out: &[u8]) -> Vec<OptReply> {
        let mut replies = Vec::new();
        while let Some(OptionReply { opt, kind, len }) = out
            .first_chunk::<OPTION_REPLY_LEN>()
            .and_then(OptionReply::parse)
        {
            let len = len as usize;
            replies.push((opt, kind, out[20..20 + len].to_vec()));
            out = &out[20 + len..];
        }
        replies
    }

    const FLAGS: [u8; 4] = [0, 0, 0, 3]; // FIXED_NEWSTYLE | NO_ZEROES

    #[test]
    fn go_with_structured_replies_and_base_allocation() {
        let mut c = FLAGS.to_vec();
        c.extend(option(8, &[])); // STRUCTURED_REPLY
        let mut meta = string("disk");
        meta.extend_from_slice(&1u32.to_be_bytes()); // one query
        meta.extend(string("base:allocation"));
        c.extend(option(10, &meta)); // SET_META_CONTEXT
        let mut go = string("disk");
        go.extend_from_slice(&[0, 1, 0, 3]); // one info request: BLOCK_SIZE
        c.extend(option(7, &go)); // GO
        let (outcome, replies) = run(c, &exports(false));
        let Outcome::Transmit(s) = outcome.unwrap() else {
            panic!("expected transmission")
        };
        assert!(s.structured && s.block_status);
        assert_eq!(s.flags & TF_SEND_DF, TF_SEND_DF);
        assert_eq!(s.flags & TF_READ_ONLY, 0);
        let kinds: Vec<(u32, u32)> = replies.iter().map(|r| (r.0, r.1)).collect();
        assert_eq!(
            kinds,
            [
                (8, REP_ACK),
                (10, REP_META_CONTEXT),
                (10, REP_ACK),
                (7, REP_INFO),
                (7, REP_INFO),
                (7, REP_ACK)
            ]
        );
        assert_eq!(replies[1].2[..4], BASE_ALLOCATION_ID.to_be_bytes());
        assert_eq!(&replies[1].2[4..], b"base:allocation");
        // INFO_EXPORT: type 0, size 1 MiB, flags.
        assert_eq!(replies[3].2[..10], [0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0]);
        // INFO_BLOCK_SIZE: 1, 4096, 32 MiB.
        assert_eq!(
            replies[4].2,
            [0, 3, 0, 0, 0, 1, 0, 0, 0x10, 0, 0x02, 0, 0, 0]
        );
    }

    #[test]
    fn errors_keep_negotiation_going() {
        let mut c = FLAGS.to_vec();
        c.extend(option(99, b"xyz")); // unknown option
        c.extend(option(3, b"junk")); // LIST with data
        c.extend(option(10, &string("disk"))); // SET before STRUCTURED_REPLY
        let mut go = string("nope");
        go.extend_from_slice(&[0, 0]);
        c.extend(option(6, &go)); // INFO of a missing export
        let mut bad = string("disk");
        bad.extend_from_slice(&[0, 2, 0, 1]); // claims 2 infos, has 1
        c.extend(option(6, &bad));
        c.extend(option(7, &[0, 0, 0, 9, b'd'])); // name longer than data
        c.extend(option(2, &[])); // ABORT
        let (outcome, replies) = run(c, &exports(false));
        assert!(matches!(outcome.unwrap(), Outcome::Closed));
        let kinds: Vec<u32> = replies.iter().map(|r| r.1).collect();
        assert_eq!(
            kinds,
            [
                REP_ERR_UNSUP,
                REP_ERR_INVALID,
                REP_ERR_INVALID,
                REP_ERR_UNKNOWN,
                REP_ERR_INVALID,
                REP_ERR_INVALID,
                REP_ACK
            ]
        );
    }

    #[test]
    fn list_and_export_name() {
        let mut c = FLAGS.to_vec();
        c.extend(option(3, &[]));
        c.extend(option(1, b"disk")); // EXPORT_NAME
        let (outcome, replies) = run(c, &exports(true));
        assert_eq!(replies[0].1, REP_SERVER);
        assert_eq!(replies[0].2, [&string("disk")[..], b"test disk"].concat());
        assert_eq!(replies[1].1, REP_ACK);
        let Outcome::Transmit(s) = outcome.unwrap() else {
            panic!("expected transmission")
        };
        assert_eq!(s.flags & TF_READ_ONLY, TF_READ_ONLY);
        assert_eq!(s.flags & (TF_SEND_TRIM | TF_SEND_WRITE_ZEROES), 0);
        assert!(!s.block_status);
    }

    #[test]
    fn client_without_fixed_newstyle_gets_export_name_only() {
        // Client flags 0: neither FIXED_NEWSTYLE nor NO_ZEROES.
        let mut c = vec![0, 0, 0, 0];
        c.extend(option(3, &[])); // LIST: refused, negotiation goes on
        c.extend(option(1, b"disk"));
        let mut s = Script {
            input: Cursor::new(c),
            output: Vec::new(),
        };
        let outcome = negotiate(&mut s, &exports(false), "test", TlsPolicy::Off).unwrap();
        assert!(matches!(outcome, Outcome::Transmit(_)));
        let out = &s.output[18..];
        assert_eq!(out[..16], option_reply(3, REP_ERR_INVALID, &[])[..16]);
        let msg_len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        let export = &out[20 + msg_len..];
        // Size (1 MiB), transmission flags, then the 124 reserved zeroes.
        assert_eq!(export.len(), 8 + 2 + 124);
        assert_eq!(export[..8], (1u64 << 20).to_be_bytes());
        assert!(export[10..].iter().all(|&b| b == 0));
    }

    #[test]
    fn tls_required_refuses_every_option_but_starttls_and_abort() {
        let mut c = FLAGS.to_vec();
        c.extend(option(3, &[])); // LIST
        let mut go = string("disk");
        go.extend_from_slice(&[0, 0]);
        c.extend(option(7, &go)); // GO
        c.extend(option(6, &go)); // INFO
        c.extend(option(8, &[])); // STRUCTURED_REPLY
        c.extend(option(99, &[])); // unknown
        c.extend(option(5, b"x")); // STARTTLS with data
        c.extend(option(5, &[])); // STARTTLS
        let (outcome, replies) = run_tls(c, &exports(false), TlsPolicy::Require);
        assert!(matches!(
            outcome.unwrap(),
            Outcome::StartTls { no_zeroes: true }
        ));
        let kinds: Vec<(u32, u32)> = replies.iter().map(|r| (r.0, r.1)).collect();
        assert_eq!(
            kinds,
            [
                (3, REP_ERR_TLS_REQD),
                (7, REP_ERR_TLS_REQD),
                (6, REP_ERR_TLS_REQD),
                (8, REP_ERR_TLS_REQD),
                (99, REP_ERR_TLS_REQD),
                (5, REP_ERR_INVALID),
                (5, REP_ACK)
            ]
        );
        // ABORT is still answered.
        let mut c = FLAGS.to_vec();
        c.extend(option(2, &[]));
        let (outcome, replies) = run_tls(c, &exports(false), TlsPolicy::Require);
        assert!(matches!(outcome.unwrap(), Outcome::Closed));
        assert_eq!(replies[0].1, REP_ACK);
    }

    #[test]
    fn tls_required_export_name_disconnects_without_serving() {
        for flags in [FLAGS, [0, 0, 0, 0]] {
            let mut c = flags.to_vec();
            c.extend(option(1, b"disk"));
            let mut s = Script {
                input: Cursor::new(c),
                output: Vec::new(),
            };
            let outcome = negotiate(&mut s, &exports(false), "test", TlsPolicy::Require);
            assert!(matches!(outcome.unwrap(), Outcome::Closed));
            assert_eq!(s.output.len(), 18, "nothing after the greeting");
        }
    }

    #[test]
    fn starttls_offered_refused_or_already_active() {
        // On: options go on in plaintext until the client upgrades.
        let mut c = FLAGS.to_vec();
        c.extend(option(8, &[]));
        c.extend(option(5, &[]));
        let (outcome, replies) = run_tls(c, &exports(false), TlsPolicy::On);
        assert!(matches!(outcome.unwrap(), Outcome::StartTls { .. }));
        assert_eq!(replies[0].1, REP_ACK);
        assert_eq!(replies[1], (5, REP_ACK, Vec::new()));
        // Off: a policy refusal, and negotiation goes on.
        let mut c = FLAGS.to_vec();
        c.extend(option(5, &[]));
        c.extend(option(2, &[]));
        let (_, replies) = run_tls(c, &exports(false), TlsPolicy::Off);
        assert_eq!(replies[0].1, REP_ERR_POLICY);
        assert_eq!(replies[1].1, REP_ACK);
        // Over TLS: a second STARTTLS is invalid; state starts afresh, so
        // block status needs STRUCTURED_REPLY again.
        let mut c = option(5, &[]);
        let mut go = string("disk");
        go.extend_from_slice(&[0, 0]);
        c.extend(option(7, &go));
        let mut s = Script {
            input: Cursor::new(c),
            output: Vec::new(),
        };
        let outcome = negotiate_secure(&mut s, &exports(false), "test", true).unwrap();
        let Outcome::Transmit(session) = outcome else {
            panic!("expected transmission")
        };
        assert!(!session.structured && !session.block_status);
        let kinds: Vec<u32> = parse_replies(&s.output).iter().map(|r| r.1).collect();
        assert_eq!(kinds, [REP_ERR_INVALID, REP_INFO, REP_INFO, REP_ACK]);
    }

    #[test]
    fn oversized_export_name_disconnects() {
        let mut c = FLAGS.to_vec();
        c.extend(option(1, &vec![b'a'; 100 << 10]));
        let (o, replies) = run(c, &exports(false));
        assert!(matches!(o.unwrap(), Outcome::Closed));
        assert!(replies.is_empty(), "EXPORT_NAME has no error reply");
    }

    #[test]
    fn broken_framing_disconnects() {
        // Unknown client flags.
        let (o, _) = run(vec![0, 0, 0, 0x13], &exports(false));
        assert!(matches!(o.unwrap(), Outcome::Closed));
        // Wrong option magic.
        let mut c = FLAGS.to_vec();
        c.extend_from_slice(&[0xde; 16]);
        assert!(matches!(
            run(c, &exports(false)).0.unwrap(),
            Outcome::Closed
        ));
        // Unknown export on EXPORT_NAME: no error reply exists.
        let mut c = FLAGS.to_vec();
        c.extend(option(1, b"other"));
        assert!(matches!(
            run(c, &exports(false)).0.unwrap(),
            Outcome::Closed
        ));
        // An option claiming 16 MiB of data.
        let mut c = FLAGS.to_vec();
        c.extend_from_slice(&IHAVEOPT.to_be_bytes());
        c.extend_from_slice(&[0, 0, 0, 7, 1, 0, 0, 0]);
        assert!(matches!(
            run(c, &exports(false)).0.unwrap(),
            Outcome::Closed
        ));
        // Truncated mid-option: an I/O error, not a panic.
        let mut c = FLAGS.to_vec();
        c.extend_from_slice(&option(7, &string("disk"))[..20]);
        assert!(run(c, &exports(false)).0.is_err());
    }

    #[test]
    fn oversized_option_is_skipped_with_too_big() {
        let mut c = FLAGS.to_vec();
        c.extend(option(7, &vec![0; 100 << 10]));
        c.extend(option(2, &[]));
        let (o, replies) = run(c, &exports(false));
        assert!(matches!(o.unwrap(), Outcome::Closed));
        assert_eq!(replies[0].1, REP_ERR_TOO_BIG);
        assert_eq!(replies[1].1, REP_ACK);
    }
}
