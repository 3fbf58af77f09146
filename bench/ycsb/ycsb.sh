#!/usr/bin/env bash
# Run a YCSB phase against a Redis-protocol server (tiermem-kv or redis-server; --db resp, the
# default: tiermem.ycsb.RespClient, records as hashes) or a memcached server (--db memcached:
# tiermem.ycsb.MemcachedClient, one item a record) through tiermem's bindings (src/main/java).
#
#   bench/ycsb/ycsb.sh load|run [--db resp|memcached] [--host H] [--port P] [--workload a..f|FILE]
#                      [--threads N] [--records N] [--ops N] [--timeout MS] [-- YCSB_ARGS...]
#
# load inserts --records records; run performs --ops operations over --records records (give the
# same --records to both). YCSB's report goes to stdout ([OVERALL], [READ], [UPDATE] ... lines),
# its status lines to stderr; YCSB_ARGS go to site.ycsb.Client as they are (e.g. -p
# measurementtype=hdrhistogram+raw -p measurement.raw.output_file=F, or -s for a status line
# every 10 s). JAVA_OPTS is passed to the JVM. Builds the binding first if it is missing or stale.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
die() { printf '\033[1;31m[tiermem ycsb]\033[0m %s\n' "$*" >&2; exit 2; }
usage() { sed -n '6,15s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }

case "${1:-}" in
  load) phase=-load ;;
  run) phase=-t ;;
  -h | --help) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
esac
shift
db=resp host=127.0.0.1 port="" workload=a threads=1 records="" ops="" timeout=""
while [ $# -gt 0 ]; do
  case "$1" in
    --db | --host | --port | --workload | --threads | --records | --ops | --timeout)
      [ $# -ge 2 ] || die "$1 needs a value"
      v="$2"
      case "$1" in
        --db) db="$v" ;; --host) host="$v" ;; --port) port="$v" ;; --workload) workload="$v" ;;
        --threads) threads="$v" ;; --records) records="$v" ;; --ops) ops="$v" ;;
        --timeout) timeout="$v" ;;
      esac
      shift 2 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (YCSB's own options go after --)" ;;
  esac
done
case "$workload" in
  [a-f]) wfile="$here/workloads/workload$workload" ;;
  *) wfile="$workload" ;;
esac
[ -f "$wfile" ] || die "no workload file $wfile"

bash "$here/build.sh"
case "$db" in
  resp) class=tiermem.ycsb.RespClient prefix=redis default_port=6379 ;;
  memcached) class=tiermem.ycsb.MemcachedClient prefix=memcached default_port=11211 ;;
  *) die "--db must be resp or memcached, not '$db'" ;;
esac
args=(-db "$class" -P "$wfile" -threads "$threads"
  -p "$prefix.host=$host" -p "$prefix.port=${port:-$default_port}")
[ -n "$records" ] && args+=(-p "recordcount=$records")
[ -n "$ops" ] && args+=(-p "operationcount=$ops")
[ -n "$timeout" ] && args+=(-p "$prefix.timeout=$timeout")
# shellcheck disable=SC2086 # JAVA_OPTS is a list of JVM options
exec java ${JAVA_OPTS:-} -cp "$here/target/tiermem-ycsb.jar:$here/target/lib/*" \
  site.ycsb.Client "$phase" "${args[@]}" "$@"
