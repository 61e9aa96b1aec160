#!/bin/sh
# Installs what the aarch64 cross build and its qemu-user tests need (docs/arm64.md): the
# cross compiler, qemu-user, and the arm64 (multiarch) form of every -dev package in
# scripts/setup.sh's BUILD_PKGS. Does nothing when all are present; uses sudo when not root.
# `make test-arm64` runs it; `make demo` and the normal build never do. A package without
# an arm64 form is skipped (the build makes optional libraries optional); the exit status is
# non-zero only when the compiler, qemu or a library the build links cannot be had.
set -eu
cd "$(dirname "$0")/.."

# The -dev packages the native build lists, read from scripts/setup.sh so that one added
# there is picked up here too; tool packages (no -dev) have no :arm64 form we want.
build_pkgs=$(sed -n '/^BUILD_PKGS="/,/"/p' scripts/setup.sh | tr -d '"' | sed 's/^BUILD_PKGS=//' |
    tr ' ' '\n' | grep -- '-dev$' || true)
TOOLS="gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"
# Libraries the build cannot do without (the rest are optional by pkg-config in the Makefile).
REQUIRED="libuv1-dev libssl-dev libopenblas-dev libzstd-dev libwslay-dev libhttp-parser-dev
libcurl4-openssl-dev libcjson-dev libsqlite3-dev libpcre2-dev libc6"

installed() {
    case "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" in
        *"install ok installed"*) return 0 ;;
    esac
    return 1
}
ARM64_LIBDIR=/usr/lib/aarch64-linux-gnu
HOST_LIBDIR=/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
# The link-time names (lib*.so) a host -dev package provides.
dev_links() { dpkg -L "$1" 2>/dev/null | grep "^$HOST_LIBDIR/lib[^/]*\.so\$" || true; }
# A -dev package that is not Multi-Arch: same (libwslay-dev, libhttp-parser-dev) cannot be
# installed for arm64 beside the host's. Its headers are the host's (architecture-free); what
# the cross linker lacks is lib*.so, which that package would have made a link to the arm64
# runtime library: make the same link. True when every such link is there.
dev_mirrored() {
    installed "$1" || return 1
    links=$(dev_links "$1")
    [ -n "$links" ] || return 1
    for l in $links; do [ -e "$ARM64_LIBDIR/${l##*/}" ] || return 1; done
}
mirror_dev() {
    for l in $(dev_links "$1"); do
        t=$(readlink "$l") || return 1
        [ -e "$ARM64_LIBDIR/$t" ] || return 1
        $SUDO ln -sfn "$t" "$ARM64_LIBDIR/${l##*/}"
    done
    echo "setup-arm64: $1 has no arm64 form beside the host's; linked ${ARM64_LIBDIR}/lib*.so to its runtime library"
}
# The runtime libraries a host -dev package depends on (libwslay1 for libwslay-dev).
dev_runtime() {
    dpkg-query -W -f='${Depends}' "$1" 2>/dev/null | tr ',' '\n' | sed 's/(.*//; s/|.*//; s/ //g' |
        grep '^lib' | grep -v -- '-dev$' || true
}
have_qemu() { command -v qemu-aarch64 >/dev/null 2>&1 || command -v qemu-aarch64-static >/dev/null 2>&1; }

missing=""
for p in $TOOLS; do
    [ "$p" = qemu-user ] && have_qemu && continue
    installed "$p" || missing="$missing $p"
done
for p in $build_pkgs; do
    installed "$p:arm64" || dev_mirrored "$p" || missing="$missing $p:arm64"
done
# qemu-user runs the arm64 programs with -L /: the loader /lib/ld-linux-aarch64.so.1 and the
# libc it loads must be one glibc, libc6:arm64's (docs/arm64.md, "Tests").
installed libc6:arm64 || missing="$missing libc6:arm64"
[ -z "$missing" ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "setup-arm64: not root and no sudo; install these by hand:$missing" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
# --no-remove everywhere: an arm64 -dev package that is not Multi-Arch: same would otherwise
# replace the host's (apt removes the amd64 libpq-dev, libwslay-dev, ... to install it), and
# the native build would no longer link. Such a package fails here and is mirrored below.
echo "setup-arm64: installing:$missing"
case " $(dpkg --print-foreign-architectures | tr '\n' ' ') " in
    *" arm64 "*) ;;
    *) $SUDO dpkg --add-architecture arm64 ;;
esac
$SUDO apt-get update -qq || echo "setup-arm64: apt-get update failed; trying what is known" >&2
# shellcheck disable=SC2086
if ! $SUDO apt-get install -y -qq --no-install-recommends --no-remove $missing >/dev/null 2>&1; then
    # One package that cannot be had (no arm64 form, a multiarch clash) must not keep the
    # others out: retry one by one and fail only for a tool or a library the build needs.
    failed=""
    for p in $missing; do
        $SUDO apt-get install -y -qq --no-install-recommends --no-remove "$p" >/dev/null 2>&1 || failed="$failed $p"
    done
    # A -dev package without a co-installable arm64 form: its runtime library and a link.
    still=""
    for p in $failed; do
        base=${p%:arm64}
        if [ "$base" != "$p" ] && installed "$base"; then
            rt=$(dev_runtime "$base")
            # shellcheck disable=SC2046
            if [ -n "$rt" ] && $SUDO apt-get install -y -qq --no-install-recommends --no-remove \
                $(for r in $rt; do echo "$r:arm64"; done) >/dev/null 2>&1 && mirror_dev "$base"; then
                continue
            fi
        fi
        still="$still $p"
    done
    failed=$still
    if [ -n "$failed" ]; then
        echo "setup-arm64: could not install:$failed" >&2
        for p in $failed; do
            base=${p%:arm64}
            case " $(echo $TOOLS $REQUIRED) " in
                *" $base "*) echo "setup-arm64: $p is needed for the arm64 build; giving up" >&2; exit 1 ;;
            esac
        done
        echo "setup-arm64: the arm64 build goes on without:$failed" >&2
    fi
fi
have_qemu || { echo "setup-arm64: no qemu-aarch64 after install" >&2; exit 1; }
echo "setup-arm64: done"
