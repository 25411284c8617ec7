//! A task's turn, the broker's side of it: the frame that starts it (`A2aTurn`, the FrameAdaptor
//! SPI) and the driver that reads its chunks and feeds each to the pure task machine
//! (`adaptor::a2a::task`), which moves the task; the broker's clock and uuids are the
//! machine's [`Stamps`].

use std::rc::Rc;
use std::sync::Arc;

use frame_codec::Frame;

use super::super::adaptor::{FrameAdaptor, Refusal, To};
use super::super::call::{text_turn_frame, uuid_v4};
use super::binding::{from_problem, now_ms, Binding};
use crate::adaptor::a2a::task::{self, Chunk, Stamps};
use crate::adaptor::a2a::{A2aError, ErrorKind};
use crate::server::{Request, Response};
use crate::shard::calls::{Call, Read};
use crate::shard::core::Shard;
use crate::shard::tasks::TaskEntry;

/// The broker's clock and uuids, as the task machine takes them.
pub(super) struct Now;

impl Stamps for Now {
    fn timestamp(&mut self) -> String {
        task::timestamp(crate::model::clock::now_micros())
    }

    fn message_id(&mut self) -> String {
        uuid_v4()
    }
}

/// A2A's `SendMessage` as a turn of the context's agent session (the FrameAdaptor SPI): the
/// message's prompt (`a2a::Message::prompt`) is the turn's text; the ingress's refusals are
/// A2A errors in the request's binding.
pub(super) struct A2aTurn<'a> {
    pub(super) prompt: &'a str,
    pub(super) advertised: &'a str,
    pub(super) b: &'a Binding,
    /// The task the turn is for, told its turn's number as the frame is made (before it is
    /// stored: a cancel from then on ends this turn).
    pub(super) entry: Option<&'a Arc<TaskEntry>>,
}

impl FrameAdaptor for A2aTurn<'_> {
    fn frames(&self, to: &To<'_>, _req: &Request<'_>) -> Result<Vec<Frame>, Refusal> {
        let Some((sid, turn)) = to.turn else {
            let e = A2aError::new(ErrorKind::Internal, "an A2A message is a turn of a session");
            return Err(Refusal::Answered(self.b.err(&e)));
        };
        if let Some(entry) = self.entry {
            entry.log().turn = turn;
        }
        Ok(vec![text_turn_frame(self.prompt, (sid, turn), to.topic, self.advertised)])
    }

    fn refused(&self, problem: Response) -> Response {
        self.b.err(&from_problem(&problem))
    }

    fn bytes(&self, _req: &Request<'_>) -> u64 {
        self.prompt.len() as u64
    }
}

/// Reads a turn's chunks and moves its task with each (`task::chunk`), until the turn ends.
pub(super) async fn drive(shard: Rc<Shard>, entry: Arc<TaskEntry>, call: Arc<Call>, turn: u64) {
    let calls = &shard.shared.calls;
    let Some(mut reader) = calls.reader(&call, None, Some(turn)) else {
        return fail(&entry, "the turn could not be read");
    };
    let watch = reader.watch.clone();
    loop {
        match reader.read(256, 256 * 1024) {
            Read::Replaced => return fail(&entry, "the turn was replaced"),
            Read::Wait => watch.rung().await,
            Read::Chunks { chunks, end, dropped } => {
                if dropped > 0 {
                    // The agent outran the turn's log: the answer has a hole, said so.
                    entry.update(now_ms(), |t| task::lost(t, dropped, &mut Now));
                }
                for c in &chunks {
                    let c = Chunk::of(c);
                    entry.update(now_ms(), |t| task::chunk(t, c, &mut Now));
                }
                if end {
                    return;
                }
            }
        }
    }
}

/// Fails the task, `why` its status message.
fn fail(entry: &TaskEntry, why: &str) {
    entry.update(now_ms(), |t| task::fail(t, why, &mut Now));
}
