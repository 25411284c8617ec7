//! Classic EventMesh HTTP (MeshMessage) on the traffic listener (SPEC, "Other protocols"): a
//! POST whose path is none of evmesh's own, dispatched on its `code` header (the classic SDKs
//! post to `/`), and `POST /eventmesh/publish` (a send) and `/eventmesh/publish/batch` (a
//! batch). Sends go through the one ingress path as [`ClassicSend`] adaptors; every answer is
//! HTTP 200 with `{"retCode","retMsg","resTime"}` (the conversions are
//! `evmesh_protocol::adaptor::meshmessage`).
//!
//! Built: 104 (send), 107 (one message of a batch), 102 (a batch, each message through the
//! ingress in turn; a failure stops it and is answered, the messages before it stay stored),
//! 203 (heartbeat: answered, nothing to keep). Answered with a clear retCode until their
//! transports land: 101 (sync send, 3), 301 (reply, 16), 206/207 (subscribe with a push `url`,
//! 19: the webhook transport). Any other code is HTTP 400 with retCode 2, as EventMesh answers.
//! `producergroup` is accepted and ignored; `username`/`passwd` are not credentials here (with
//! `auth` on, a classic client sends `Authorization: Bearer`).

use std::borrow::Cow;

use frame_codec::Frame;

use super::adaptor::{FrameAdaptor, Placed, Refusal};
use super::{Gate, Traffic};
use crate::adaptor::meshmessage::{self, code, ret, Form, Message, Refused};
use crate::http::{Method, StatusCode};
use crate::server::{Request, Response};

/// Messages one 102 batch may carry (EventMesh's `maxEventBatchSize` default).
const MAX_BATCH: usize = 10;

/// The classic answer envelope, HTTP 200 (`status` 400 for an unknown code, as EventMesh).
fn answer(status: StatusCode, ret: u16, msg: &str) -> Response {
    let now_ms = crate::clock::now_micros() / 1000;
    Response::json(status, meshmessage::answer(ret, msg, now_ms))
}

fn refused(r: &Refused) -> Response {
    answer(StatusCode::OK, r.ret, &r.msg)
}

/// One classic message's publish (104, 107, one of a 102 batch, `/eventmesh/publish`).
struct ClassicSend<'f> {
    message: Message<'f>,
}

impl FrameAdaptor for ClassicSend<'_> {
    fn topic<'r>(&self, _req: &Request<'r>) -> Result<Cow<'r, str>, Refusal> {
        Ok(Cow::Owned(self.message.topic.to_owned()))
    }

    fn frames(&self, topic: &str, _req: &Request<'_>) -> Result<Vec<Frame>, Refusal> {
        self.message.to_frame(topic).map(|f| vec![f]).map_err(|r| Refusal::Answered(refused(&r)))
    }

    fn accepted(&self, _req: &Request<'_>, placed: &[Placed<'_>]) -> Response {
        let p = &placed[0];
        // EventMesh answers "success" followed by its send result; the partition and offset
        // are evmesh's.
        answer(StatusCode::OK, ret::SUCCESS, &format!("success partition={} offset={}", p.partition, p.offset))
    }

    fn refused(&self, problem: Response) -> Response {
        let (status, detail) = super::ws_publish::refusal(&problem);
        answer(StatusCode::OK, meshmessage::ret_for_status(status, false), &detail)
    }
}

impl Traffic {
    /// A classic request: `POST /eventmesh/publish[/batch]`, or any other path with a `code`.
    pub(super) async fn meshmessage(&self, gate: &mut Gate<'_>, req: &Request<'_>) -> Response {
        if req.method() != Method::Post {
            return answer(StatusCode::METHOD_NOT_ALLOWED, ret::REQUEST_CODE_INVALID, "classic requests are POSTs")
                .with_header("allow", "POST");
        }
        let code = match req.path() {
            "/eventmesh/publish" => Some(code::SEND_ASYNC),
            "/eventmesh/publish/batch" => Some(code::BATCH),
            _ => req.header("code").and_then(|c| std::str::from_utf8(c).ok()?.trim().parse::<u16>().ok()),
        };
        let path_route = req.path().starts_with("/eventmesh/");
        let checked = || -> Result<Form, Refused> {
            // Path routes take the client headers' defaults (as EventMesh's do).
            if !path_route {
                meshmessage::check_client(|name| req.header(name))?;
            }
            Form::parse(req.body)
        };
        match code {
            Some(c @ (code::SEND_ASYNC | code::BATCH_V2)) => {
                if let Err(r) = meshmessage::check_protocol_type(req.header("protocoltype")) {
                    return refused(&r);
                }
                let form = match checked() {
                    Ok(f) if c == code::BATCH_V2 => meshmessage::batch_v2(&f),
                    Ok(f) => f,
                    Err(r) => return refused(&r),
                };
                match Message::from_form(&form, false) {
                    Ok(message) => self.publish_with(&ClassicSend { message }, gate, req).await,
                    Err(r) => refused(&r),
                }
            }
            Some(code::BATCH) => {
                let messages = match checked().and_then(|f| meshmessage::batch(&f, MAX_BATCH)) {
                    Ok(m) => m,
                    Err(r) => return refused(&r),
                };
                let n = messages.len();
                for (_, form) in &messages {
                    let adaptor = match Message::from_form(form, false) {
                        Ok(message) => ClassicSend { message },
                        Err(r) => return refused(&r),
                    };
                    match Box::pin(self.ingest(&adaptor, gate, req)).await {
                        Ok(_) => {}
                        Err(Refusal::Answered(a)) => return a,
                        Err(Refusal::Problem(p)) => return adaptor.refused(p),
                    }
                }
                answer(StatusCode::OK, ret::SUCCESS, &format!("success: {n} messages"))
            }
            Some(code::HEARTBEAT) => match checked() {
                Ok(_) => answer(StatusCode::OK, ret::SUCCESS, "success"),
                Err(r) => refused(&r),
            },
            Some(code::SEND_SYNC) => answer(
                StatusCode::OK,
                ret::SEND_SYNC_ERR,
                "sync send (101) is not served yet: use POST /events/request (request-reply)",
            ),
            Some(code::REPLY) => answer(StatusCode::OK, 16, "reply (301) is not served yet: use POST /events/reply"),
            Some(code::SUBSCRIBE | code::UNSUBSCRIBE) => answer(
                StatusCode::OK,
                ret::SUBSCRIBE_ERR,
                "subscriptions with a push url are not served yet: use POST /events/subscribe and a WebSocket, SSE or long-poll session",
            ),
            _ => answer(StatusCode::BAD_REQUEST, ret::REQUEST_CODE_INVALID, "requestCode can't be null, or must be number"),
        }
    }
}
