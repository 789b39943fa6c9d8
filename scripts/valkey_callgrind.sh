#!/bin/sh
# Measurement only: the platform's Valkey under callgrind, collecting only inside EVALSHA/EVAL (the scripts'
# work), for DISPATCH_REDIS_SERVER (tests/integration/bench_script_instructions.py). Dumps go to
# $CALLGRIND_OUT (default /tmp/callgrind-valkey), one file per `callgrind_control -d`.
out=${CALLGRIND_OUT:-/tmp/callgrind-valkey}
mkdir -p "$out"
exec valgrind --tool=callgrind --toggle-collect=evalShaCommand --toggle-collect=evalCommand \
  --callgrind-out-file="$out/cg.%p" "$(cd "$(dirname "$0")/.." && DISPATCH_REDIS_SERVER= .venv/bin/python -c \
  'from dispatchsite.redis_server import server_path; print(server_path())')" "$@"
