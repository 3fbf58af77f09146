#!/usr/bin/env bash
# tiermem set-up: installs what the build and the tests need on a fresh Debian 12 machine (as root),
# then builds the workspace in release mode. Idempotent: a second run only rebuilds what changed.
#
# Sourced by scripts/demo.sh and scripts/test.sh; safe to run on its own.
set -euo pipefail

TIERMEM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export TIERMEM_ROOT

log() { printf '\033[1m[tiermem setup]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[tiermem setup] error:\033[0m %s\n' "$*" >&2; exit 1; }

if [ "$(id -u)" -ne 0 ]; then
  die "run as root: tiermem registers userfaultfd ranges, mounts test namespaces and installs packages"
fi

# Debian packages the build and the tests use. Later subsystems add theirs here, in one place.
#   libpmemobj-dev: PMDK, the baseline of `tiermem bench vnvm` (crates/pmdk).
#   redis-server, redis-tools: Redis 7.0 (Debian 12) as the baseline of `tiermem bench kv` and
#     the tiermem-kv tests; redis-cli and redis-benchmark as real clients of tiermem-kv.
#   maven, default-jdk-headless: build and run YCSB 0.17.0 with tiermem's binding (bench/ycsb).
#   fonts-dejavu-core: the font of the benchmarks' charts (plotters lays text out with ab_glyph
#     from /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf; no fontconfig or freetype needed).
#   tokyocabinet-bin, sqlite3: unmodified programs (Tokyo Cabinet's on-memory database tools,
#     sqlite3 on :memory:) run under the pheap LD_PRELOAD library (crates/pheap-preload tests,
#     tiermem bench pheap).
#   memcached, libmemcached-tools, x264, libvips-tools: unmodified programs of `tiermem bench
#     prefault` run plain and under `tiermem prefault run` (memcached under libmemcached's
#     memcslap; x264 and vips, the PARSEC members Debian packages), beside sqlite3, sort,
#     python3 and redis.
#   fio, libsqlite3-dev: unmodified fio reading through libtiermem_zread_preload.so (z-READ,
#     verify=crc32c), and the iocache SQLite VFS extension and TPC-C-like driver, built against
#     the system libsqlite3 and loaded into the unmodified sqlite3 shell.
#   libjemalloc2: jemalloc, a baseline of `tiermem bench pheap`'s allocation loop (preloaded into
#     its worker process), beside glibc malloc.
#   stress-ng: its --vm stressor with --verify under `tiermem pager run` (crates/pager-preload
#     tests); memcached (above) is the pager shim's other unmodified program.
APT_PACKAGES=(build-essential pkg-config git ca-certificates curl iproute2 procps
  libpmemobj-dev
  redis-server redis-tools
  maven default-jdk-headless
  fonts-dejavu-core
  tokyocabinet-bin sqlite3
  memcached libmemcached-tools x264 libvips-tools
  fio libsqlite3-dev
  libjemalloc2
  stress-ng)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [[ " ${missing[*]} " == *" memcached "* ]]; then
    # Like redis-server's below: bench prefault starts its own memcached on a free port.
    if [ -d /run/systemd/system ]; then
      systemctl disable --now memcached.service >/dev/null 2>&1 || true
    else
      service memcached stop >/dev/null 2>&1 || true
      update-rc.d memcached disable >/dev/null 2>&1 || true
    fi
  fi
  if [[ " ${missing[*]} " == *" redis-server "* ]]; then
    # Debian's package enables a system redis-server on port 6379 and starts it where services
    # may start. The benchmarks and tests start their own on free ports with their own config
    # and directory: stop and disable the system one so that it holds no port, memory or CPU.
    if [ -d /run/systemd/system ]; then
      systemctl disable --now redis-server.service >/dev/null 2>&1 || true
    else
      service redis-server stop >/dev/null 2>&1 || true
      update-rc.d redis-server disable >/dev/null 2>&1 || true
    fi
  fi
fi

# Rust toolchain: the one rustup installed (~/.cargo/bin), or rustup fetched now, or Debian's.
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
if ! command -v cargo >/dev/null 2>&1; then
  log "no Rust toolchain found: installing rustup (stable, minimal profile)"
  if curl -sSf --max-time 60 https://sh.rustup.rs -o /tmp/rustup-init.sh; then
    sh /tmp/rustup-init.sh -y --profile minimal --component rustfmt,clippy >/dev/null
    . "$HOME/.cargo/env"
  else
    log "rustup unreachable: falling back to Debian's rustc/cargo"
    apt-get install -y -qq --no-install-recommends rustc cargo >/dev/null
  fi
fi
rust_minor=$(rustc --version | sed -E 's/^rustc 1\.([0-9]+).*/\1/')
[ "$rust_minor" -ge 80 ] || die "rustc 1.$rust_minor is too old: tiermem needs Rust >= 1.80 (install rustup: https://rustup.rs)"

cd "$TIERMEM_ROOT"
# YCSB with tiermem's binding (bench/ycsb): built with Maven from Maven Central when its jar is
# missing or older than its sources; a no-op otherwise.
if ! bash "$TIERMEM_ROOT/bench/ycsb/build.sh"; then
  die "could not build the YCSB binding (bench/ycsb): see the message above"
fi
log "building the workspace (release)"
cargo build --release --workspace --quiet
export PATH="$TIERMEM_ROOT/target/release:$PATH"
log "built: $TIERMEM_ROOT/target/release/tiermem, libtiermem.so, crates/capi/include/tiermem.h"
