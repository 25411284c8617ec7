//! `evmesh serve`: parse the configuration, start the shards, wait for a signal; `evmesh pub |
//! sub | request | stream | agent` are the clients of `cli` (clap, on `evmesh-client`).

use std::process::ExitCode;

mod cli;

use clap::Parser;

const USAGE: &str = "usage:
  evmesh serve [--config FILE] [--listen ADDR] [--admin-listen ADDR] [--shards N] [--data-dir DIR]
               [--storage embedded|kafka] [--kafka-brokers HOST:PORT,...] [--durability memory|os|fsync]
               [--io-driver auto|uring|epoll] [--<any other key in evmesh.toml> VALUE]
  evmesh pub | sub | request | stream | agent ... (the clients: evmesh <command> --help)
  evmesh print-config   (the commented defaults)";

use evmesh::log;

/// mimalloc, or the C library's malloc with `EVMESH_ALLOCATOR=system` (`sys::Heap`).
#[global_allocator]
static HEAP: evmesh::sys::Heap = evmesh::sys::Heap;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `serve` takes every configuration key as a flag: its own parser (config::RawConfig).
    if args.first().map(String::as_str) == Some("serve") {
        return serve(&args[1..]);
    }
    match cli::Cli::parse().command {
        cli::Command::Serve { args } => serve(&args),
        cli::Command::PrintConfig => {
            print!("{}", evmesh::config::DEFAULT_TOML);
            ExitCode::SUCCESS
        }
        client => cli::run(client),
    }
}

fn serve(args: &[String]) -> ExitCode {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}\n\nkeys (flag --key-name, variable EVMESH_KEY_NAME):");
        for (k, help) in evmesh::config::KEYS {
            println!("  {k:24} {help}");
        }
        return ExitCode::SUCCESS;
    }
    let mut unknown = Vec::new();
    let loaded = evmesh::config::RawConfig::load(args, std::env::vars()).and_then(|r| {
        unknown = r.unknown_variables.clone();
        r.validate()
    });
    let config = match loaded {
        Ok(c) => c,
        Err(e) => {
            for name in &unknown {
                eprintln!("evmesh: ignoring unknown variable {name} (not a configuration key)");
            }
            eprintln!("evmesh: configuration: {e}");
            return ExitCode::from(2);
        }
    };
    evmesh::log::init(config.log_format, config.log_level.clone());
    for name in &unknown {
        log::warn("config", &format!("ignoring unknown variable {name} (not a configuration key)"), &[]);
    }
    evmesh::runtime::exit_on_panic();
    // Block the signals in every thread (the mask is inherited), and take them here.
    let signals = evmesh::sys::block_signals();
    let shards = config.shards;
    let durability = config.durability;
    let tracing = config.otlp_endpoint.as_ref().map_or("off".to_owned(), |u| u.host.clone());
    match evmesh::runtime::start(config) {
        Ok((s, shared)) => {
            let tcp = s.tcp_listen.map(|a| format!(" tcp={a}")).unwrap_or_default();
            println!(
                "evmesh listening traffic={} admin={}{tcp} shards={} driver={:?} durability={:?}",
                s.listen, s.admin_listen, shards, s.driver, durability
            );
            let c = &shared.config;
            let storage = c.storage.name();
            log::info(
                "start",
                "started",
                &[
                    ("traffic", &s.listen),
                    ("admin", &s.admin_listen),
                    ("shards", &shards),
                    ("driver", &format_args!("{:?}", s.driver)),
                    ("durability", &format_args!("{durability:?}")),
                    ("storage", &storage),
                    ("segment_writes", &if shared.direct_writes { "direct" } else { "page-cache" }),
                    ("instance", &c.instance_id),
                    ("tracing", &tracing),
                ],
            );
            let sig = loop {
                let sig = evmesh::sys::wait_for_signal(&signals);
                if sig != libc::SIGHUP {
                    break sig;
                }
                match shared.tls.as_deref().map(|t| t.reload()) {
                    None => log::warn("tls", "SIGHUP: no TLS files to reload", &[]),
                    Some(Ok(())) => log::info("tls", "SIGHUP: TLS certificate and key reloaded", &[]),
                    Some(Err(e)) => {
                        log::warn("tls", "SIGHUP: TLS files not reloaded, the old ones stay", &[("error", &e)])
                    }
                }
            };
            log::info("stop", &format!("signal {sig}, stopping"), &[]);
            // Whatever durability was chosen, a clean stop loses nothing the OS has.
            let _ = shared.db.flush_wal(true);
            std::process::exit(0);
        }
        Err(e) => {
            log::event(log::Level::Error, "start", &format!("cannot start: {e}"), &[]);
            ExitCode::FAILURE
        }
    }
}
