//! `evmesh-connect`: see the crate's documentation and SPEC, "Connectors".

use clap::Parser;

#[tokio::main]
async fn main() {
    let args = evmesh_connect::config::Args::parse();
    if let Err(e) = evmesh_connect::run(args).await {
        eprintln!("evmesh-connect: {e}");
        std::process::exit(2);
    }
}
