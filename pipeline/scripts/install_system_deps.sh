#!/usr/bin/env bash
# Installs the Debian packages the project uses, when missing (Debian 12 and 13 have them all):
#   needed for the default corpus: sword-text-web (World English Bible), sword-text-sparv
#     (Reina-Valera 1909), libsword-utils (mod2imp);
#   optional: fonts-wqy-zenhei, a font with Chinese, Japanese and Korean glyphs for the labels of
#     attention plots (`aiayn translate --explain`; without it they are written as U+ codes).
# As root it runs apt-get; otherwise it prints the command, and fails only for the corpus packages.
set -euo pipefail
NEEDED="sword-text-web sword-text-sparv libsword-utils"
OPTIONAL="fonts-wqy-zenhei"
missing=""
missing_needed=""
for p in $NEEDED $OPTIONAL; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
    case " $NEEDED " in *" $p "*) missing_needed="$missing_needed $p" ;; esac
  fi
done
if [ -z "$missing" ]; then exit 0; fi
cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends$missing"
if [ "$(id -u)" = "0" ]; then
  echo "Installing Debian packages:$missing"
  bash -c "$cmd"
elif [ -n "$missing_needed" ]; then
  echo "The default corpus needs Debian packages:$missing_needed" >&2
  echo "Run as root:  sudo bash -c '$cmd'" >&2
  exit 1
else
  echo "Optional Debian packages missing:$missing (a CJK font for attention plots)." >&2
  echo "Run as root:  sudo bash -c '$cmd'" >&2
fi
