//! Every delivery rule, driven through the machine's inputs with an in-memory log and a clock
//! the test moves by hand.

use std::cell::RefCell;

use frame_codec::{AttrValue, Attribute, DataKind, FrameBody, FrameHeader};

use super::*;
use crate::model::ShardId;

const TOPIC: &str = "t";
const EVENT_BYTES: usize = 100;

/// A log in memory: partition -> its events, offset = index.
#[derive(Default)]
struct Log {
    parts: RefCell<HashMap<u32, Vec<Frame>>>,
    /// `(max, max_bytes)` of every batch read, to check how far ahead the machine reads.
    reads: RefCell<Vec<(usize, usize)>>,
}

impl Log {
    /// Appends `n` events to `p`; returns them as an append hands them to the machine.
    fn append(&self, p: u32, n: usize) -> Arc<[Frame]> {
        let mut parts = self.parts.borrow_mut();
        let part = parts.entry(p).or_default();
        let mut out = Vec::new();
        for _ in 0..n {
            let o = part.len() as u64;
            let body = FrameBody {
                topic: TOPIC.into(),
                attributes: vec![
                    Attribute { name: "id".into(), value: AttrValue::Str(format!("{p}-{o}")) },
                    Attribute {
                        name: "type".into(),
                        value: AttrValue::Str(if o == 4999 { "rare" } else { "common" }.into()),
                    },
                ],
                data: vec![b'x'; EVENT_BYTES],
            };
            let mut f = Frame::encode(&FrameHeader::event(DataKind::Text), &body).unwrap();
            f.set_offset(o);
            f.set_partition(p);
            part.push(f.clone());
            out.push(f);
        }
        out.into()
    }
}

impl Source for Log {
    fn end(&self, _topic: &str, p: u32) -> Option<u64> {
        Some(self.parts.borrow().get(&p).map_or(0, |v| v.len() as u64))
    }

    fn read(&self, _topic: &str, p: u32, from: u64, max: usize, max_bytes: usize) -> Option<Vec<Frame>> {
        if max > 1 {
            self.reads.borrow_mut().push((max, max_bytes));
        }
        let parts = self.parts.borrow();
        let Some(part) = parts.get(&p) else { return Some(Vec::new()) };
        let (mut out, mut bytes) = (Vec::new(), 0);
        for f in part.iter().skip(from as usize) {
            if out.len() == max || bytes >= max_bytes {
                break;
            }
            bytes += f.as_bytes().len();
            out.push(f.clone());
        }
        Some(out)
    }
}

impl Log {
    /// Appends a request (request-reply) whose deadline is `deadline_us` to `p`.
    fn request(&self, p: u32, deadline_us: i64) -> Arc<[Frame]> {
        let f = self.append(p, 1)[0].clone();
        let mut h = f.header();
        (h.kind, h.sequence) = (FrameKind::Request, deadline_us as u64);
        let r = Frame::encode(&h, &f.to_body()).unwrap();
        let mut parts = self.parts.borrow_mut();
        *parts.get_mut(&p).unwrap().last_mut().unwrap() = r.clone();
        vec![r].into()
    }
}

/// The wall clock as the machine reads it, µs since the epoch (the test's in-memory log uses
/// the real one: deadlines are set relative to it).
fn wall() -> i64 {
    crate::model::clock::now_micros()
}

fn frame_bytes() -> usize {
    let log = Log::default();
    log.append(0, 1)[0].as_bytes().len()
}

fn key() -> ConsumerKey {
    ConsumerKey { subscription: "s".into(), client: String::new() }
}

fn sess(id: u64) -> SessionRef {
    SessionRef { shard: ShardId(0), id }
}

/// A machine with one consumer of partitions `parts`, from their starts (or `stored`).
fn setup(def: &str, parts: &[u32], stored: &[(u32, Stored)], now: Instant) -> Machine {
    setup_with(def, parts, stored, now, 1 << 20)
}

fn setup_with(def: &str, parts: &[u32], stored: &[(u32, Stored)], now: Instant, window_bytes: usize) -> Machine {
    setup_parsed(Definition::parse(def.as_bytes()).unwrap(), parts, stored, now, window_bytes)
}

fn setup_parsed(
    def: Definition,
    parts: &[u32],
    stored: &[(u32, Stored)],
    now: Instant,
    window_bytes: usize,
) -> Machine {
    let filters = Rc::new(def.compile_stored());
    let mut m = Machine::new(window_bytes, Duration::from_millis(100), 7);
    let positions = parts
        .iter()
        .map(|&p| (p, stored.iter().find(|(q, _)| *q == p).map_or_else(|| Stored::at(0), |(_, st)| st.clone())))
        .collect();
    m.create(&key(), Rc::new(def), filters, true, positions, now);
    m
}

const DEF: &str = r#"{"subscription":"s","topic":"t","ackTimeoutMs":1000,"maxAttempts":3}"#;

/// (session, partition, offset, attempt) of every delivery in `out`, in order.
fn delivered(out: &[Effect]) -> Vec<(u64, u32, u64, u16)> {
    let mut v = Vec::new();
    for e in out {
        if let Effect::Deliver { to, frames, pick, attempts, .. } = e {
            let idx: Vec<usize> = match pick {
                Some(p) => p.iter().map(|&i| i as usize).collect(),
                None => (0..frames.len()).collect(),
            };
            for (k, i) in idx.into_iter().enumerate() {
                let h = frames[i].header();
                v.push((to.id, h.partition, h.offset, attempts[k]));
            }
        }
    }
    v
}

fn dead(out: &[Effect]) -> Vec<(u32, u64, u16, &'static str)> {
    out.iter()
        .filter_map(|e| match e {
            Effect::DeadLetter { partition, offset, attempts, reason, .. } => {
                Some((*partition, *offset, *attempts, *reason))
            }
            _ => None,
        })
        .collect()
}

fn last_stored(out: &[Effect], p: u32) -> Option<Stored> {
    out.iter().rev().find_map(|e| match e {
        Effect::Persist { partition, stored, .. } if *partition == p => Some(stored.clone()),
        _ => None,
    })
}

fn ack(m: &mut Machine, log: &Log, p: u32, offsets: &[u64], kind: AckKind, now: Instant) -> Vec<Effect> {
    let mut out = Vec::new();
    assert!(m.ack(&key(), p, offsets, kind, now, log, &mut out));
    out
}

#[test]
fn partition_p_goes_to_session_p_mod_n_and_a_leaving_sessions_events_move_at_once() {
    let (log, now) = (Log::default(), Instant::now());
    let mut m = setup(DEF, &[0, 1, 2, 3], &[], now);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 10, Vec::new(), now, &log, &mut out);
    m.attach(&key(), sess(2), 10, Vec::new(), now, &log, &mut out);
    assert!(delivered(&out).is_empty());
    out.clear();
    for p in 0..4 {
        let fresh = log.append(p, 1);
        m.appended(TOPIC, &fresh, now, &log, &mut out);
    }
    assert_eq!(delivered(&out), [(1, 0, 0, 1), (2, 1, 0, 1), (1, 2, 0, 1), (2, 3, 0, 1)]);
    out.clear();
    // Session 2 leaves without acking: its events are attempts made, and go to session 1 now.
    m.detach(&key(), sess(2), now, &log, &mut out);
    assert_eq!(delivered(&out), [(1, 1, 0, 2), (1, 3, 0, 2)]);
}

#[test]
fn the_window_and_credit_bound_what_is_in_flight() {
    let (log, now) = (Log::default(), Instant::now());
    log.append(0, 5);
    let mut m = setup(DEF, &[0], &[], now);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 2, Vec::new(), now, &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 0, 1), (1, 0, 1, 1)]);
    let out = ack(&mut m, &log, 0, &[0], AckKind::Ack, now);
    assert_eq!(delivered(&out), [(1, 0, 2, 1)], "an ack makes room for one");
    let mut out = Vec::new();
    m.window(&key(), sess(1), 0, now, &log, &mut out);
    assert!(delivered(&out).is_empty());
    let out = ack(&mut m, &log, 0, &[1, 2], AckKind::Ack, now);
    assert!(delivered(&out).is_empty(), "credit 0 pauses");
    let mut out = Vec::new();
    m.window(&key(), sess(1), 10, now, &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 3, 1), (1, 0, 4, 1)]);
}

#[test]
fn the_byte_window_bounds_read_ahead_but_one_event_always_goes() {
    let (log, now) = (Log::default(), Instant::now());
    log.append(0, 100);
    let size = frame_bytes();
    // Room for 3 events' bytes; the window in events would allow 256.
    let mut m = setup_with(DEF, &[0], &[], now, 3 * size);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 256, Vec::new(), now, &log, &mut out);
    assert_eq!(delivered(&out).len(), 3);
    assert!(log.reads.borrow().iter().all(|&(_, max_bytes)| max_bytes <= 3 * size), "{:?}", log.reads.borrow());
    // A window smaller than one event still lets one through.
    let mut m = setup_with(DEF, &[0], &[], now, 1);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 256, Vec::new(), now, &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 0, 1)]);
    let out = ack(&mut m, &log, 0, &[0], AckKind::Ack, now);
    assert_eq!(delivered(&out), [(1, 0, 1, 1)]);
}

#[test]
fn an_ack_timeout_redelivers_after_the_backoff_then_dead_letters() {
    let (log, t0) = (Log::default(), Instant::now());
    log.append(0, 1);
    let mut m = setup(r#"{"subscription":"s","topic":"t","ackTimeoutMs":1000,"maxAttempts":2}"#, &[0], &[], t0);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 10, Vec::new(), t0, &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 0, 1)]);
    assert_eq!(last_stored(&out, 0).unwrap().attempts, [(0, 1)], "the attempt is on record as it goes out");
    let ms = Duration::from_millis;
    let mut out = Vec::new();
    m.tick(t0 + ms(999), &log, &mut out);
    assert!(out.is_empty(), "not timed out yet");
    let expired = t0 + ms(1001);
    m.tick(expired, &log, &mut out);
    assert!(delivered(&out).is_empty(), "waits for the backoff");
    let mut out = Vec::new();
    m.tick(expired + ms(99), &log, &mut out);
    assert!(delivered(&out).is_empty(), "backoff is at least the base");
    m.tick(expired + ms(121), &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 0, 2)], "and at most base + 20%");
    let mut out = Vec::new();
    m.tick(expired + ms(121) + ms(1001), &log, &mut out);
    assert_eq!(dead(&out), [(0, 0, 2, ACK_TIMEOUT)]);
    assert!(last_stored(&out, 0).is_none(), "held where it was until the dead letter is written");
    let gen = match &out.iter().find(|e| matches!(e, Effect::DeadLetter { .. })).unwrap() {
        Effect::DeadLetter { gen, .. } => *gen,
        _ => unreachable!(),
    };
    let mut out = Vec::new();
    assert!(m.dead_lettered(&key(), gen, 0, 0, 2, true, t0, &log, &mut out));
    assert_eq!(last_stored(&out, 0).unwrap().committed, 1, "then settled");
}

#[test]
fn nacks_redeliver_and_the_last_one_dead_letters_with_reason_nack() {
    let (log, t0) = (Log::default(), Instant::now());
    log.append(0, 1);
    let mut m = setup(r#"{"subscription":"s","topic":"t","ackTimeoutMs":60000,"maxAttempts":2}"#, &[0], &[], t0);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 10, Vec::new(), t0, &log, &mut out);
    let out = ack(&mut m, &log, 0, &[0], AckKind::Nack, t0);
    assert!(delivered(&out).is_empty() && dead(&out).is_empty());
    let mut out = Vec::new();
    m.tick(t0 + Duration::from_millis(121), &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 0, 2)]);
    let out = ack(&mut m, &log, 0, &[0], AckKind::Nack, t0);
    assert_eq!(dead(&out), [(0, 0, 2, NACK)]);
}

#[test]
fn a_failed_dead_letter_is_tried_again_later() {
    let (log, t0) = (Log::default(), Instant::now());
    log.append(0, 1);
    let mut m = setup(r#"{"subscription":"s","topic":"t","ackTimeoutMs":60000,"maxAttempts":1}"#, &[0], &[], t0);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 10, Vec::new(), t0, &log, &mut out);
    let out = ack(&mut m, &log, 0, &[0], AckKind::Nack, t0);
    let Some(Effect::DeadLetter { gen, .. }) = out.iter().find(|e| matches!(e, Effect::DeadLetter { .. })) else {
        panic!("{out:?}")
    };
    let mut out = Vec::new();
    assert!(m.dead_lettered(&key(), *gen, 0, 0, 1, false, t0, &log, &mut out));
    assert!(delivered(&out).is_empty() && dead(&out).is_empty(), "not at once");
    let mut out = Vec::new();
    m.tick(t0 + Duration::from_secs(2), &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 0, 1)], "delivered again as its last attempt");
    assert!(!m.dead_lettered(&key(), gen + 1, 0, 0, 1, true, t0, &log, &mut Vec::new()), "another incarnation");
}

#[test]
fn a_disconnect_is_an_attempt_and_attempts_survive_the_consumer_leaving() {
    let (log, t0) = (Log::default(), Instant::now());
    log.append(0, 1);
    let def = r#"{"subscription":"s","topic":"t","ackTimeoutMs":60000,"maxAttempts":2}"#;
    let mut m = setup(def, &[0], &[], t0);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 10, Vec::new(), t0, &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 0, 1)]);
    let mut out = Vec::new();
    m.detach(&key(), sess(1), t0, &log, &mut out);
    assert!(!m.contains(&key()), "no session left: no state kept here");
    let stored = last_stored(&out, 0).expect("its position is stored as it leaves");
    assert_eq!((stored.committed, stored.next, stored.attempts.clone()), (0, 1, vec![(0, 1)]));
    // Back (a restart reads the same stored value): attempt 2, the last.
    let mut m = setup(def, &[0], &[(0, stored)], t0);
    let mut out = Vec::new();
    m.attach(&key(), sess(2), 10, Vec::new(), t0, &log, &mut out);
    assert_eq!(delivered(&out), [(2, 0, 0, 2)]);
    let mut out = Vec::new();
    m.detach(&key(), sess(2), t0, &log, &mut out);
    assert_eq!(dead(&out), [(0, 0, 2, ACK_TIMEOUT)], "a poison pill is dead-lettered, not handed out forever");
}

#[test]
fn restored_attempts_that_ran_out_are_dead_lettered_not_delivered() {
    let (log, t0) = (Log::default(), Instant::now());
    log.append(0, 3);
    let stored = Stored { committed: 0, next: 2, seen_ms: 0, attempts: vec![(0, 3), (1, 1)] };
    let mut m = setup(DEF, &[0], &[(0, stored)], t0);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 10, Vec::new(), t0, &log, &mut out);
    assert_eq!(dead(&out), [(0, 0, 3, ACK_TIMEOUT)]);
    // 1 was delivered once before: attempt 2; 2 was never delivered: attempt 1. Offsets below
    // `next` that are not listed were settled and do not come back.
    assert_eq!(delivered(&out), [(1, 0, 1, 2), (1, 0, 2, 1)]);
}

#[test]
fn a_redelivery_goes_out_before_any_newer_event_of_its_partition() {
    let (log, t0) = (Log::default(), Instant::now());
    log.append(0, 3);
    let mut m = setup(DEF, &[0], &[], t0);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 1, Vec::new(), t0, &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 0, 1)]);
    let out = ack(&mut m, &log, 0, &[0], AckKind::Nack, t0);
    assert!(delivered(&out).is_empty(), "1 waits behind 0's redelivery, though the window has room");
    let mut out = Vec::new();
    m.tick(t0 + Duration::from_millis(121), &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 0, 2)]);
    let out = ack(&mut m, &log, 0, &[0], AckKind::Ack, t0);
    assert_eq!(delivered(&out), [(1, 0, 1, 1)]);
}

#[test]
fn the_committed_offset_is_the_lowest_unsettled_and_only_moves_forward() {
    let (log, t0) = (Log::default(), Instant::now());
    log.append(0, 3);
    let mut m = setup(DEF, &[0], &[], t0);
    m.attach(&key(), sess(1), 10, Vec::new(), t0, &log, &mut Vec::new());
    let out = ack(&mut m, &log, 0, &[1], AckKind::Ack, t0);
    let st = last_stored(&out, 0).unwrap();
    assert_eq!((st.committed, st.next, st.attempts), (0, 3, vec![(0, 1), (2, 1)]));
    let out = ack(&mut m, &log, 0, &[0], AckKind::Ack, t0);
    assert_eq!(last_stored(&out, 0).unwrap().committed, 2);
    let out = ack(&mut m, &log, 0, &[0, 1], AckKind::Ack, t0);
    assert!(last_stored(&out, 0).is_none(), "acks again change nothing, so nothing is written");
}

#[test]
fn an_up_to_ack_settles_everything_delivered_up_to_it_and_nothing_past_what_was_delivered() {
    let (log, t0) = (Log::default(), Instant::now());
    log.append(0, 4);
    let mut m = setup(DEF, &[0], &[], t0);
    m.attach(&key(), sess(1), 3, Vec::new(), t0, &log, &mut Vec::new());
    let out = ack(&mut m, &log, 0, &[9], AckKind::UpTo, t0);
    assert!(last_stored(&out, 0).is_none(), "an id past what was delivered is ignored");
    let out = ack(&mut m, &log, 0, &[1], AckKind::UpTo, t0);
    assert_eq!(last_stored(&out, 0).unwrap().committed, 2);
    assert_eq!(delivered(&out), [(1, 0, 3, 1)], "the window had room again for two; one was left");
}

#[test]
fn a_selective_filter_over_a_long_backlog_continues_in_bounded_turns() {
    let (log, t0) = (Log::default(), Instant::now());
    log.append(0, 5000);
    let def = r#"{"subscription":"s","topic":"t","filters":[{"exact":{"type":"rare"}}]}"#;
    let mut m = setup(def, &[0], &[], t0);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 10, Vec::new(), t0, &log, &mut out);
    assert!(delivered(&out).is_empty());
    assert!(out.iter().any(|e| matches!(e, Effect::Continue { partition: 0, .. })), "{out:?}");
    let mut out = Vec::new();
    m.pump(&key(), 0, None, t0, &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 4999, 1)]);
}

#[test]
fn a_caught_up_consumer_takes_appended_events_without_reading_the_log() {
    let (log, t0) = (Log::default(), Instant::now());
    let mut m = setup(DEF, &[0], &[], t0);
    m.attach(&key(), sess(1), 10, Vec::new(), t0, &log, &mut Vec::new());
    let reads_before = log.reads.borrow().len();
    let fresh = log.append(0, 3);
    let mut out = Vec::new();
    m.appended(TOPIC, &fresh, t0, &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 0, 1), (1, 0, 1, 1), (1, 0, 2, 1)]);
    assert_eq!(log.reads.borrow().len(), reads_before);
    let persist_at = out.iter().position(|e| matches!(e, Effect::Persist { .. })).unwrap();
    let deliver_at = out.iter().position(|e| matches!(e, Effect::Deliver { .. })).unwrap();
    assert!(persist_at < deliver_at, "attempts are on record before the events go out");
}

#[test]
fn backoff_doubles_to_sixteen_times_with_bounded_jitter() {
    let mut rng = 7u64;
    let base = Duration::from_millis(1000);
    for (attempt, times) in [(1u16, 1u32), (2, 2), (3, 4), (4, 8), (5, 16), (9, 16)] {
        for _ in 0..50 {
            let b = Jitter(&mut rng).backoff(base, attempt);
            assert!(b >= base * times && b <= (base * times).mul_f64(1.2), "attempt {attempt}: {b:?}");
        }
    }
}

#[test]
fn committed_is_the_lowest_unsettled_offset() {
    let mut part = Part { next: 10, ..Part::default() };
    assert_eq!(part.committed(), 10);
    part.inflight.insert(7, InFlight { attempt: 1, session: sess(1), bytes: 10, rpc: false, trace: None });
    part.later.make().retry.insert(5, Retry { attempt: 1, due: Instant::now() });
    assert_eq!(part.committed(), 5);
    part.later.make().retry.clear();
    part.later.make().dead.insert(6, 3);
    assert_eq!(part.committed(), 6);
}

#[test]
fn a_request_past_its_deadline_is_skipped_at_dispatch_and_counted() {
    let (log, now) = (Log::default(), Instant::now());
    log.request(0, wall() - 1);
    log.append(0, 1);
    log.request(0, wall() + 60_000_000);
    let mut m = setup(DEF, &[0], &[], now);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 10, Vec::new(), now, &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 1, 1), (1, 0, 2, 1)], "the expired request at 0 is not sent");
    assert_eq!(m.expired, 1);
    // Fresh from an append too.
    let mut out = Vec::new();
    let fresh = log.request(0, wall() - 1);
    m.appended(TOPIC, &fresh, now, &log, &mut out);
    assert!(delivered(&out).is_empty());
    assert_eq!(m.expired, 2);
    let out = ack(&mut m, &log, 0, &[1, 2], AckKind::Ack, now);
    assert_eq!(last_stored(&out, 0).map(|s| s.committed), Some(4), "skipped requests are settled");
}

#[test]
fn a_request_is_settled_not_retried_on_nack_ack_timeout_or_detach() {
    let (log, now) = (Log::default(), Instant::now());
    let later = wall() + 60_000_000;
    for _ in 0..3 {
        log.request(0, later);
    }
    let def = r#"{"subscription":"s","topic":"t","ackTimeoutMs":1000,"maxAttempts":1}"#;
    let mut m = setup(def, &[0], &[], now);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 10, Vec::new(), now, &log, &mut out);
    assert_eq!(delivered(&out).len(), 3);
    let out = ack(&mut m, &log, 0, &[0], AckKind::Nack, now);
    assert!(delivered(&out).is_empty() && dead(&out).is_empty(), "a nacked request is settled");
    let mut out = Vec::new();
    m.tick(now + Duration::from_secs(2), &log, &mut out);
    assert!(delivered(&out).is_empty() && dead(&out).is_empty(), "an unacked one too");
    log.request(0, later);
    let mut out = Vec::new();
    m.attach(&key(), sess(2), 10, Vec::new(), now, &log, &mut out);
    m.detach(&key(), sess(2), now, &log, &mut out);
    m.detach(&key(), sess(1), now, &log, &mut out);
    assert!(dead(&out).is_empty());
    assert_eq!(last_stored(&out, 0).map(|s| (s.committed, s.attempts.len())), Some((4, 0)));
}

#[test]
fn a_request_restored_among_redeliveries_is_settled_when_read() {
    let (log, now) = (Log::default(), Instant::now());
    log.request(0, wall() + 60_000_000);
    log.append(0, 1);
    // Both delivered once before a restart, one attempt left for the event.
    let stored = Stored { committed: 0, next: 2, seen_ms: 0, attempts: vec![(0, 1), (1, 1)] };
    let def = r#"{"subscription":"s","topic":"t","ackTimeoutMs":1000,"maxAttempts":2}"#;
    let mut m = setup(def, &[0], &[(0, stored.clone())], now);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 10, Vec::new(), now, &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 1, 2)], "the event again, the request not");
    // With its attempts spent: still never dead-lettered.
    let def = r#"{"subscription":"s","topic":"t","ackTimeoutMs":1000,"maxAttempts":1}"#;
    let mut m = setup(def, &[0], &[(0, stored)], now);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 10, Vec::new(), now, &log, &mut out);
    assert_eq!(dead(&out), [(0, 1, 1, ACK_TIMEOUT)], "only the event is dead-lettered");
}

/// A webhook sink's subscription: one event of a partition in flight at a time, so a failed
/// one holds its partition (not the others) until it is delivered again or dead-lettered.
#[test]
fn a_sink_gets_one_event_per_partition_at_a_time_and_a_failure_holds_the_partition() {
    let def = r#"{"subscription":"s","topic":"t","ackTimeoutMs":60000,"maxAttempts":2,"sink":"http://127.0.0.1:9/"}"#;
    one_event_per_partition_at_a_time(Definition::parse(def.as_bytes()).unwrap());
}

/// A classic group's subscription (pushed to its URLs) keeps the same order (a regression: it
/// had the window of a client's, so a retried event could arrive after a newer one).
#[test]
fn a_classic_group_gets_one_event_per_partition_at_a_time() {
    let def = r#"{"subscription":"s","topic":"t","ackTimeoutMs":60000,"maxAttempts":2}"#;
    let def = Definition { classic: true, ..Definition::parse(def.as_bytes()).unwrap() };
    one_event_per_partition_at_a_time(def);
}

fn one_event_per_partition_at_a_time(def: Definition) {
    let (log, t0) = (Log::default(), Instant::now());
    log.append(0, 3);
    log.append(1, 2);
    let mut m = setup_parsed(def, &[0, 1], &[], t0, 1 << 20);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 16, Vec::new(), t0, &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 0, 1), (1, 1, 0, 1)], "one per partition, whatever the window");
    let out = ack(&mut m, &log, 0, &[0], AckKind::Nack, t0);
    assert!(delivered(&out).is_empty(), "offset 1 waits behind the failed 0");
    let out = ack(&mut m, &log, 1, &[0], AckKind::Ack, t0);
    assert_eq!(delivered(&out), [(1, 1, 1, 1)], "the other partition goes on");
    let mut out = Vec::new();
    m.tick(t0 + Duration::from_millis(121), &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 0, 2)], "the failed one again, alone");
    let out = ack(&mut m, &log, 0, &[0], AckKind::Nack, t0);
    assert_eq!(dead(&out), [(0, 0, 2, NACK)]);
    assert!(delivered(&out).is_empty(), "still held while it is being dead-lettered");
    let Some(Effect::DeadLetter { gen, .. }) = out.iter().find(|e| matches!(e, Effect::DeadLetter { .. })) else {
        panic!("{out:?}")
    };
    let mut out = Vec::new();
    assert!(m.dead_lettered(&key(), *gen, 0, 0, 2, true, t0, &log, &mut out));
    assert_eq!(delivered(&out), [(1, 0, 1, 1)], "then the partition goes on in order");
}

/// A sink's `Retry-After` defers the event at least that long, longer than the backoff.
#[test]
fn a_deferred_event_waits_as_long_as_asked_and_counts_as_an_attempt() {
    let (log, t0) = (Log::default(), Instant::now());
    log.append(0, 1);
    let mut m = setup(r#"{"subscription":"s","topic":"t","ackTimeoutMs":60000,"maxAttempts":3}"#, &[0], &[], t0);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 10, Vec::new(), t0, &log, &mut out);
    let out = ack(&mut m, &log, 0, &[0], AckKind::Defer(5_000), t0);
    assert!(delivered(&out).is_empty());
    let mut out = Vec::new();
    m.tick(t0 + Duration::from_millis(4_900), &log, &mut out);
    assert!(delivered(&out).is_empty(), "not before the 5 s asked (the backoff is 100 ms)");
    m.tick(t0 + Duration::from_millis(5_001), &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 0, 2)]);
}

/// A webhook session holding its sink gives events back: not an attempt, due after the wait.
#[test]
fn a_released_event_keeps_its_attempt_count_and_waits() {
    let (log, t0) = (Log::default(), Instant::now());
    log.append(0, 1);
    let mut m = setup(r#"{"subscription":"s","topic":"t","ackTimeoutMs":60000,"maxAttempts":1}"#, &[0], &[], t0);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 10, Vec::new(), t0, &log, &mut out);
    let out = ack(&mut m, &log, 0, &[0], AckKind::Release(2_000), t0);
    assert!(delivered(&out).is_empty() && dead(&out).is_empty(), "its one attempt is not used up");
    let mut out = Vec::new();
    m.tick(t0 + Duration::from_millis(1_900), &log, &mut out);
    assert!(delivered(&out).is_empty());
    m.tick(t0 + Duration::from_millis(2_001), &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 0, 1)], "delivered again as attempt 1");
}

/// A partition with nothing in flight gives back what its maps grew at the next tick: an idle
/// acknowledged session held an emptied `BTreeMap`'s node (456 bytes) and the deadlines'
/// buffer (128) from its first event on, then the 80 bytes of the emptied queue and maps.
#[test]
fn a_partition_with_nothing_in_flight_gives_its_room_back_at_the_tick() {
    let (log, now) = (Log::default(), Instant::now());
    log.append(0, 3);
    let mut m = setup(DEF, &[0], &[], now);
    let mut out = Vec::new();
    m.attach(&key(), sess(1), 10, Vec::new(), now, &log, &mut out);
    assert_eq!(delivered(&out).len(), 3);
    let room = |m: &Machine| {
        let later = &m.consumers.get(&key()).expect("the consumer").parts.0[0].1.later;
        later.deadlines.capacity() + usize::from(later.is_held())
    };
    ack(&mut m, &log, 0, &[0, 1], AckKind::Ack, now);
    m.tick(now, &log, &mut Vec::new());
    assert!(room(&m) > 0, "one event still in flight: its room is kept");
    ack(&mut m, &log, 0, &[2], AckKind::Ack, now);
    m.tick(now, &log, &mut Vec::new());
    assert_eq!(room(&m), 0, "nothing in flight: the room is given back");
    // And taken again by the next delivery.
    let mut out = Vec::new();
    let fresh = log.append(0, 1);
    m.appended(TOPIC, &fresh, now, &log, &mut out);
    assert_eq!(delivered(&out), [(1, 0, 3, 1)]);
}

/// The in-flight set keeps one event inline and more in a map, in offset order either way,
/// whatever the order they come and go in (a redelivery puts an older offset back).
#[test]
fn in_flight_events_are_kept_in_offset_order_inline_or_in_the_map() {
    let f = |attempt| InFlight { attempt, session: sess(1), bytes: 10, rpc: false, trace: None };
    let mut set = InFlights::default();
    let offsets = |s: &InFlights| s.iter().map(|(o, f)| (o, f.attempt)).collect::<Vec<_>>();
    set.insert(5, f(1));
    assert_eq!((offsets(&set), set.len(), set.first()), (vec![(5, 1)], 1, Some(5)));
    set.insert(5, f(2));
    assert_eq!(offsets(&set), [(5, 2)], "the same offset again replaces it");
    set.insert(3, f(1));
    set.insert(9, f(1));
    assert_eq!((offsets(&set), set.len(), set.first()), (vec![(3, 1), (5, 2), (9, 1)], 3, Some(3)));
    assert_eq!(set.get(5).map(|f| f.attempt), Some(2));
    assert!(set.remove(4).is_none() && set.get(4).is_none());
    assert_eq!(set.remove(3).map(|f| f.attempt), Some(1));
    assert_eq!(set.remove(9).map(|f| f.attempt), Some(1));
    assert_eq!((offsets(&set), set.first()), (vec![(5, 2)], Some(5)));
    assert_eq!(set.remove(5).map(|f| f.attempt), Some(2));
    assert!(set.is_empty() && set.first().is_none() && set.remove(5).is_none());
    set.insert(1, f(1));
    assert_eq!(offsets(&set), [(1, 1)], "inline again once emptied");
}
