#!/usr/bin/env bash
# Build the JupyterLab extension (labextension/) into ddp_magic/labextension, where the
# wheel (share/jupyter/labextensions/ddp-magic) and an editable install take it from.
# Needs node >= 20.19 and the venv's jlpm/jupyter-builder (requirements-dev.txt); both
# packages come from their registries (npm, PyPI), no browser or toolchain download.
# Skips what is done: `jlpm install` only when package.json/yarn.lock changed,
# the build only when the sources (or the version in ddp_magic/_version.py) changed.
# Prints the hash of the built extension on its last line (setup.sh keys its reinstall on it).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DDP_MAGIC_VENV:-.venv}
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
export PATH="$VENV/bin:$PATH"
EXT=labextension
OUT=ddp_magic/labextension

if ! command -v node >/dev/null 2>&1; then
  echo "build_labextension: node is not installed; the JupyterLab extension needs node >= 20.19 to build (e.g. apt-get install nodejs, or nodejs.org)" >&2
  exit 1
fi
if ! node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>22||(a===22&&b>=12)||(a===20&&b>=19)||a===21?0:1)'; then
  echo "build_labextension: node $(node --version) is too old; the build (rspack) needs ^20.19 or >=22.12" >&2
  exit 1
fi
if ! command -v jlpm >/dev/null 2>&1; then
  echo "build_labextension: jlpm not found in $VENV/bin; install requirements-dev.txt (jupyter-builder) first" >&2
  exit 1
fi

hash_of() { (cd "$1" && shift && find "$@" -type f 2>/dev/null | LC_ALL=C sort | xargs sha256sum) | sha256sum | cut -d' ' -f1; }

deps=$(hash_of "$EXT" package.json yarn.lock .yarnrc.yml)
deps_stamp="$EXT/node_modules/.ddp_magic-deps"
if [ ! -d "$EXT/node_modules" ] || [ "$(cat "$deps_stamp" 2>/dev/null)" != "$deps" ]; then
  echo "build_labextension: jlpm install (the lockfile is committed; it must not change)" >&2
  # package.json's version is rewritten from _version.py by every build; the lockfile does not hold it
  (cd "$EXT" && YARN_ENABLE_PROGRESS_BARS=false jlpm install --immutable >/dev/null) || {
    echo "build_labextension: jlpm install --immutable failed; if you changed dependencies, run 'jlpm install' in labextension/ and commit yarn.lock" >&2
    exit 1
  }
  deps=$(hash_of "$EXT" package.json yarn.lock .yarnrc.yml)
  echo "$deps" > "$deps_stamp"
fi

sources=$(cat <(hash_of "$EXT" package.json yarn.lock tsconfig.json src style scripts) ddp_magic/_version.py | sha256sum | cut -d' ' -f1)
src_stamp="$EXT/node_modules/.ddp_magic-build"
if [ ! -f "$OUT/package.json" ] || [ ! -f "$OUT/static/style.js" ] || [ "$(cat "$src_stamp" 2>/dev/null)" != "$sources" ]; then
  echo "build_labextension: jlpm build:prod -> $OUT" >&2
  (cd "$EXT" && jlpm build:prod >&2)
  sources=$(cat <(hash_of "$EXT" package.json yarn.lock tsconfig.json src style scripts) ddp_magic/_version.py | sha256sum | cut -d' ' -f1)
  echo "$sources" > "$src_stamp"
fi
hash_of "$OUT" .
