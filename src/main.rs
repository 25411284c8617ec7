//! `evmesh serve | pub | sub | request | stream | agent`: parse the configuration, start the shards, wait for a signal.

use std::process::ExitCode;

const USAGE: &str = "usage:
  evmesh serve [--config FILE] [--listen ADDR] [--admin-listen ADDR] [--shards N] [--data-dir DIR]
               [--storage embedded|kafka] [--kafka-brokers HOST:PORT,...] [--durability memory|os|fsync]
               [--io-driver auto|uring|epoll] [--<any other key in evmesh.toml> VALUE]
  evmesh pub   --topic T [--url http://127.0.0.1:8080] [--type TYPE] [--source SRC] [--id ID]
               [--partition-key K] [--data JSON | --data-text TEXT]   (or a CloudEvent JSON on stdin)
               [--token T]   (a bearer token; also EVMESH_TOKEN)
  evmesh sub   --subscription S [--url http://127.0.0.1:8080] [--client-id C] [--no-ack] [--max N]
               [--token T]
               (one JSON line per event; ack=none: at-most-once from the moment it attaches)
  evmesh request --topic T [--timeout-ms 30000] [the event flags of pub]   (prints the reply)
  evmesh stream --session S [--max N]   (a session's events from its head, then live, as JSON lines)
  evmesh agent --agent-id A [--delay-ms 0] [--max-turns N] [--heartbeat-ms 30000]
               (a streaming agent: echoes each turn's prompt back, a word per chunk)
  pub, sub, request, stream and agent over TLS: --url https://HOST:PORT [--cacert FILE] (default the system's CA bundle)
               [--cert FILE --key FILE]   (a client certificate, for mutual TLS)
  evmesh print-config   (the commented defaults)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("serve") => serve(&args[1..]),
        Some("pub") => client("pub", evmesh::cli::publish(&args[1..])),
        Some("sub") => client("sub", evmesh::cli::subscribe(&args[1..])),
        Some("request") => client("request", evmesh::cli::request(&args[1..])),
        Some("stream") => client("stream", evmesh::cli::stream(&args[1..])),
        Some("agent") => client("agent", evmesh::cli::agent(&args[1..])),
        Some("print-config") => {
            print!("{}", evmesh::config::DEFAULT_TOML);
            ExitCode::SUCCESS
        }
        Some("--version") | Some("-V") => {
            println!("evmesh {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// The exit of a client command: its error on stderr, named after the command.
fn client(name: &str, result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("evmesh {name}: {e}");
            ExitCode::FAILURE
        }
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
    let config = match evmesh::config::RawConfig::load(args, std::env::vars()).and_then(|r| r.validate()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("evmesh: configuration: {e}");
            return ExitCode::from(2);
        }
    };
    evmesh::runtime::exit_on_panic();
    // Block the signals in every thread (the mask is inherited), and take them here.
    let signals = evmesh::sys::block_signals();
    let shards = config.shards;
    let durability = config.durability;
    match evmesh::runtime::start(config) {
        Ok((s, shared)) => {
            println!(
                "evmesh listening traffic={} admin={} shards={} driver={:?} durability={:?}",
                s.listen, s.admin_listen, shards, s.driver, durability
            );
            let sig = loop {
                let sig = evmesh::sys::wait_for_signal(&signals);
                if sig != libc::SIGHUP {
                    break sig;
                }
                match shared.tls.as_deref().map(|t| t.reload()) {
                    None => eprintln!("evmesh: SIGHUP: no TLS files to reload"),
                    Some(Ok(())) => eprintln!("evmesh: SIGHUP: TLS certificate and key reloaded"),
                    Some(Err(e)) => eprintln!("evmesh: SIGHUP: TLS files not reloaded, the old ones stay: {e}"),
                }
            };
            eprintln!("evmesh: signal {sig}, stopping");
            // Whatever durability was chosen, a clean stop loses nothing the OS has.
            let _ = shared.db.flush_wal(true);
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("evmesh: cannot start: {e}");
            ExitCode::FAILURE
        }
    }
}
