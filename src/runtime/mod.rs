//! Starting and stopping the broker: open storage, build the mailboxes, bind every listener, then
//! spawn one named, pinned thread per shard (each its own monoio runtime) and the admin thread.
//!
//! Everything shared between threads is built here, before any shard starts, and is immutable or
//! atomic afterwards ([`Shared`], defined with the shards that use it).

mod applier;
mod cluster;
mod error;
mod otlp;
mod pump;
mod remote_log;
mod tier;

pub use error::StartError;

use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::admin::Admin;
use crate::config::{Config, IoDriver};
use crate::governance::audit::Audit;
use crate::governance::Governance;
use crate::ingress::Traffic;
use crate::metrics::Metrics;
use crate::model::ShardId;
use crate::server::conn::{serve, serve_tls, ConnLimits, Peer};
use crate::server::listen::bind_shared;
use crate::server::tls::TlsAcceptor;
use crate::server::{ConnGuard, Handler, Stream};
use crate::shard::core::Shard;
use crate::shard::mailbox::Mailboxes;
pub use crate::shard::shared::{Memory, Shared};
use crate::storage::embedded::Syncer;
use crate::storage::partitions::PartitionLogs;
use crate::storage::{db, Durability};
#[cfg(feature = "kafka")]
use crate::{config::StorageKind, storage::kafka::KafkaBackend};

/// How often the auth key file is checked for a change.
const KEY_WATCH: Duration = Duration::from_millis(500);

/// How often partitions not written since the last sweep close their segment file.
const SEGMENT_SWEEP: Duration = Duration::from_secs(10);

/// How often tenants' backlogs are measured (the `backlogBytes` quota).
const BACKLOG_EVERY: Duration = Duration::from_secs(2);

/// How often each shard's event loop stamps its heartbeat.
const BEAT: Duration = Duration::from_millis(100);

/// Makes any panic, on any thread, end the whole process with a clear message and exit code
/// 101: a broker with a dead shard must not go on half-serving (a supervisor restarts it, and
/// the partitions the dead shard owned would otherwise hang every request routed to them).
pub fn exit_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        let thread = std::thread::current();
        crate::log::event(
            crate::log::Level::Error,
            "shard",
            &format!(
                "fatal: thread {} panicked; exiting (status 101) so that nothing is served half-alive",
                thread.name().unwrap_or("<unnamed>")
            ),
            &[],
        );
        crate::sys::exit_now(101);
    }));
}

/// Stamps this shard's heartbeat while its event loop turns, and tells `task::yield_now` that
/// its timers run.
async fn heartbeat() {
    loop {
        crate::task::beat();
        crate::task::timers_ran();
        monoio::time::sleep(BEAT).await;
    }
}

/// Fault injection for the tests that prove a dead shard is a dead process:
/// `EVMESH_TEST_FAULT=panic-shard-N` panics shard N shortly after it starts.
async fn injected_fault(shard: usize) {
    if std::env::var("EVMESH_TEST_FAULT").ok().as_deref() == Some(&format!("panic-shard-{shard}")) {
        monoio::time::sleep(Duration::from_millis(200)).await;
        panic!("injected fault (EVMESH_TEST_FAULT=panic-shard-{shard})");
    }
}

/// Fault injection for the test that proves `accept` and `/readyz` hold when the process runs
/// out of descriptors for a reason outside the budget (a leak, the system's own limit):
/// `EVMESH_TEST_FAULT=hold-descriptors` makes a thread take every free descriptor while the
/// file `hold-descriptors` exists in the data directory (saying so by `hold-descriptors.held`),
/// and give them back once it is gone.
fn descriptor_fault(data_dir: &std::path::Path) -> std::io::Result<()> {
    if std::env::var("EVMESH_TEST_FAULT").ok().as_deref() != Some("hold-descriptors") {
        return Ok(());
    }
    let flag = data_dir.join("hold-descriptors");
    let held_flag = data_dir.join("hold-descriptors.held");
    std::thread::Builder::new().name("evmesh-test-fault".into()).spawn(move || {
        let (mut held, mut filled) = (Vec::<std::fs::File>::new(), false);
        loop {
            // (`exists` is a stat: it needs no descriptor.)
            if flag.exists() {
                // Once: what the broker frees afterwards is its own to take again.
                if !filled {
                    while let Ok(f) = std::fs::File::open("/dev/null") {
                        held.push(f);
                    }
                    filled = true;
                    // Told by a file (made with one of the held descriptors, taken back after):
                    // a client that connected while the thread was still filling could see the
                    // broker lose its spare descriptor to this thread, which no leak outside
                    // the test does in the middle of an `accept`.
                    held.pop();
                    drop(std::fs::File::create(&held_flag));
                    held.extend(std::fs::File::open("/dev/null"));
                }
            } else if filled {
                (held, filled) = (Vec::new(), false);
                let _ = std::fs::remove_file(&held_flag);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })?;
    Ok(())
}

/// The driver a shard will really use.
pub fn resolve_driver(d: IoDriver) -> IoDriver {
    match d {
        IoDriver::Auto if monoio::utils::detect_uring() => IoDriver::Uring,
        IoDriver::Auto => IoDriver::Epoll,
        other => other,
    }
}

type UringRuntime = monoio::Runtime<monoio::time::TimeDriver<monoio::IoUringDriver>>;

/// A shard's io_uring runtime, its ring set up with `IORING_SETUP_COOP_TASKRUN` (Linux 5.19):
/// completions are handed over when the thread next enters the kernel, not by interrupting it
/// as a signal would. Without it, at a quarter of the maximum publish rate the median latency
/// was 1.8x epoll's and the p99 1.9x (2.5x nginx's; perf/RESULTS.md, "io_uring's low-load
/// tail"). A kernel that refuses the flag gets a plain ring.
fn uring_runtime() -> io::Result<UringRuntime> {
    let mut coop = io_uring::IoUring::builder();
    coop.setup_coop_taskrun();
    let builder = || monoio::RuntimeBuilder::<monoio::IoUringDriver>::new().enable_timer();
    match builder().uring_builder(coop).build() {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => builder().build(),
        other => other,
    }
}

fn block_on<F: std::future::Future>(driver: IoDriver, fut: F) -> io::Result<F::Output> {
    Ok(match driver {
        IoDriver::Uring => uring_runtime()?.block_on(fut),
        IoDriver::Epoll | IoDriver::Auto => {
            monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer().build()?.block_on(fut)
        }
    })
}

fn conn_limits(c: &Config) -> ConnLimits {
    ConnLimits {
        http: c.limits,
        header_read_timeout: c.header_read_timeout,
        idle_timeout: c.idle_timeout,
        write_timeout: c.write_timeout,
        ws_max_message: c.ws_max_message,
        delivery_linger: c.delivery_linger,
    }
}

/// Accepts connections forever; `admit` counts one in (returning the guard that counts it out)
/// or refuses it (`None`: closed at once, over its listener's cap). `short` is told when the
/// process is out of descriptors (`true`: and a connection was closed for it).
///
/// `accept` never fails for want of a descriptor for long: each loop keeps a spare one (an
/// open `/dev/null`). Out of descriptors, it lets the spare go, accepts the waiting connection
/// and closes it at once (counted as refused by `admit`'s listener), then takes the spare
/// again: the client sees its connection closed instead of waiting for a timeout, and the
/// loop does not spin on a backlog it cannot take.
async fn accept_loop(
    listener: monoio::net::TcpListener,
    serve: impl Fn(monoio::net::TcpStream, std::net::SocketAddr, ConnGuard),
    admit: impl Fn() -> Option<ConnGuard>,
    short: impl Fn(bool),
) {
    let mut spare = std::fs::File::open("/dev/null").ok();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok((s, peer)) => (s, peer),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                short(false);
                if spare.take().is_none() {
                    monoio::time::sleep(Duration::from_millis(10)).await;
                    spare = std::fs::File::open("/dev/null").ok();
                    continue;
                }
                let accepted = listener.accept().await;
                spare = std::fs::File::open("/dev/null").ok();
                match accepted {
                    // Descriptors were given back meanwhile (the spare is had again): served.
                    Ok(taken) if spare.is_some() => taken,
                    Ok((s, _)) => {
                        drop(s);
                        short(true);
                        spare = std::fs::File::open("/dev/null").ok();
                        continue;
                    }
                    Err(_) => continue,
                }
            }
            Err(e) => {
                // A transient error: back off instead of spinning.
                crate::log::warn("start", &format!("accept: {e}"), &[]);
                monoio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Some(guard) = admit() else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        // A peer that vanished without a FIN fails its connection once our data has gone
        // unacknowledged this long, instead of after many minutes of retransmission.
        crate::sys::set_tcp_user_timeout(std::os::fd::AsRawFd::as_raw_fd(&stream), TCP_USER_TIMEOUT_MS);
        serve(stream, peer, guard);
    }
}

/// What [`accept_loop`] does with an HTTP listener's connection: a task serving it with
/// `handler`, over TLS when the listener has it.
fn serve_http<H: Handler + 'static>(
    handler: Rc<H>,
    tls: Option<Arc<TlsAcceptor>>,
    limits: ConnLimits,
) -> impl Fn(monoio::net::TcpStream, std::net::SocketAddr, ConnGuard) {
    move |stream, peer, guard| {
        let handler = handler.clone();
        let tls = tls.clone();
        monoio::spawn(async move {
            match tls {
                // Boxed: a TLS connection's future (the handshake's state, a TLS stream) is several
                // times a plain one's, and every plain connection's task would take its room.
                Some(tls) => Box::pin(serve_tls(stream, &tls, Some(peer), &*handler, limits, guard)).await,
                None => {
                    serve(Stream::Plain(stream), Peer { addr: Some(peer), cert: None }, &*handler, limits, guard).await
                }
            }
        });
    }
}

const TCP_USER_TIMEOUT_MS: u32 = 30_000;

/// Counts a traffic connection in on its shard (`max_connections`).
fn admit_traffic(shard: &Rc<Shard>) -> Option<ConnGuard> {
    let m = shard.shared.metrics.shard(shard.id);
    if shard.connections.get() >= shard.shared.config.max_connections {
        m.connections_rejected.inc();
        return None;
    }
    m.connections_accepted.inc();
    m.connections_open.inc();
    shard.connections.set(shard.connections.get() + 1);
    let shard = shard.clone();
    Some(ConnGuard::new(move || {
        shard.connections.set(shard.connections.get() - 1);
        shard.shared.metrics.shard(shard.id).connections_open.sub(1);
    }))
}

/// Raises the open-files limit, shares it out and fits the connection caps under it.
fn fit_descriptors(config: &mut Config) -> crate::config::fds::FdBudget {
    let kafka = config.storage.remote();
    let limit = crate::sys::raise_nofile();
    let b = crate::config::fds::fd_budget(
        limit,
        config.shards,
        config.max_connections,
        config.admin_max_connections,
        kafka,
    );
    let least = b.least(config.shards);
    if least > limit {
        crate::log::warn("start", &format!("the open files limit {limit} is below what evmesh needs at least ({least}): raise it (ulimit -n); running out of descriptors will refuse connections"), &[]);
    }
    if b.connections < config.max_connections {
        crate::log::info(
            "start",
            &format!("max_connections lowered from {} to {} per shard to fit", config.max_connections, b.connections),
            &[],
        );
        config.max_connections = b.connections;
    }
    crate::log::info("start", &format!("descriptors: {b}"), &[]);
    b
}

/// The addresses and driver a started broker serves with.
#[derive(Debug, Clone, Copy)]
pub struct Started {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// The classic EventMesh TCP listener, when `tcp_listen` is set.
    pub tcp_listen: Option<SocketAddr>,
    pub driver: IoDriver,
}

/// The instance id kept in `data_dir/instance_id`, made (at random) the first time.
fn kept_instance_id(data_dir: &std::path::Path) -> Result<String, StartError> {
    let path = data_dir.join("instance_id");
    if let Ok(kept) = std::fs::read_to_string(&path) {
        let kept = kept.trim();
        if crate::cluster::valid_instance_id(kept) {
            return Ok(kept.to_owned());
        }
        crate::log::warn("start", &format!("{} holds no valid instance id; making a new one", path.display()), &[]);
    }
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_i64(crate::model::clock::now_micros());
    h.write_u32(std::process::id());
    let id = format!("evmesh-{:016x}", h.finish());
    let tmp = data_dir.join("instance_id.tmp");
    std::fs::write(&tmp, format!("{id}\n")).and_then(|()| std::fs::rename(&tmp, &path))?;
    Ok(id)
}

/// Starts every thread and returns once all shards accept connections.
pub fn start(mut config: Config) -> Result<(Started, Arc<Shared>), StartError> {
    let fds = fit_descriptors(&mut config);
    // Before any shard meters a poll: the counter's rate takes a couple of milliseconds.
    crate::task::clock::calibrate();
    crate::server::client::set_socket_budget(fds.client_sockets);
    let shards = config.shards;
    let db = db::open_with(&config.data_dir, shards, fds.rocksdb as i32)?;
    let syncer = if config.durability == Durability::Fsync { Some(Syncer::start(db.clone())?) } else { None };
    let mirror = config.storage.remote();
    let tier = match &config.tier {
        Some(settings) => Some(tier::open(settings, &db)?),
        None => None,
    };
    let logs = PartitionLogs::new(db::segments_dir(&config.data_dir), config.segment_bytes, mirror, fds.partitions);
    let logs = Arc::new(match &tier {
        Some(t) => logs.with_tier(t.clone()),
        None => logs,
    });
    let traffic = bind_shared(config.listen, shards)?;
    let admin = bind_shared(config.admin_listen, 1)?.remove(0);
    let tcp: Vec<Option<std::net::TcpListener>> = match config.tcp_listen {
        Some(addr) => bind_shared(addr, shards)?.into_iter().map(Some).collect(),
        None => (0..shards).map(|_| None).collect(),
    };
    let started = Started {
        listen: traffic[0].local_addr()?,
        admin_listen: admin.local_addr()?,
        tcp_listen: match &tcp[0] {
            Some(l) => Some(l.local_addr()?),
            None => None,
        },
        driver: resolve_driver(config.io_driver),
    };
    if config.advertised_url.is_empty() {
        config.advertised_url = crate::config::local_url(started.listen, config.tls.is_some());
    }
    // The port the TCP listener got (`:0` picks one): what RECOMMEND and REDIRECT name.
    config.tcp_listen = started.tcp_listen.or(config.tcp_listen);
    if config.instance_id.is_empty() {
        config.instance_id = kept_instance_id(&config.data_dir)?;
    }
    #[cfg(feature = "kafka")]
    let kafka = match &config.storage {
        StorageKind::Kafka(settings) => Some(KafkaBackend::connect(settings.clone())?),
        _ => None,
    };
    #[cfg(not(feature = "kafka"))]
    let kafka = None;
    let remote = remote_log::connect(&config, &kafka)?;
    let (seam, to_start) = cluster::seam(&config, &kafka);
    let audit = &config.auth;
    let audit = Audit::start(audit.audit_log.clone(), audit.audit_max_per_second, audit.audit_max_bytes)
        .map_err(|e| StartError::Auth(format!("audit log {}: {e}", config.auth.audit_log.display())))?;
    use crate::storage::meta::{list_policy, Policy};
    let stored = list_policy(&db, Policy::Acl)?;
    let limits = list_policy(&db, Policy::Limit)?;
    let quotas = list_policy(&db, Policy::Quota)?;
    let pipeline = (list_policy(&db, Policy::Transformer)?, list_policy(&db, Policy::Route)?);
    let governance =
        Governance::new(config.auth.clone(), stored, limits, quotas, pipeline, audit).map_err(StartError::Auth)?;
    let tls = match &config.tls {
        Some(files) => Some(Arc::new(TlsAcceptor::load(files.clone()).map_err(StartError::Tls)?)),
        None => None,
    };
    let client_tls = crate::server::tls::client_config(config.webhook_ca_file.as_deref())
        .map_err(|e| StartError::Tls(format!("webhook_ca_file: {e}")))?;
    let shared = Arc::new(Shared {
        governance,
        client_tls,
        listeners: [started.listen, started.admin_listen],
        cluster: seam,
        followed: Default::default(),
        tail_bytes: Default::default(),
        mailboxes: Mailboxes::new(shards, config.mailbox_capacity),
        direct_writes: config.direct_io
            && started.driver == IoDriver::Uring
            && config.durability != Durability::Memory
            && !config.storage.remote(),
        metrics: Metrics::new(shards),
        ready: AtomicUsize::new(0),
        beats: (0..shards).map(|_| Arc::new(AtomicU64::new(0))).collect(),
        mirror_fan_outs: (0..shards).map(|_| AtomicUsize::new(0)).collect(),
        descriptors_short: (0..shards).map(|_| AtomicU64::new(0)).collect(),
        fds,
        watchers: Arc::default(),
        agents: crate::shard::agents::Agents::new(config.max_agents, config.agent_heartbeat_timeout.as_millis() as u64),
        calls: crate::shard::calls::Calls::new(config.max_sessions),
        tasks: crate::shard::tasks::Tasks::new(config.max_sessions.saturating_mul(4)),
        remotes: crate::shard::tasks::Remotes::new(config.max_agents, config.max_sessions.saturating_mul(4)),
        epoch: Instant::now(),
        topic_count: AtomicUsize::new(crate::storage::meta::list(&db)?.len()),
        subscription_count: AtomicUsize::new(crate::storage::meta::list_subscriptions(&db)?.len()),
        memory: Memory::new(config.memory_limit_bytes),
        tls,
        remote,
        db,
        logs,
        syncer,
        config,
    });
    // Every partition's log opened (its tail recovered) before the shards start: recovery reads
    // up to two segments, which a shard's first append would otherwise do on its core.
    for (topic, m) in crate::storage::meta::list(&shared.db)? {
        for p in (0..m.partitions).map(crate::model::PartitionId) {
            shared.logs.with(&topic, p, |_| Ok(()))?;
        }
    }
    if let Some(r) = &shared.remote {
        remote_log::start(&shared, r)?;
    }
    if let Some(t) = &tier {
        tier::start(&shared, t);
    }
    cluster::start(&shared, to_start)?;
    if let Some(endpoint) = &shared.config.otlp_endpoint {
        let c = &shared.config;
        let exporter = otlp::Exporter {
            endpoint: endpoint.clone(),
            protocol: c.otlp_protocol,
            instance_id: c.instance_id.clone(),
            tls: shared.client_tls.clone(),
        };
        otlp::start(exporter, c.trace_sample_ratio)?;
    }
    descriptor_fault(&shared.config.data_dir)?;
    {
        let shared = shared.clone();
        std::thread::Builder::new().name("evmesh-memwatch".into()).spawn(move || loop {
            shared.memory.sample();
            std::thread::sleep(Duration::from_millis(100));
        })?;
    }
    {
        // Key rotation without a restart: the tokens file or JWKS is re-read once it changes.
        let shared = shared.clone();
        std::thread::Builder::new().name("evmesh-keywatch".into()).spawn(move || loop {
            std::thread::sleep(KEY_WATCH);
            match shared.governance.reload_keys_if_changed() {
                Ok(true) => crate::log::warn("start", "auth keys reloaded", &[]),
                Ok(false) => {}
                Err(e) => {
                    crate::log::warn("start", &format!("auth keys not reloaded, the old ones stay in force: {e}"), &[])
                }
            }
        })?;
    }
    {
        // Descriptors: a partition not written for a sweep's interval lets go of its file.
        let shared = shared.clone();
        std::thread::Builder::new().name("evmesh-segsweep".into()).spawn(move || loop {
            std::thread::sleep(SEGMENT_SWEEP);
            shared.logs.sweep();
        })?;
    }
    {
        // Tenants' backlogs for the backlogBytes quota: RocksDB reads, so never on a shard.
        let shared = shared.clone();
        std::thread::Builder::new().name("evmesh-backlog".into()).spawn(move || loop {
            std::thread::sleep(BACKLOG_EVERY);
            match crate::admin::measure_backlog(&shared) {
                Ok(m) => shared.governance.set_backlog(m),
                Err(e) => crate::log::warn("start", &format!("backlog not measured: {e}"), &[]),
            }
        })?;
    }
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    for (i, (listener, tcp)) in traffic.into_iter().zip(tcp).enumerate() {
        let shared = shared.clone();
        let core = if cores.is_empty() { None } else { Some(cores[i % cores.len()]) };
        let driver = started.driver;
        std::thread::Builder::new().name(format!("evmesh-shard-{i}")).spawn(move || {
            if let Some(core) = core {
                core_affinity::set_for_current(core);
            }
            let run = async move {
                let id = ShardId(i as u16);
                let shard = Rc::new(Shard::new(id, shared.clone()));
                let listener = match monoio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        crate::log::warn("start", &format!("shard {i}: listener: {e}"), &[]);
                        std::process::exit(1);
                    }
                };
                monoio::spawn(shard.clone().pump());
                monoio::spawn(shard.clone().retention_loop());
                if shard.id.index() == 0 {
                    monoio::spawn(shard.clone().calls_loop());
                }
                monoio::spawn(shard.clone().delivery_timers());
                monoio::spawn(crate::push::watch_policy(shard.clone()));
                shard.sink_starter.set(Some(crate::push::webhook::start));
                shard.pushes_changed.set(Some(crate::push::webhook::sync_pushes));
                crate::push::webhook::start_all(&shard);
                crate::task::set_heartbeat(shared.beats[i].clone(), shared.epoch);
                monoio::spawn(heartbeat());
                monoio::spawn(injected_fault(i));
                let limits = conn_limits(&shared.config);
                shared.ready.fetch_add(1, Ordering::AcqRel);
                let traffic = Traffic::new(shard.clone());
                let short = |closed: bool| {
                    if closed {
                        shard.shared.metrics.shard(shard.id).connections_rejected.inc();
                    }
                    let now = crate::model::clock::now_ms().max(1);
                    shard.shared.descriptors_short[shard.id.index()].store(now, Ordering::Relaxed);
                };
                if let Some(tcp) = tcp {
                    // Classic EventMesh TCP clients: accepted here too, counted against the
                    // shard's max_connections with its HTTP ones, served by the same handler.
                    let tcp = monoio::net::TcpListener::from_std(tcp).expect("tcp listener");
                    let (traffic, shard) = (traffic.clone(), shard.clone());
                    let serve = move |stream, peer, guard| {
                        monoio::spawn(crate::ingress::eventmesh_tcp::serve(
                            traffic.clone(),
                            stream,
                            peer,
                            limits,
                            guard,
                        ));
                    };
                    monoio::spawn(async move { accept_loop(tcp, serve, || admit_traffic(&shard), |_| {}).await });
                }
                let serve = serve_http(traffic, shared.tls.clone(), limits);
                accept_loop(listener, serve, || admit_traffic(&shard), short).await
            };
            if let Err(e) = block_on(driver, run) {
                crate::log::warn("start", &format!("shard {i}: cannot start the {driver:?} driver: {e}"), &[]);
                std::process::exit(1);
            }
        })?;
    }
    {
        let shared = shared.clone();
        std::thread::Builder::new().name("evmesh-admin".into()).spawn(move || {
            let run = async move {
                let listener = monoio::net::TcpListener::from_std(admin).expect("admin listener");
                let limits = conn_limits(&shared.config);
                let (open, cap) = (Rc::new(std::cell::Cell::new(0usize)), shared.config.admin_max_connections);
                let admit = move || {
                    if open.get() >= cap {
                        return None;
                    }
                    open.set(open.get() + 1);
                    let open = open.clone();
                    Some(ConnGuard::new(move || open.set(open.get() - 1)))
                };
                let tls = shared.tls.clone();
                let admin = Rc::new(Admin { shared, replaying: Default::default(), failures: Default::default() });
                accept_loop(listener, serve_http(admin, tls, limits), admit, |_| {}).await
            };
            if let Err(e) = block_on(IoDriver::Epoll, run) {
                crate::log::warn("start", &format!("admin thread: {e}"), &[]);
                std::process::exit(1);
            }
        })?;
    }
    while shared.ready.load(Ordering::Acquire) < shards {
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok((started, shared))
}
