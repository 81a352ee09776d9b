#!/usr/bin/env bash
# Installs the named Debian packages that are not installed yet, with apt-get.
#
#   scripts/apt-install.sh PACKAGE...
#
# The setup scripts may run side by side (scripts/test.sh starts some in the background): a
# lock file makes them take turns, and apt-get waits for a dpkg lock held by anyone else.
set -euo pipefail
[ $# -gt 0 ] || exit 0
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
exec 7>"${TMPDIR:-/tmp}/incontext-apt.lock"
flock 7
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -gt 0 ] || exit 0
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
  "${missing[@]}" >/dev/null
