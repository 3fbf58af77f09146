#!/usr/bin/env bash
# Quick start, command 2: set up, build, then run the whole test suite: unit, integration and crash
# tests of every crate, the C ABI example, and an install check (make install to a prefix, then a
# C program built with pkg-config against it). Runs as root (set-up installs packages; migrate
# needs network namespaces); the media, fault, vnvm, pheap, kv and prefault test binaries then run a second
# time as uid 65534, to check that they work without root.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
# setup.sh runs with `set -e`; the suite must not stop at the first failing test binary: the
# install check and the summary always run, and the exit status says whether anything failed.
set +e
cd "$TIERMEM_ROOT"
log "running the test suite"
start=$(date +%s)
logf=$(mktemp /tmp/tiermem-test.XXXXXX.log)
TIERMEM_REQUIRE_CLIENTS=1 cargo test --release --workspace --no-fail-fast 2>&1 | tee "$logf"
status=${PIPESTATUS[0]}
# Only libtest's summary lines count (a test's own output, e.g. the tour's "1 failed", does not).
passed=$(grep -E '^test result' "$logf" | grep -Eo '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
failed=$(grep -E '^test result' "$logf" | grep -Eo '[0-9]+ failed' | awk '{s+=$1} END {print s+0}')
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  # cargo failed without a failing test: a test target did not build (or a test binary
  # crashed before its summary). Count it, so the closing line cannot read as a pass.
  echo "test build or harness ... FAILED (cargo test exited $status with no failing test)"
  failed=1
fi

# The subsystems that must work without root, once more as an unprivileged user: the test
# executables cargo built above for media, fault, vnvm, pheap and kv, run directly (never cargo)
# as uid/gid 65534 with no supplementary groups, each from its crate's directory (as cargo runs
# them), with a scratch TMPDIR/TIERMEM_DIR on tmpfs and a scratch disk directory for the tests
# that need a non-tmpfs file (CARGO_TARGET_TMPDIR). Their results go into the same totals. A test
# that truly needs a privilege says so on a "SKIPPED as uid 65534: ..." line, listed below.
NOBODY=65534
UNPRIV_CRATES=(tiermem-media tiermem-fault tiermem-vnvm tiermem-pheap tiermem-kv tiermem-prefault tiermem-prefault-preload)
log "again as uid $NOBODY (no root): the test binaries of ${UNPRIV_CRATES[*]}"
unpriv_skipped=()
if ! command -v setpriv >/dev/null 2>&1; then
  echo "unprivileged run ... FAILED (setpriv not found: it is in Debian's util-linux)"
  failed=$((failed + 1))
  status=1
else
  pkgs=()
  for c in "${UNPRIV_CRATES[@]}"; do pkgs+=(-p "$c"); done
  # One JSON message per built artifact; keep test executables (profile.test) with their crate.
  bins=$(cargo test --release --no-run --message-format=json "${pkgs[@]}" 2>/dev/null |
    sed -nE 's/.*"manifest_path":"([^"]*)".*"profile":\{[^}]*"test":true[^}]*\}.*"executable":"([^"]*)".*/\1 \2/p')
  shm=$(mktemp -d /dev/shm/tiermem-unpriv.XXXXXX)
  disk=$(mktemp -d /tmp/tiermem-unpriv.XXXXXX)
  chown "$NOBODY:$NOBODY" "$shm" "$disk"
  out=$(mktemp /tmp/tiermem-unpriv.XXXXXX.log)
  if [ -z "$bins" ]; then
    echo "unprivileged run ... FAILED (cargo listed no test executables)"
    failed=$((failed + 1))
    status=1
  fi
  while read -r manifest exe; do
    [ -n "$exe" ] || continue
    crate=$(basename "$(dirname "$manifest")")
    name=$(basename "$exe" | sed -E 's/-[0-9a-f]+$//')
    (cd "$(dirname "$manifest")" &&
      TMPDIR="$shm" TIERMEM_DIR="$shm/pools" CARGO_TARGET_TMPDIR="$disk" HOME="$shm" \
      TIERMEM_REQUIRE_CLIENTS=1 timeout 1200 \
      setpriv --reuid="$NOBODY" --regid="$NOBODY" --clear-groups -- "$exe") >"$out" 2>&1
    rc=$?
    p=$(grep -E '^test result' "$out" | grep -Eo '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
    f=$(grep -E '^test result' "$out" | grep -Eo '[0-9]+ failed' | awk '{s+=$1} END {print s+0}')
    while IFS= read -r line; do unpriv_skipped+=("$crate/$name: ${line#SKIPPED as uid $NOBODY: }"); done \
      < <(grep -E "^SKIPPED as uid $NOBODY: " "$out" | sort -u)
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed or timed out before its summary
    passed=$((passed + p))
    failed=$((failed + f))
    if [ "$rc" -ne 0 ]; then
      status=1
      cat "$out"
      echo "[uid $NOBODY] $crate/$name ... FAILED (exit $rc): $p passed, $f failed"
    else
      echo "[uid $NOBODY] $crate/$name ... ok: $p passed"
    fi
  done <<<"$bins"
  rm -rf "$shm" "$disk" "$out"
  if [ ${#unpriv_skipped[@]} -gt 0 ]; then
    echo "skipped as uid $NOBODY (they need a privilege):"
    printf '  %s\n' "${unpriv_skipped[@]}"
  fi
fi

log "install check: make install PREFIX=<tmp>, then build examples/c/tour.c with pkg-config"
prefix=$(mktemp -d /tmp/tiermem-prefix.XXXXXX)
if make -s install PREFIX="$prefix" >/dev/null &&
   cc -std=c11 -D_GNU_SOURCE -Wall -Werror examples/c/tour.c \
      $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs tiermem) -o "$prefix/tour" &&
   mkdir -p "$prefix/pools" &&
   LD_LIBRARY_PATH="$prefix/lib" "$prefix/tour" "$prefix/pools" >/dev/null &&
   "$prefix/bin/tiermem" --version >/dev/null; then
  echo "install check ... ok"
  passed=$((passed + 1))
else
  echo "install check ... FAILED"
  failed=$((failed + 1))
  status=1
fi
rm -rf "$prefix" "$logf"

log "suite finished in $(( $(date +%s) - start )) s"
echo "tiermem: $passed passed, $failed failed"
exit "$status"
