#!/usr/bin/env bash
# Builds outbox and installs the binary, its manual page and its bash, zsh and fish
# completions under PREFIX. Each file is written under a temporary name in its folder and
# renamed into place, so a command that runs meanwhile sees the old file or the new one.
set -Eeuo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/install.sh [--configuration debug|release] [PREFIX]

Builds outbox (release by default, with the Swift runtime linked in) and installs:
  PREFIX/bin/outbox
  PREFIX/share/man/man1/outbox.1
  PREFIX/share/bash-completion/completions/outbox
  PREFIX/share/zsh/site-functions/_outbox
  PREFIX/share/fish/vendor_completions.d/outbox.fish
PREFIX defaults to /usr/local. Debian's libcurl, libsqlite3 and libyaml are installed with
apt if missing; libcurl and libyaml stay shared libraries, SQLite is linked in.

Options:
  --configuration debug|release   which build to install (default release)
  --help                          show this help
EOF
}

fail() {
  echo "install.sh: $*" >&2
  exit 1
}

configuration=release
prefix=""
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --configuration)
      [ $# -ge 2 ] || fail "--configuration needs debug or release"
      configuration=$2
      shift 2 ;;
    --configuration=*) configuration=${1#*=}; shift ;;
    -*) fail "unknown option $1 (see --help)" ;;
    *)
      [ -z "$prefix" ] || fail "one PREFIX only (got $prefix and $1)"
      prefix=$1
      shift ;;
  esac
done
case $configuration in
  debug | release) ;;
  *) fail "--configuration takes debug or release, not \"$configuration\"" ;;
esac
prefix=${prefix:-/usr/local}
case $prefix in
  /*) ;;
  *) prefix="$PWD/$prefix" ;;
esac

# A failing step names itself: set -e alone would exit without a word.
trap 'echo "install.sh: failed: $BASH_COMMAND (line $LINENO)" >&2' ERR

cd "$(dirname "$0")/.."
source .ci/setup

echo "building outbox ($configuration)" >&2
# Package.swift links the Swift runtime into outbox (-static-stdlib), checked with ldd below.
# --static-swift-stdlib would say it again but changes every module's flags, so each build
# after `.ci/demo`'s (and the other way round) would start from scratch.
swift build -c "$configuration" --product outbox >&2
built="$(swift build -c "$configuration" --show-bin-path)/outbox"
[ -x "$built" ] || fail "the build did not produce $built"

# Debian's C libraries may be shared; the Swift runtime must not be (no toolchain on the target).
if ldd "$built" | grep -q 'libswift'; then
  ldd "$built" >&2
  fail "$built needs the Swift runtime's shared libraries (libswift*.so); it must link them statically"
fi

for tool in strip patchelf mktemp; do
  command -v "$tool" >/dev/null || fail "$tool is missing (Debian's binutils / patchelf / coreutils)"
done

staged=()
cleanup() { [ "${#staged[@]}" -eq 0 ] || rm -f "${staged[@]}"; }
trap cleanup EXIT

# place MODE DEST COMMAND...: what COMMAND prints becomes DEST, through a temporary name in
# DEST's folder; a command that fails leaves DEST as it was.
place() {
  local mode=$1 dest=$2 dir temp
  shift 2
  dir=$(dirname "$dest")
  mkdir -p "$dir" || fail "cannot create $dir"
  temp=$(mktemp "$dir/.outbox-install.XXXXXX")
  staged+=("$temp")
  "$@" > "$temp" || fail "\`$*\` failed"
  [ -s "$temp" ] || fail "\`$*\` printed nothing"
  chmod "$mode" "$temp"
  mv -f "$temp" "$dest"
  echo "installed $dest" >&2
}

mkdir -p "$prefix/bin" || fail "cannot create $prefix/bin"
binary=$(mktemp "$prefix/bin/.outbox-install.XXXXXX")
staged+=("$binary")
cp "$built" "$binary"
strip "$binary"
# SwiftPM links with RUNPATH $ORIGIN: the installed binary would look for its shared
# libraries in its own folder first, where anyone who can write there could plant one.
patchelf --remove-rpath "$binary"
chmod 0755 "$binary"
"$binary" --version >/dev/null || fail "the stripped binary does not run"

# The manual page and the completions come from the binary being installed.
place 0644 "$prefix/share/man/man1/outbox.1" "$binary" man
place 0644 "$prefix/share/bash-completion/completions/outbox" "$binary" completion bash
place 0644 "$prefix/share/zsh/site-functions/_outbox" "$binary" completion zsh
place 0644 "$prefix/share/fish/vendor_completions.d/outbox.fish" "$binary" completion fish
mv -f "$binary" "$prefix/bin/outbox"
echo "installed $prefix/bin/outbox ($("$prefix/bin/outbox" --version))" >&2
