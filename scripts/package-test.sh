#!/usr/bin/env bash
# The Debian package as a user gets it: `./run package` builds it, then its contents are
# checked (dpkg -c), it is installed (dpkg -i, as root), the installed binary, man pages,
# completions and examples are used, the systemd unit is verified (systemd-analyze verify,
# where available) and run as the unit would run it (ExecStart with the unit's environment
# file, without systemd, which this machine may not run), and the package is removed.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '\033[1m[package-test]\033[0m %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

./run package
deb=$(ls -t target/debian/ndd_*.deb | head -1)
contents=$(dpkg -c "$deb")
for f in ./usr/bin/ndd ./lib/systemd/system/ndd@.service ./lib/systemd/system/ndd.service \
  ./usr/lib/systemd/user/ndd@.service ./usr/lib/systemd/user/ndd-session@.service \
  ./usr/share/man/man1/ndd-run.1 \
  ./usr/share/bash-completion/completions/ndd ./usr/share/zsh/vendor-completions/_ndd \
  ./usr/share/fish/vendor_completions.d/ndd.fish ./usr/share/doc/ndd/service.md \
  ./usr/share/applications/ndd.desktop \
  ./usr/share/doc/ndd/examples/serial.toml ./usr/share/doc/ndd/examples/serial.env; do
  grep -qE " ${f}(\.gz)?\$" <<<"$contents" || fail "$deb does not hold $f"
done
log "contents ok: $(wc -l <<<"$contents") entries"

if [[ $(id -u) -ne 0 ]]; then
  log "not root: install, unit and removal steps need root (CI runs as root)"
  exit 1
fi
dpkg -i "$deb" >/dev/null
trap 'dpkg -r ndd >/dev/null 2>&1 || true; rm -rf /etc/ndd/pkgtest.* /var/lib/ndd-pkgtest' EXIT
/usr/bin/ndd --version | grep -q '^ndd ' || fail "ndd --version"
man -w ndd-run >/dev/null 2>&1 || [[ -f /usr/share/man/man1/ndd-run.1.gz || -f /usr/share/man/man1/ndd-run.1 ]] \
  || fail "man page ndd-run"
/usr/bin/ndd check /usr/share/doc/ndd/examples/serial.toml >/dev/null || fail "ndd check of the example"

# An instance of the unit, as docs/service.md sets one up.
mkdir -p /etc/ndd
cat >/etc/ndd/pkgtest.toml <<'TOML'
driver = "pkgtest"
[link]
address = "127.0.0.1:17931"
[[stream]]
name = "events"
direction = "device-to-app"
source = { type = "synthetic", size = 64, interval_ms = 10.0, count = 100, seed = 1 }
sink = { type = "check", seed = 1, size = 64, expect = 100 }
TOML
printf 'NDD_SIDE=app\nNDD_ARGS="--once --insecure"\n' >/etc/ndd/pkgtest.env
if command -v systemd-analyze >/dev/null; then
  for unit in ndd@pkgtest.service ndd.service; do
    out=$(systemd-analyze verify "/lib/systemd/system/$unit" 2>&1) || {
      printf '%s\n' "$out" >&2
      fail "systemd-analyze verify $unit"
    }
    [[ -z "$out" ]] || { printf '%s\n' "$out" >&2; fail "systemd-analyze verify $unit printed warnings"; }
  done
  # The user units, as a user's manager reads them (a home with the instance's files).
  uhome=$(mktemp -d)
  mkdir -p "$uhome/.config/ndd" "$uhome/run" && chmod 700 "$uhome/run"
  cp /etc/ndd/pkgtest.toml /etc/ndd/pkgtest.env "$uhome/.config/ndd/"
  for unit in ndd@pkgtest.service ndd-session@pkgtest.service; do
    cp "/usr/lib/systemd/user/${unit/pkgtest/}" "$uhome/$unit"
    out=$(cd "$uhome" && HOME=$uhome XDG_RUNTIME_DIR=$uhome/run systemd-analyze --user verify "$unit" 2>&1) || {
      printf '%s\n' "$out" >&2
      fail "systemd-analyze --user verify $unit"
    }
    [[ -z "$out" ]] || { printf '%s\n' "$out" >&2; fail "systemd-analyze --user verify $unit printed warnings"; }
  done
  rm -rf "$uhome"
  log "systemd-analyze verify: clean"
else
  log "systemd-analyze not installed: unit not verified"
fi
# ExecStart as systemd would run it (environment file, state directory), both sides.
exec_start=$(sed -n 's/^ExecStart=//p' /lib/systemd/system/ndd@.service)
run_unit() { # instance side args
  (set -a; . "/etc/ndd/$1.env"; NDD_SIDE=$2; NDD_ARGS=$3; set +a
   cmd=${exec_start//%i/$1}; cmd=${cmd//\/var\/lib\/ndd//var/lib/ndd-pkgtest}
   eval "exec $cmd")
}
run_unit pkgtest app "--once --insecure" 2>/tmp/ndd-pkgtest-app.log &
app=$!
sleep 0.5
run_unit pkgtest device "--once --insecure" 2>/tmp/ndd-pkgtest-dev.log || fail "device side: $(cat /tmp/ndd-pkgtest-dev.log)"
wait $app || fail "app side: $(cat /tmp/ndd-pkgtest-app.log)"
grep -q 'check: 100 frames.*OK' /tmp/ndd-pkgtest-app.log || fail "app side check: $(cat /tmp/ndd-pkgtest-app.log)"
log "the unit's command line ran both sides: $(grep -o 'check: 100 frames[^:]*' /tmp/ndd-pkgtest-app.log)"

dpkg -r ndd >/dev/null
[[ ! -e /usr/bin/ndd ]] || fail "dpkg -r left /usr/bin/ndd"
log "installed, used, verified and removed: ok"
