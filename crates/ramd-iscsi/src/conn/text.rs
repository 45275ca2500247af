//! Text requests in the full feature phase (§11.10): SendTargets, and
//! renegotiating what a connection may change; continued requests are
//! gathered by ITT.

use std::sync::Arc;

use super::link::{Link, MAX_TEXT};
use crate::params::negotiate;
use crate::pdu::{self, op, reject, Pdu, NO_TAG};
use crate::target::Session;

impl Link<'_> {
    /// `partial`: a continued request's pairs so far, by ITT.
    pub(super) fn text_request(
        &mut self,
        partial: &mut Option<(u32, Vec<u8>)>,
        sess: &Arc<Session>,
        p: Pdu,
    ) {
        let itt = p.itt();
        let cont = p.flags() & 0x40 != 0;
        let mut text = match partial.take() {
            Some((t, buf)) if t == itt => buf,
            _ => Vec::new(),
        };
        text.extend_from_slice(&p.data);
        if text.len() > MAX_TEXT {
            self.reject(&p, reject::PROTOCOL_ERROR);
            return;
        }
        let mut answers = Vec::new();
        if cont {
            *partial = Some((itt, text));
        } else {
            for (k, v) in pdu::parse_text(&text) {
                match k.as_str() {
                    "SendTargets" => {
                        let all = v == "All" && sess.discovery;
                        let this = v.is_empty() && !sess.discovery;
                        if all || this || v == self.target.cfg.name {
                            answers.push(("TargetName".to_string(), self.target.cfg.name.clone()));
                            let mut addr = self.portal;
                            if addr.ip().is_unspecified() {
                                if let Ok(a) = self.stream.local_addr() {
                                    addr = a;
                                }
                            }
                            answers.push(("TargetAddress".into(), format!("{addr},1")));
                        }
                    }
                    "" => answers.push((v, "Reject".into())),
                    _ => {
                        // Renegotiation in the full feature phase: only
                        // what a connection may change.
                        if k == "MaxRecvDataSegmentLength" {
                            if let Some(a) = negotiate(&mut self.params, &k, &v, false) {
                                answers.push((k, a));
                            }
                        } else {
                            answers.push((k, "NotUnderstood".into()));
                        }
                    }
                }
            }
        }
        let mut r = Pdu::new(op::TEXT_RESP);
        if cont {
            r.bhs[1] = 0;
            r.set_u32(20, 1);
        } else {
            r.bhs[1] = 0x80;
            r.set_u32(20, NO_TAG);
        }
        r.bhs[8..16].copy_from_slice(&p.bhs[8..16]);
        r.set_u32(16, itt);
        self.set_stat(&mut r);
        self.set_window(&mut r);
        let mut data = pdu::encode_text(&answers);
        data.truncate(self.params.initiator_mrdsl as usize);
        r.data = data;
        self.send(&r);
    }
}
