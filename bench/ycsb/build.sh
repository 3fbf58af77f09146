#!/usr/bin/env bash
# Build tiermem's YCSB binding with Maven when it is missing or older than its sources:
#   target/tiermem-ycsb.jar (tiermem.ycsb.RespClient) and target/lib/*.jar (YCSB core 0.17.0,
#   Jedis and their dependencies, from Maven Central).
# Idempotent and quiet: a no-op when up to date; on failure it prints Maven's log tail and says
# whether Maven Central could not be reached. Run by scripts/setup.sh and by ycsb.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
die() { printf '\033[1;31m[tiermem ycsb]\033[0m %s\n' "$*" >&2; exit 1; }

jar="$here/target/tiermem-ycsb.jar"
stamp="$here/target/lib/.complete"   # written last: an interrupted build is not "up to date"
if [ -f "$jar" ] && [ -f "$stamp" ] &&
   [ -z "$(find "$here/pom.xml" "$here/src" -newer "$stamp" -print -quit)" ]; then
  exit 0
fi
command -v mvn >/dev/null 2>&1 ||
  die "mvn not found: install the Debian packages maven and default-jdk-headless (scripts/setup.sh does)"
command -v java >/dev/null 2>&1 || die "java not found: install default-jdk-headless (scripts/setup.sh does)"

printf '\033[1m[tiermem ycsb]\033[0m %s\n' \
  "building the YCSB binding with Maven (bench/ycsb; the first build downloads from Maven Central)" >&2
rm -rf "$here/target/lib"   # no stale dependency jars (e.g. an older Jedis) on the class path
logf="$(mktemp /tmp/tiermem-ycsb-mvn.XXXXXX.log)"
if ! timeout 900 mvn -B -q -Dstyle.color=never -f "$here/pom.xml" package >"$logf" 2>&1; then
  tail -n 30 "$logf" | sed "s/\x1b\[[0-9;]*m//g" >&2
  if grep -qiE 'could not (transfer|resolve)|unknownhost|connect(ion)? (refused|timed out)|network is unreachable|no route to host|failed to read artifact descriptor' "$logf"; then
    die "Maven could not download the YCSB binding's dependencies: Maven Central is unreachable (full log: $logf)"
  fi
  die "Maven failed to build $here (full log: $logf)"
fi
rm -f "$logf"
[ -f "$jar" ] || die "Maven succeeded but $jar is missing"
touch "$stamp"
