#!/usr/bin/env bash
# Installs the Debian packages that hold the default corpus, when missing:
# sword-text-web (World English Bible), sword-text-sparv (Reina-Valera 1909),
# libsword-utils (mod2imp). As root it runs apt-get; otherwise it prints the command.
set -euo pipefail
PKGS="sword-text-web sword-text-sparv libsword-utils"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then exit 0; fi
cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends$missing"
if [ "$(id -u)" = "0" ]; then
  echo "Installing the default corpus packages:$missing"
  bash -c "$cmd"
else
  echo "The default corpus needs Debian packages:$missing" >&2
  echo "Run as root:  sudo bash -c '$cmd'" >&2
  exit 1
fi
