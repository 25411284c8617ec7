//! The open-files limit as a budget (`FdBudget`): derived at start from the limit in force
//! (raised to its hard limit), printed, and held to by each part that opens descriptors
//! (connections per shard, partitions' files, RocksDB, the broker's own client sockets), so
//! running out of descriptors can only refuse a connection, never fail a storage write. Pure:
//! `runtime` raises the limit and hands the parts their shares.

/// How the process's descriptors are shared out: computed once at start from the open-files
/// limit (raised to its hard limit first), printed, and held to by each part, so running out
/// of descriptors can only refuse a connection (closed at once, counted), never a storage write
/// or an `accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdBudget {
    /// The open-files limit in force.
    pub limit: u64,
    /// Traffic connections per shard (`max_connections`, lowered to fit).
    pub connections: usize,
    /// Admin connections (`admin_max_connections`).
    pub admin: usize,
    /// Partitions' open tail files, process-wide (`partitions::PartitionLogs`): past it the
    /// least recently used are closed.
    pub partitions: usize,
    /// RocksDB's open table files (`max_open_files`; its WAL, manifest and lock come from the
    /// reserve).
    pub rocksdb: usize,
    /// Sockets the broker opens itself (webhook sinks, remote agents, its HTTP client),
    /// process-wide (`server::client`).
    pub client_sockets: usize,
    /// The rest: listeners, each shard's spare descriptor for `accept` and its event loop's
    /// own, the descriptors of its direct segment writes in flight (4 at most, `direct_io`),
    /// librdkafka's sockets, RocksDB's WAL and manifest, the audit log, reads of sealed
    /// segments, pipes.
    pub reserve: u64,
}

impl std::fmt::Display for FdBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "open files limit {}: traffic connections {} per shard, admin connections {}, partitions' open files {}, RocksDB files {}, client sockets {}, reserve {}",
            self.limit, self.connections, self.admin, self.partitions, self.rocksdb, self.client_sockets, self.reserve
        )
    }
}

impl FdBudget {
    /// What the shares need at the least (one connection per shard): a limit below it is
    /// oversubscribed.
    pub fn least(&self, shards: usize) -> u64 {
        self.reserve + (self.rocksdb + self.partitions + self.client_sockets + self.admin + shards) as u64
    }
}

/// Shares `limit` descriptors out (see [`FdBudget`]); `max_connections` is lowered to what
/// fits, never raised.
pub fn fd_budget(limit: u64, shards: usize, max_connections: usize, admin: usize, kafka: bool) -> FdBudget {
    let reserve = 64 + 12 * shards as u64 + if kafka { 128 } else { 0 };
    let rest = limit.saturating_sub(reserve);
    let rocksdb = (rest / 16).clamp(16, crate::storage::db::MAX_OPEN_FILES as u64);
    let partitions = (rest / 8).clamp(8, 65_536);
    let client_sockets = (rest / 32).clamp(4, 4096);
    let room = rest.saturating_sub(rocksdb + partitions + client_sockets + admin as u64);
    let connections = ((room / shards as u64).max(1) as usize).min(max_connections);
    FdBudget {
        limit,
        connections,
        admin,
        partitions: partitions as usize,
        rocksdb: rocksdb as usize,
        client_sockets: client_sockets as usize,
        reserve,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every share fits under the limit together, whatever the limit: the descriptors the
    /// parts may hold at once never pass it.
    #[test]
    fn the_shares_add_up_to_at_most_the_limit() {
        for limit in [256u64, 1024, 4096, 20_000, 65_536, 1 << 20] {
            for shards in [1usize, 2, 8] {
                let b = fd_budget(limit, shards, 100_000, 64, true);
                let used = b.least(shards) + ((b.connections - 1) * shards) as u64;
                if limit >= 1024 {
                    assert!(used <= limit, "{b} uses {used} with {shards} shards");
                }
                assert!(b.connections >= 1 && b.partitions >= 8 && b.rocksdb >= 16, "{b}");
            }
        }
    }

    #[test]
    fn connections_are_lowered_to_fit_never_raised() {
        let b = fd_budget(1 << 20, 2, 10_000, 64, false);
        assert_eq!(b.connections, 10_000, "{b}");
        let b = fd_budget(2048, 2, 10_000, 64, false);
        assert!(b.connections < 1000, "{b}");
        assert_eq!(b.rocksdb, 122, "{b}");
        assert_eq!(b.partitions, 245, "{b}");
    }
}
