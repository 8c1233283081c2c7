#!/bin/sh
# Lays out Debian's fortune packages as one folder per language, the input of
# `kiln data import text --language-from-dir` (docs/workloads.md "2. Multilingual LM pretraining"):
#
#   examples/data/fortunes_corpus.sh /tmp/fortunes      # then /tmp/fortunes/de, /tmp/fortunes/en, ...
#
# Each language folder holds symlinks to every regular file its packages install under
# /usr/share/games/fortunes (the .dat index files and any non-link .u8 copies included: the
# importer skips *.dat and picks between X and X.u8); the packages' own symlinks are left out
# (fortunes-cs mirrors cs/ as cz/ and sk/, and most X.u8 are links to X), so no document is read
# twice and none leaks from train into held-out. Packages come from scripts/install-deps.sh
# (WORKLOAD_PKGS); a language whose packages are missing is an error naming them.
set -eu
out=${1:?usage: $0 OUT_DIR}
mkdir -p "$out"
for spec in en:fortunes,fortunes-min de:fortunes-de it:fortunes-it ru:fortunes-ru es:fortunes-es \
            pl:fortunes-pl cs:fortunes-cs bg:fortunes-bg pt:fortunes-br zh:fortunes-zh \
            eo:fortunes-eo ga:fortunes-ga; do
  lang=${spec%%:*}
  rm -rf "$out/$lang"
  mkdir -p "$out/$lang"
  for pkg in $(echo "${spec#*:}" | tr , ' '); do
    files=$(dpkg -L "$pkg" 2>/dev/null) || { echo "$0: package $pkg is not installed (scripts/install-deps.sh)" >&2; exit 1; }
    for f in $files; do
      case "$f" in /usr/share/games/fortunes/*) ;; *) continue ;; esac
      [ -f "$f" ] || continue
      [ -L "$f" ] && continue   # cz/ and sk/ mirror cs/, X.u8 -> X: read each document once
      name=$(echo "${f#/usr/share/games/fortunes/}" | tr / _)
      ln -sf "$f" "$out/$lang/$name"
    done
  done
done
echo "$out: $(ls "$out" | wc -l) languages: $(ls "$out" | tr '\n' ' ')"
