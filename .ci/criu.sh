#!/usr/bin/env bash
# CRIU for the snapshot kind (docs/snapshots.md): built from its source release, fetched from
# Debian's archive with apt (signed by Debian's archive key, checked against the pinned digest
# below), with Debian's build dependencies; cached under $PREBAKE_CRIU_CACHE (default
# ~/.cache/prebake/criu/<version>) so a second run costs nothing. Prints the binary's path.
# Debian 12's own criu (3.17) fails `criu check` on recent kernels (vDSO layout): not used.
set -euo pipefail
version=4.1.1
debian_revision=1
suite=trixie
sha256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
cache=${PREBAKE_CRIU_CACHE:-$HOME/.cache/prebake/criu}/$version
binary=$cache/criu
if [ -x "$binary" ] && "$binary" --version >/dev/null 2>&1; then
    echo "$binary"
    exit 0
fi
deps=(build-essential pkg-config libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
    python3-protobuf libcap-dev libnl-3-dev libnet1-dev libaio-dev libgnutls28-dev libbsd-dev uuid-dev libdrm-dev)
missing=()
for dep in "${deps[@]}"; do
    dpkg-query -W -f='${Status}' "$dep" 2>/dev/null | grep -q 'ok installed' || missing+=("$dep")
done
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/prebake-criu.XXXXXX")
trap 'rm -rf "$work"' EXIT
# A private apt configuration: the newer suite's source index only, the host's sources untouched.
mkdir -p "$work/lists/partial"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
    >"$work/sources.list"
apt_private=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$work/lists" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
apt-get "${apt_private[@]}" update -qq
# --download-only fetches the .dsc, the Debian patches and the upstream tarball; only the last is
# used (the upstream source as released), and the archive may have moved its revision on: the
# tarball is what is pinned.
(cd "$work" && apt-get "${apt_private[@]}" source --download-only "criu=$version-$debian_revision" >/dev/null 2>&1) || true
tarball=$work/criu_$version.orig.tar.xz
if [ ! -f "$tarball" ]; then
    echo "criu.sh: Debian's $suite archive did not give criu_$version.orig.tar.xz; update version= and sha256= in $0" >&2
    exit 1
fi
echo "$sha256  $tarball" | sha256sum -c --quiet - || {
    echo "criu.sh: $tarball does not match the pinned sha256; refusing to build it" >&2
    exit 1
}
tar -xJf "$tarball" -C "$work"
make -C "$work/criu-$version" -j"$(nproc)" criu >"$work/build.log" 2>&1 || {
    tail -30 "$work/build.log" >&2
    echo "criu.sh: building CRIU $version failed (log above)" >&2
    exit 1
}
mkdir -p "$cache"
install -m 0755 "$work/criu-$version/criu/criu" "$cache/criu.tmp"
mv "$cache/criu.tmp" "$binary"
echo "$binary"
