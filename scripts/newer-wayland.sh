#!/usr/bin/env bash
# A Debian root newer than Debian 12 (forky: sway 1.12 on wlroots 0.20, grim 1.5,
# wl-clipboard 2.3; mutter 50 with xdg-desktop-portal 1.22 and its GNOME backend 50) in
# target/newer-wayland/root, or where NDD_NEWER_WAYLAND says, for the tests of what Debian 12
# lacks: ext-image-copy-capture-v1 (the wayland-screen source), ext-data-control-v1 (the
# wayland-clipboard endpoint), the portal's RemoteDesktop version 2 (kept grants) and its
# ConnectToEIS (portal-input). The tests run its programs in a mount namespace of their own
# (ndd_procs::rooted); nothing of it is installed on this machine. mmdebstrap made it in 42 s
# here (1.1 GB). Made again only when the package list below changes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="${NDD_NEWER_WAYLAND:-target/newer-wayland/root}"
SUITE=forky
PACKAGES=sway,grim,wl-clipboard,foot,wtype,xwayland,fonts-dejavu-core,wev,mutter,xdg-desktop-portal,xdg-desktop-portal-gnome,pipewire,wireplumber,dbus-daemon,dbus-bin,libgl1-mesa-dri
STAMP="$ROOT/.ndd-made"
WANT="$SUITE $PACKAGES"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  exit 0
fi
command -v mmdebstrap >/dev/null || {
  echo "newer-wayland: mmdebstrap is missing (apt-get install mmdebstrap)" >&2
  exit 1
}
[[ $(id -u) -eq 0 ]] || { echo "newer-wayland: making the root needs root (mmdebstrap, mounts)" >&2; exit 1; }
rm -rf "$ROOT"
mkdir -p "$(dirname "$ROOT")"
echo "newer-wayland: making a Debian $SUITE root with $PACKAGES in $ROOT" >&2
# The mirror here may serve a suite whose Release has passed its Valid-Until date.
mmdebstrap --quiet --variant=apt --aptopt='Acquire::Check-Valid-Until "false"' \
  --include="$PACKAGES" "$SUITE" "$ROOT" http://deb.debian.org/debian
echo "$WANT" > "$STAMP"
