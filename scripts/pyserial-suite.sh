#!/usr/bin/env bash
# Fetches pyserial 3.5's source release (its own test suite, test/test.py and
# test/test_advanced.py, and its examples/rfc2217_server.py) into DIR, checked by its
# SHA-256, and prints the unpacked directory. Used by crates/cli/tests/pyserial_suite.rs;
# nothing is fetched when it is there already.
#
#   scripts/pyserial-suite.sh [DIR] [PYTHON]     (defaults: target/pyserial-suite, python3)
set -euo pipefail
dir=${1:-target/pyserial-suite}
python=${2:-python3}
sha=3c77e014170dfffbd816e6ffc205e9842efb10be9f58ec16d3e8675b4925cddb
tree="$dir/pyserial-3.5"
if [[ -f $tree/test/test.py && -f $tree/examples/rfc2217_server.py ]]; then
  echo "$tree"
  exit 0
fi
mkdir -p "$dir"
if [[ ! -f $dir/pyserial-3.5.tar.gz ]]; then
  "$python" -m pip download --quiet --no-deps --no-binary :all: pyserial==3.5 -d "$dir" >&2 || {
    echo "cannot fetch pyserial 3.5's source from the package index (pip download pyserial==3.5); Debian: apt-get install python3-pip" >&2
    exit 1
  }
fi
got=$(sha256sum "$dir/pyserial-3.5.tar.gz" | cut -d' ' -f1)
if [[ $got != "$sha" ]]; then
  echo "$dir/pyserial-3.5.tar.gz has SHA-256 $got, not $sha: deleted" >&2
  rm -f "$dir/pyserial-3.5.tar.gz"
  exit 1
fi
tar -xzf "$dir/pyserial-3.5.tar.gz" -C "$dir"
echo "$tree"
