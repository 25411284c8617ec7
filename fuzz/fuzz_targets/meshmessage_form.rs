//! Classic EventMesh HTTP bodies (form-urlencoded, or the JSON of the path routes) on arbitrary
//! bytes: never panic; an accepted send becomes a frame that renders as a CloudEvent the HTTP
//! ingress accepts with the same attributes, and its push form parses back to the same content,
//! bizseqno and uniqueid; a batch never yields more messages than its cap, nor a subscribe or
//! unsubscribe more topics than theirs (and never a blank url, group or topic).
#![no_main]

use evmesh_protocol::adaptor::cloudevents;
use evmesh_protocol::adaptor::meshmessage::{
    batch, batch_v2, push_form, subscribe, subscribe_json, Form, Message, Subscribe, MAX_SUBSCRIBE_TOPICS,
};
use libfuzzer_sys::fuzz_target;

fn check_send(form: &Form) {
    for sync in [false, true] {
        let Ok(m) = Message::from_form(form, sync) else { continue };
        let Ok(frame) = m.to_frame("fuzz") else { continue };
        let mut out = Vec::new();
        cloudevents::write_structured(&frame, &[], &mut out);
        let again =
            cloudevents::parse_structured("fuzz", &out).expect("a classic message renders as an accepted CloudEvent");
        assert_eq!(again.to_body().attributes, frame.to_body().attributes);
        let pushed = Form::parse(&push_form(&frame, "fuzz", "1")).expect("a push form parses");
        assert_eq!(pushed.get("content"), Some(m.content));
        assert_eq!((pushed.get("bizseqno"), pushed.get("uniqueId")), (Some(m.bizseqno), Some(m.uniqueid)));
    }
}

fn check_subscribe(s: Subscribe) {
    assert!(!s.items.is_empty() && s.items.len() <= MAX_SUBSCRIBE_TOPICS);
    assert!(!s.url.trim().is_empty() && !s.group.trim().is_empty());
    assert!(s.items.iter().all(|i| !i.topic.trim().is_empty()));
}

fuzz_target!(|data: &[u8]| {
    for unsubscribe in [false, true] {
        if let Ok(s) = subscribe_json(data, unsubscribe) {
            check_subscribe(s);
        }
    }
    for form in [Form::parse(data), Form::from_json(data)].into_iter().flatten() {
        for unsubscribe in [false, true] {
            if let Ok(s) = subscribe(&form, unsubscribe) {
                check_subscribe(s);
            }
        }
        check_send(&form);
        check_send(&batch_v2(&form));
        if let Ok(messages) = batch(&form, 10) {
            assert!(!messages.is_empty() && messages.len() <= 10);
            for (_, f) in &messages {
                check_send(f);
            }
        }
    }
});
