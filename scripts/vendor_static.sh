#!/usr/bin/env bash
# Vendors the dashboard's browser libraries into app/static/vendor/ from the npm registry, so the app
# serves every asset itself (no CDN; the Content-Security-Policy allows only 'self').
# Run it to upgrade a library, then commit app/static/vendor/. Needs `npm` (only for `npm pack`).
set -euo pipefail
cd "$(dirname "$0")/.."

dest=app/static/vendor
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# package@range  file-in-package  vendored-name
assets=(
  "htmx.org@2 dist/htmx.min.js htmx.min.js"
  "htmx-ext-sse@2 dist/sse.min.js htmx-ext-sse.min.js"
  "uplot@1 dist/uPlot.iife.min.js uPlot.iife.min.js"
  "uplot@1 dist/uPlot.min.css uPlot.min.css"
)

mkdir -p "$dest"
: > "$work/VERSIONS"
for line in "${assets[@]}"; do
  read -r pkg file name <<<"$line"
  unpack="$work/${pkg%@*}"
  if [ ! -d "$unpack" ]; then
    tarball=$(cd "$work" && npm pack --silent "$pkg")
    mkdir -p "$unpack"
    tar xzf "$work/$tarball" -C "$unpack"
    version=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$unpack/package/package.json" | head -n1)
    echo "${pkg%@*} $version" >> "$work/VERSIONS"
    cp "$unpack/package/LICENSE" "$dest/${pkg%@*}.LICENSE"
  fi
  cp "$unpack/package/$file" "$dest/$name"
done
sort -o "$dest/VERSIONS" "$work/VERSIONS"
echo "vendored into $dest:"
cat "$dest/VERSIONS"
