//! The `evmesh-otlp` thread: takes the shards' finished spans from the trace queue, batches
//! them (up to [`BATCH`] spans, or what came within [`LINGER`]) and POSTs each batch to the
//! collector's `/v1/traces` over the broker's own HTTP client (its own monoio runtime, one
//! keep-alive connection, https with the webhooks' trust). A batch the collector does not take
//! within [`TIMEOUT`] a step (three of them in all) is dropped and counted (`trace::FAILED`): spans are worth less than a
//! thread stuck behind a collector that went away.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::config::OtlpProtocol;
use crate::server::client::{Pool, Url};
use crate::trace::{self, otlp, Span};

/// Spans per request at most.
const BATCH: usize = 512;
/// How long the first span of a batch waits for others.
const LINGER: Duration = Duration::from_millis(200);
/// A request taking longer (per step) fails.
const TIMEOUT: Duration = Duration::from_secs(5);

/// What the exporter needs.
pub struct Exporter {
    pub endpoint: Url,
    pub protocol: OtlpProtocol,
    pub instance_id: String,
    pub tls: Arc<rustls::ClientConfig>,
}

/// Starts tracing (sampling new traces at `ratio`) and the exporter thread.
pub fn start(exporter: Exporter, ratio: f64) -> std::io::Result<()> {
    let Some(rx) = trace::start(ratio) else { return Ok(()) };
    std::thread::Builder::new().name("evmesh-otlp".into()).spawn(move || {
        let rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer().build();
        match rt {
            Ok(mut rt) => rt.block_on(run(exporter, rx)),
            Err(e) => crate::log::warn("otlp", "no runtime for the exporter; spans are dropped", &[("error", &e)]),
        }
    })?;
    Ok(())
}

async fn run(exporter: Exporter, rx: Receiver<Span>) {
    let pool = Pool::new(1, 64 * 1024, Some(exporter.tls.clone()));
    let version = env!("CARGO_PKG_VERSION");
    let resource = otlp::Resource { instance_id: &exporter.instance_id, version };
    let content_type = match exporter.protocol {
        OtlpProtocol::Protobuf => "application/x-protobuf",
        OtlpProtocol::Json => "application/json",
    };
    let mut said = false;
    loop {
        // The queue's receive blocks this thread, whose only work is this loop.
        let first = match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(s) => s,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let mut batch = vec![first];
        let until = Instant::now() + LINGER;
        while batch.len() < BATCH {
            match rx.recv_deadline(until) {
                Ok(s) => batch.push(s),
                Err(_) => break,
            }
        }
        let body = match exporter.protocol {
            OtlpProtocol::Protobuf => otlp::protobuf(&resource, &batch),
            OtlpProtocol::Json => otlp::json(&resource, &batch),
        };
        let sent = async {
            let addr = exporter.endpoint.resolve(TIMEOUT).await.map_err(|e| e.to_string())?;
            let headers = [("content-type", content_type)];
            let a = pool
                .send(&exporter.endpoint, addr, "POST", &headers, &body, TIMEOUT)
                .await
                .map_err(|e| e.to_string())?;
            match a.status {
                200..=299 => Ok(()),
                s => Err(format!("the collector answered {s}")),
            }
        };
        // Each step within TIMEOUT, and the whole request within three of them: a collector
        // that trickles its answer does not hold the exporter (and every span behind it).
        let sent = match monoio::time::timeout(3 * TIMEOUT, sent).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {:?}", 3 * TIMEOUT)),
        };
        match sent {
            Ok(()) => {
                trace::EXPORTED.fetch_add(batch.len() as u64, Relaxed);
                said = false;
            }
            Err(e) => {
                trace::FAILED.fetch_add(batch.len() as u64, Relaxed);
                // Once per outage, not once per batch.
                if !said {
                    let (n, to) = (batch.len(), &exporter.endpoint.host);
                    crate::log::warn("otlp", "spans not exported", &[("spans", &n), ("to", to), ("error", &e)]);
                    said = true;
                }
            }
        }
    }
}
