# Sourced by the perf scripts that hold many sockets at once (idle_sessions.sh, fanout.sh).
#
# raise_fd_limit SESSIONS: lets this shell's children (the server and loadgen) open enough files
# for SESSIONS client connections, or fails saying why. The server shares its open-files limit
# out (src/config/fds.rs): about 1/8 for partitions' files, 1/32 for client sockets, up to 512
# for RocksDB and 256 for admin connections, and the rest (27/32 of it, less those) for traffic
# connections. So SESSIONS connections need a limit of about (SESSIONS + 900) x 32/27: 18,900
# for 15,000, 119,700 for 100,000. Raising the hard limit needs root (CAP_SYS_RESOURCE) and a
# large enough fs.nr_open.
raise_fd_limit() {
  local need=$(( ($1 + 900) * 32 / 27 + 100 )) hard soft
  hard=$(ulimit -Hn)
  if [ "$hard" != unlimited ] && [ "$hard" -lt "$need" ] && ! ulimit -Hn "$need" 2>/dev/null; then
    echo "$1 sessions need about $need open files: the hard limit is $hard and raising it was refused" \
      "(root with CAP_SYS_RESOURCE, and fs.nr_open >= $need, can raise it; or run fewer sessions)" >&2
    return 1
  fi
  soft=$(ulimit -Sn)
  if [ "$soft" != unlimited ] && [ "$soft" -lt "$need" ]; then
    ulimit -Sn "$need"
  fi
}
