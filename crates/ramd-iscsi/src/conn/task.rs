//! Task management requests (§11.5): aborting tasks, task sets and
//! resets. Only a write waiting for its Data-Out is still a task here;
//! every other command ran to completion as it arrived.

use std::sync::Arc;

use super::link::{decode_lun, Link};
use super::pending::Pendings;
use crate::pdu::{op, Pdu};
use crate::target::Session;

impl Link<'_> {
    pub(super) fn task_management(&mut self, pending: &mut Pendings, sess: &Arc<Session>, p: Pdu) {
        let function = p.flags() & 0x7f;
        let lun = decode_lun(p.lun_field());
        let rtt = p.u32(20);
        let response: u8 = match function {
            // ABORT TASK: only a task waiting for Data-Out still exists
            // here (the others ran to completion as they arrived).
            1 => {
                if pending.abort(rtt) {
                    0
                } else if sess.window.lock().awaited(p.u32(32)) {
                    // Numbered but not arrived yet (another connection's):
                    // it counts as received and aborted (§11.5.1).
                    0
                } else {
                    // Done before the abort came: the initiator has or
                    // will have its status.
                    1
                }
            }
            // ABORT TASK SET, CLEAR TASK SET.
            2 | 4 => {
                pending.abort_lun(lun);
                if self.target.lun(lun).is_some() {
                    0
                } else {
                    2
                }
            }
            // LOGICAL UNIT RESET.
            5 => match self.target.lun(lun) {
                Some(l) => {
                    pending.abort_lun(lun);
                    l.reset();
                    0
                }
                None => 2,
            },
            // TARGET WARM RESET.
            6 => {
                pending.clear();
                self.target.for_each_lun(|l| l.reset());
                0
            }
            // TASK REASSIGN needs ERL 2.
            8 => 4,
            // CLEAR ACA, TARGET COLD RESET and the rest.
            _ => 5,
        };
        self.send_response(op::TMF_RESP, response, p.itt());
    }
}
