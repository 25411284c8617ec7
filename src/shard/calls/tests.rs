//! The sessions' rules, driven through [`Calls`] as the ingress and the push side call it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::*;

fn text(seq: u64, t: &str) -> Chunk<'_> {
    Chunk { seq: Some(seq), turn: None, data: ChunkData::Text(t), done: false, error: None, chunk_type: None }
}

fn seqs(r: Read) -> (u64, Vec<u64>, bool) {
    match r {
        Read::Chunks { dropped, chunks, end } => (dropped, chunks.iter().map(|f| f.header().sequence).collect(), end),
        Read::Wait => (0, vec![], false),
        Read::Replaced => panic!("replaced"),
    }
}

fn open(calls: &Calls, key: &str) -> Arc<Call> {
    calls.open(key.into(), ("a".into(), format!("a:{key}")), None, 0).unwrap()
}

/// Starts a turn routed to attachment 1 whose request reached the agent.
fn turn(calls: &Calls, key: &str, call: &Arc<Call>) -> u64 {
    let t = calls.start_turn(call, 0).unwrap();
    calls.route(call, t, 1);
    assert!(calls.delivering(key, t));
    t
}

const A: (&str, Option<u64>) = ("a", Some(1));

#[test]
fn a_turn_streams_in_order_and_ends_with_its_last_chunk() {
    let calls = Calls::new(10);
    let call = open(&calls, "s");
    assert!(calls.reader(&call, None, None).is_none(), "no turn yet");
    assert_eq!(calls.chunk("s", A, &text(0, "x"), 1), Err(Refused::NoTurn));
    turn(&calls, "s", &call);
    assert!(calls.start_turn(&call, 1).is_err(), "one turn at a time");
    let mut r = calls.reader(&call, None, None).unwrap();
    assert!(matches!(r.read(10, 1 << 20), Read::Wait));
    assert_eq!(calls.chunk("s", ("b", None), &text(0, "x"), 1), Err(Refused::NotYours));
    assert_eq!(calls.chunk("t", A, &text(0, "x"), 1), Err(Refused::Unknown));
    assert_eq!(calls.chunk("s", ("a", Some(2)), &text(0, "x"), 1), Err(Refused::Stale), "another attachment's");
    assert_eq!(calls.chunk("s", A, &text(1, "x"), 1), Ok(Taken::Stored));
    assert_eq!(calls.chunk("s", ("a", None), &text(1, "again"), 1), Ok(Taken::Duplicate));
    let done =
        Chunk { seq: None, turn: Some(1), data: ChunkData::Json(b"{}"), done: true, error: None, chunk_type: None };
    assert_eq!(calls.chunk("s", A, &done, 1), Ok(Taken::Stored));
    assert_eq!(seqs(r.read(1, 1 << 20)), (0, vec![1], false), "at most max");
    assert_eq!(seqs(r.read(10, 1 << 20)), (0, vec![2], true));
    assert_eq!(calls.chunk("s", A, &text(3, "late"), 1), Err(Refused::NoTurn));
    // Read to its end, the turn keeps only its last chunk: a resume from before is told.
    assert_eq!(seqs(calls.reader(&call, Some(0), None).unwrap().read(10, 1 << 20)), (1, vec![2], true));
    assert!(calls.reader(&call, Some(2), None).is_none());
    let held = calls.held();
    assert!(held > 0 && held < 1024, "{held}");
    // The next turn frees the last one's chunks, and ends its reader.
    let t2 = calls.start_turn(&call, 2).unwrap();
    assert!(matches!(r.read(10, 1 << 20), Read::Replaced));
    assert_eq!(calls.held(), 0);
    assert!(calls.reader(&call, None, Some(t2 - 1)).is_none(), "a stream of an older turn");
}

#[test]
fn chunks_of_an_older_turn_or_before_the_request_reached_the_agent_are_stale() {
    let calls = Calls::new(10);
    let call = open(&calls, "s");
    let t1 = turn(&calls, "s", &call);
    calls.chunk("s", A, &text(5, "x"), 0).unwrap();
    assert!(calls.end_turn(&call, End::Cancelled, 0));
    // Turn 2 is in progress, but its request has not reached the agent: the agent's chunk
    // 6 answers turn 1 (it had not heard of the cancel). Turn 2's own chunks, from 0, count.
    let t2 = calls.start_turn(&call, 0).unwrap();
    calls.route(&call, t2, 1);
    assert_eq!(calls.chunk("s", A, &text(6, "late"), 0), Err(Refused::Stale));
    assert!(!calls.delivering("s", t1), "a request of an ended turn is not sent");
    assert!(calls.delivering("s", t2));
    let stale = Chunk { turn: Some(t1), ..text(7, "late") };
    assert_eq!(calls.chunk("s", A, &stale, 0), Err(Refused::Stale), "it says which turn it answers");
    assert_eq!(calls.chunk("s", A, &text(0, "fresh"), 0), Ok(Taken::Stored));
    // seq is a CloudEvents integer; an agent cannot wrap the ids.
    assert!(matches!(calls.chunk("s", A, &text(u64::MAX, "x"), 0), Err(Refused::Invalid(_))));
    calls.chunk("s", A, &text(MAX_SEQ, "x"), 0).unwrap();
    let next = Chunk { seq: None, ..text(0, "x") };
    assert!(matches!(calls.chunk("s", A, &next, 0), Err(Refused::Invalid(_))));
    // The broker's end still comes after it.
    assert!(calls.end_turn(&call, End::Cancelled, 0));
}

#[test]
fn a_reader_past_the_ring_is_told_what_it_lost_and_the_end_is_kept() {
    let calls = Calls::new(10);
    let call = open(&calls, "s");
    turn(&calls, "s", &call);
    let mut r = calls.reader(&call, None, None).unwrap();
    for seq in 0..(SINK_CHUNKS as u64 + 10) {
        calls.chunk("s", A, &text(seq, "tok"), 0).unwrap();
    }
    assert!(calls.end_turn(&call, End::Cancelled, 0));
    // Resuming from before the ring says what is gone, too.
    let (dropped, got, _) = seqs(calls.reader(&call, Some(3), None).unwrap().read(1, 1 << 20));
    assert_eq!((dropped, got), (7, vec![11]));
    // (That reader replaced the first: a new one from the start.)
    let mut r2 = calls.reader(&call, None, None).unwrap();
    assert!(matches!(r.read(1, 1), Read::Replaced));
    let (dropped, got, end) = seqs(r2.read(SINK_CHUNKS * 2, usize::MAX));
    assert_eq!(dropped, 11);
    assert_eq!(got.len(), SINK_CHUNKS);
    assert_eq!(got.last(), Some(&(SINK_CHUNKS as u64 + 10)));
    assert!(end);
    assert_eq!(calls.dropped.load(Ordering::Relaxed), 11);
}

#[test]
fn every_chunk_counts_against_the_budget_and_a_closed_session_gives_it_back() {
    let calls = Calls::new(10);
    let call = open(&calls, "s");
    turn(&calls, "s", &call);
    let empty = Chunk { seq: None, turn: None, data: ChunkData::None, done: false, error: None, chunk_type: None };
    calls.chunk("s", A, &empty, 0).unwrap();
    let one = calls.held();
    assert!(one > 100, "an empty chunk is a frame all the same: {one}");
    calls.chunk("s", A, &empty, 0).unwrap();
    assert_eq!(calls.held(), 2 * one);
    let reader = calls.reader(&call, None, None).unwrap();
    calls.close("s", End::Closed, 0).unwrap();
    assert!(calls.held() > 2 * one, "the end is kept for the reader");
    drop(call);
    assert!(calls.held() > 0, "while the reader has the session");
    drop(reader);
    assert_eq!(calls.held(), 0);
}

#[test]
fn sessions_expire_close_and_lose_their_agent_attachment() {
    let calls = Calls::new(2);
    let call = open(&calls, "s");
    open(&calls, "t");
    assert_eq!(calls.open("u".into(), ("a".into(), "a:u".into()), None, 0).err(), Some(Full));
    assert_eq!(calls.sessions_of("a"), 2);
    turn(&calls, "s", &call);
    assert_eq!(calls.agent_gone("a", 2, 5), 0, "another attachment of the agent");
    assert_eq!(calls.agent_gone("a", 1, 5), 1);
    let mut r = calls.reader(&call, None, None).unwrap();
    let Read::Chunks { chunks, end: true, .. } = r.read(10, 1 << 20) else { panic!("ended") };
    assert_eq!(chunks[0].body().attr_str("emerror"), Some("the agent disconnected"));
    calls.touch(&call, 100);
    let gone = calls.expire(150, 60);
    assert_eq!(gone.len(), 1, "only the idle one");
    assert_eq!(gone[0].0, "t");
    assert!(calls.close("s", End::Closed, 200).is_some() && calls.is_empty());
    assert_eq!(calls.sessions_of("a"), 0);
    assert!(calls.start_turn(&call, 300).is_err(), "a closed session takes no turn");
}
