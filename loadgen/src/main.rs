//! loadgen: keep-alive HTTP publishers over many connections, on their own threads.
//!
//! Closed loop (`--rate 0`): every connection sends its next request as soon as the previous one
//! is answered, measuring the maximum rate. Open loop (`--rate R`): requests are scheduled at a
//! fixed total rate; a request that could not be sent on time because its connection was still
//! waiting for the server is measured from its *scheduled* time, so a stalled server is charged
//! for the requests it delayed (coordinated omission corrected, as wrk2 does).
//!
//! With `--server-pid`, the server's CPU time over the measured window is read from /proc and
//! reported per operation. Prints a human summary; `--json FILE` writes the same as JSON.

mod args;
mod fanout;
mod http;
mod respond;
mod tcppub;
mod turns;
mod wspub;

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use monoio::io::AsyncWriteRentExt;
use monoio::net::TcpStream;

use args::Args;

struct ThreadResult {
    hist: Histogram<u64>,
    ok: u64,
    errors: u64,
    connect_errors: u64,
}

impl ThreadResult {
    fn new() -> ThreadResult {
        ThreadResult {
            hist: Histogram::new_with_bounds(1, 60_000_000, 3).unwrap(),
            ok: 0,
            errors: 0,
            connect_errors: 0,
        }
    }
}

/// Server CPU time (user + system) in microseconds, from /proc/PID/stat.
fn cpu_micros(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let (utime, stime): (u64, u64) = (f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Some((utime + stime) * 1_000_000 / hz.max(1))
}

/// When request `n` of a connection is due: now in a closed loop; in an open loop its slot in
/// the schedule (after sleeping until it, if it is still ahead).
pub(crate) async fn scheduled(interval: Option<Duration>, start: Instant, n: u64) -> Instant {
    match interval {
        Some(iv) => {
            let at = start + iv * n as u32;
            let now = Instant::now();
            if at > now {
                monoio::time::sleep(at - now).await;
                Instant::now()
            } else {
                at
            }
        }
        None => Instant::now(),
    }
}

async fn connection(
    args: Rc<Args>,
    request: Rc<Vec<u8>>,
    per_conn_interval: Option<Duration>,
    start: Instant,
    measure_from: Instant,
    end: Instant,
    stop: Arc<AtomicBool>,
) -> ThreadResult {
    let mut r = ThreadResult::new();
    let mut stream = match TcpStream::connect(args.addr).await {
        Ok(s) => s,
        Err(_) => {
            r.connect_errors += 1;
            return r;
        }
    };
    let _ = stream.set_nodelay(true);
    // Where the send time goes: just after `"id":"t` in a structured body.
    let stamp_at = request.windows(fanout::MARK.len()).position(|w| w == fanout::MARK).map(|i| i + fanout::MARK.len());
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut req_buf: Vec<u8> = Vec::with_capacity(request.len());
    let mut n: u64 = 0;
    loop {
        // Coordinated omission: when the previous response came back after this request's
        // scheduled time, the server delayed it and its latency counts from the schedule. When
        // the connection was free in time, the wait is our timer's (1 ms wheel) and the latency
        // counts from the actual send.
        let scheduled = scheduled(per_conn_interval, start, n).await;
        if scheduled >= end || stop.load(Ordering::Relaxed) {
            return r;
        }
        n += 1;
        req_buf.clear();
        req_buf.extend_from_slice(&request);
        if let Some(at) = stamp_at {
            req_buf[at..at + 16].copy_from_slice(format!("{:016}", fanout::now_micros()).as_bytes());
        }
        let (res, back) = stream.write_all(req_buf).await;
        req_buf = back;
        if res.is_err() {
            r.errors += 1;
            return r;
        }
        let status = match http::read_response(&mut stream, &mut buf).await {
            Some(s) => s,
            None => {
                r.errors += 1;
                return r;
            }
        };
        let done = Instant::now();
        if scheduled >= measure_from {
            if (200..300).contains(&status) {
                r.ok += 1;
                let us = done.duration_since(scheduled).as_micros() as u64;
                let _ = r.hist.record(us.max(1));
            } else {
                r.errors += 1;
            }
        }
    }
}

fn run_thread(
    args: Arc<Args>,
    (first, conns): (usize, usize),
    rate_per_conn: f64,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> ThreadResult {
    let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer().build().expect("runtime");
    rt.block_on(async move {
        let args = Rc::new((*args).clone());
        let request = Rc::new(http::build_request(&args));
        // `{i}` in the URL: connection i of all targets i % sessions (its own session, say).
        let request_of = |i: usize| match args.path.contains("{i}") {
            false => request.clone(),
            true => {
                let mut a = (*args).clone();
                a.path = a.path.replace("{i}", &((first + i) % args.sessions.max(1)).to_string());
                Rc::new(http::build_request(&a))
            }
        };
        let interval = (rate_per_conn > 0.0).then(|| Duration::from_secs_f64(1.0 / rate_per_conn));
        let measure_from = start + args.warmup;
        let end = measure_from + args.duration;
        let tasks: Vec<_> = (0..conns)
            .map(|i| {
                // Spread open-loop connections over one interval so they do not fire in lockstep.
                let offset = interval.map_or(Duration::ZERO, |iv| iv.mul_f64(i as f64 / conns as f64));
                if args.eventmesh_tcp {
                    let body = Rc::new(http::body(&args));
                    let times = (start + offset, measure_from, end);
                    return monoio::spawn(tcppub::connection(args.clone(), body, interval, times, stop.clone()));
                }
                if args.ws {
                    let body = Rc::new(http::body(&args));
                    let times = (start + offset, measure_from, end);
                    return monoio::spawn(wspub::connection(args.clone(), body, interval, times, stop.clone()));
                }
                monoio::spawn(connection(
                    args.clone(),
                    request_of(i),
                    interval,
                    start + offset,
                    measure_from,
                    end,
                    stop.clone(),
                ))
            })
            .collect();
        let mut total = ThreadResult::new();
        for t in tasks {
            let r = t.await;
            total.hist.add(&r.hist).expect("same bounds");
            total.ok += r.ok;
            total.errors += r.errors;
            total.connect_errors += r.connect_errors;
        }
        total
    })
}

fn main() {
    let mut raw = std::env::args().skip(1).peekable();
    if raw.peek().is_some_and(|a| a == "--serve") {
        let addr = raw.nth(1).and_then(|a| a.parse().ok()).unwrap_or_else(|| {
            eprintln!("loadgen: --serve needs HOST:PORT");
            std::process::exit(2)
        });
        respond::serve(addr);
    }
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(a) => Arc::new(a),
        Err(e) => {
            eprintln!("loadgen: {e}\n\n{}", args::USAGE);
            std::process::exit(2);
        }
    };
    if args.turns {
        return turns_main(&args);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now() + Duration::from_millis(50);
    let threads = args.threads.max(1);
    let rate_per_conn = args.rate / args.connections as f64;
    let cpu_at = Arc::new(AtomicU64::new(u64::MAX));
    let sampler = args.server_pid.map(|pid| {
        let (cpu_at, warm) = (cpu_at.clone(), start + args.warmup);
        std::thread::spawn(move || {
            std::thread::sleep(warm.saturating_duration_since(Instant::now()));
            cpu_at.store(cpu_micros(pid).unwrap_or(u64::MAX), Ordering::SeqCst);
        })
    });
    let subscribers = args.subscribe.clone().filter(|_| args.subscribers > 0).map(|(addr, host, path)| {
        let (n, stop, from, roles) =
            (args.subscribers, stop.clone(), start + args.warmup, (args.ack, args.reply, args.sse));
        std::thread::spawn(move || fanout::run(addr, host, path, n, from, stop, roles))
    });
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let conns = args.connections / threads + usize::from(t < args.connections % threads);
            let first = (0..t).map(|u| args.connections / threads + usize::from(u < args.connections % threads)).sum();
            let (args, stop) = (args.clone(), stop.clone());
            std::thread::spawn(move || run_thread(args, (first, conns), rate_per_conn, start, stop))
        })
        .collect();
    if let Some(s) = sampler {
        let _ = s.join();
    }
    std::thread::sleep((start + args.warmup + args.duration).saturating_duration_since(Instant::now()));
    let cpu_end = args.server_pid.and_then(cpu_micros);
    let measured_until = Instant::now();
    stop.store(true, Ordering::Relaxed);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    let (mut ok, mut errors, mut connect_errors) = (0, 0, 0);
    for h in handles {
        let r = h.join().expect("load thread");
        hist.add(&r.hist).expect("same bounds");
        ok += r.ok;
        errors += r.errors;
        connect_errors += r.connect_errors;
    }
    let fan = subscribers.map(|h| h.join().expect("subscriber thread"));
    let secs = measured_until.duration_since(start + args.warmup).as_secs_f64().max(1e-9);
    let server_cpu_us = match (cpu_at.load(Ordering::SeqCst), cpu_end) {
        (a, Some(b)) if a != u64::MAX && b >= a => Some(b - a),
        _ => None,
    };
    let q = |p: f64| hist.value_at_quantile(p);
    let report = serde_json::json!({
        "url": args.url,
        "mode": if args.rate > 0.0 { "open" } else { "closed" },
        "target_rate": args.rate,
        "connections": args.connections,
        "threads": threads,
        "body": args.body_kind(),
        "body_bytes": http::body(&args).len(),
        "duration_s": secs,
        "ok": ok,
        "errors": errors,
        "connect_errors": connect_errors,
        "throughput": ok as f64 / secs,
        "latency_us": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "p999": q(0.999), "max": hist.max(), "mean": hist.mean()},
        "server_pid": args.server_pid,
        "server_cpu_us": server_cpu_us,
        "server_cpu_us_per_op": server_cpu_us.map(|c| c as f64 / ok.max(1) as f64),
        "server_cpu_util": server_cpu_us.map(|c| c as f64 / 1e6 / secs),
    });
    let mut report = report;
    if let Some(f) = &fan {
        let q = |p: f64| f.hist.value_at_quantile(p);
        report["fanout"] = serde_json::json!({
            "subscribers": args.subscribers,
            "connected": f.connected,
            "deliveries": f.deliveries,
            "deliveries_per_s": f.deliveries as f64 / secs,
            "e2e_latency_us": {"p50": q(0.5), "p99": q(0.99), "p999": q(0.999), "max": f.hist.max()},
            "server_cpu_us_per_delivery": server_cpu_us.map(|c| c as f64 / f.deliveries.max(1) as f64),
        });
        println!(
            "fan-out: {}/{} subscribers, {:.0} deliveries/s, e2e p50={}us p99={}us p99.9={}us{}",
            f.connected,
            args.subscribers,
            f.deliveries as f64 / secs,
            q(0.5),
            q(0.99),
            q(0.999),
            match server_cpu_us {
                Some(c) => format!("  server_cpu={:.3}us/delivery", c as f64 / f.deliveries.max(1) as f64),
                None => String::new(),
            }
        );
    }
    println!(
        "{} {} conns={} {:.0} ok/s  errors={} p50={}us p99={}us p99.9={}us max={}us{}",
        report["mode"].as_str().unwrap(),
        args.url,
        args.connections,
        ok as f64 / secs,
        errors + connect_errors,
        q(0.5),
        q(0.99),
        q(0.999),
        hist.max(),
        match server_cpu_us {
            Some(c) => format!(
                "  server_cpu={:.2}us/op ({:.0}% of a core)",
                c as f64 / ok.max(1) as f64,
                c as f64 / 1e4 / secs
            ),
            None => String::new(),
        }
    );
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report).unwrap()).expect("write --json");
    }
}

/// `--turns`: agent streaming calls; prints and writes (`--json`) the chunk latency.
fn turns_main(args: &Args) {
    let stop = Arc::new(AtomicBool::new(false));
    // Setting up (the agent, the sessions) takes a moment before the clock starts.
    let start = Instant::now() + Duration::from_millis(500);
    let (from, until) = (start + args.warmup, start + args.warmup + args.duration);
    let cpu_at = Arc::new(AtomicU64::new(u64::MAX));
    let sampler = args.server_pid.map(|pid| {
        let cpu_at = cpu_at.clone();
        std::thread::spawn(move || {
            std::thread::sleep(from.saturating_duration_since(Instant::now()));
            cpu_at.store(cpu_micros(pid).unwrap_or(u64::MAX), Ordering::SeqCst);
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
            cpu_micros(pid)
        })
    });
    let r = turns::run(args, from, until, stop);
    let cpu_end = sampler.and_then(|s| s.join().ok().flatten());
    let secs = args.duration.as_secs_f64();
    let server_cpu_us = match (cpu_at.load(Ordering::SeqCst), cpu_end) {
        (a, Some(b)) if a != u64::MAX && b >= a => Some(b - a),
        _ => None,
    };
    let q = |p: f64| r.hist.value_at_quantile(p);
    let report = serde_json::json!({
        "url": args.url,
        "mode": "turns",
        "target_rate": args.rate,
        "sessions": args.sessions,
        "streams": r.streams,
        "duration_s": secs,
        "chunks_sent": r.sent,
        "chunks_read": r.chunks,
        "chunks_per_s": r.chunks as f64 / secs,
        "chunk_latency_us": {"p50": q(0.5), "p99": q(0.99), "p999": q(0.999), "max": r.hist.max()},
        "server_cpu_us_per_chunk": server_cpu_us.map(|c| c as f64 / r.chunks.max(1) as f64),
    });
    println!(
        "turns: {}/{} streams, {:.0} chunks/s read, chunk latency p50={}us p99={}us p99.9={}us{}",
        r.streams,
        args.sessions,
        r.chunks as f64 / secs,
        q(0.5),
        q(0.99),
        q(0.999),
        server_cpu_us
            .map_or(String::new(), |c| format!("  server_cpu={:.2}us/chunk", c as f64 / r.chunks.max(1) as f64))
    );
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report).unwrap()).expect("write --json");
    }
}
