#!/usr/bin/env bash
# Quick start, command 1: set up, build, then run tiermem's main job on the embedded default devices
# (emulated NVM/FAM pools under /dev/shm/tiermem; no hardware needed): `tiermem tour`, every
# subsystem at work, each result checked, a table at the end. Arguments go to the tour
# (e.g. `--only kv,migrate`); the exit status is non-zero when a step failed.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
exec "$TIERMEM_ROOT/target/release/tiermem" tour "$@"
