//! What can go wrong reading or checking the configuration ([`ConfigError`]): each error names
//! the file, variable, flag or key at fault.

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("unknown flag {0} (see `evmesh serve --help`)")]
    UnknownFlag(String),
    #[error("flag {0} needs a value")]
    MissingValue(String),
    #[error("invalid {key}: {message}")]
    Invalid { key: &'static str, message: String },
}
