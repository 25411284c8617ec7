//! The one integration-test binary: a real `evmesh serve` on loopback with ephemeral ports,
//! driven over real sockets.

mod it {
    pub mod util;

    mod a2a;

    mod acked;
    mod admin;
    mod agents;
    pub mod calls;
    mod cli;
    mod cluster;
    mod delivery;
    mod deploy;
    mod docs;
    mod durability;
    mod errors;
    mod eventmesh_tcp;
    mod governance;
    mod hostile;
    mod interop;
    #[cfg(feature = "kafka")]
    mod kafka;
    mod layers;
    mod lite;
    mod meshmessage;
    mod pipeline;
    mod publish;
    mod request;
    #[cfg(feature = "rocketmq")]
    mod rocketmq;
    mod sdk;
    mod session;
    mod subscriptions;
    mod tier;
    pub mod tls;
    mod tracing;
    pub mod webhook;
    mod ws;
    mod ws_publish;
}
