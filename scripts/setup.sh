#!/bin/sh
# Installs the Debian packages Kvasir builds and tests with (docs/design.md, "Dependencies")
# that are missing. Does nothing when all are present. Uses sudo when not root.
set -eu

# What the build links against, then what only the tests use.
BUILD_PKGS="build-essential pkg-config libuv1-dev libssl-dev libopenblas-dev libzstd-dev
libwslay-dev libhttp-parser-dev libcurl4-openssl-dev libcjson-dev libsqlite3-dev libpq-dev libpcre2-dev"
BUILD_PKGS=$(echo $BUILD_PKGS)
TEST_PKGS="ocl-icd-opencl-dev opencl-headers pocl-opencl-icd clinfo
clang-14 libclang-rt-14-dev valgrind iproute2 nftables python3 python3-websockets nginx
curl openssl procps nodejs node-ws chromium testssl.sh postgresql"
PKGS="$BUILD_PKGS $TEST_PKGS"

missing=""
for p in $PKGS; do
    st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    case "$st" in
        *"install ok installed"*) ;;
        *) missing="$missing $p" ;;
    esac
done

# Node's `ws` package: an independent WebSocket peer for the relay's interop test. Debian's
# node-ws (linked into tests/node_modules, which any node build resolves); npm only where
# that package is not there. Never fatal: `make demo` does not need it, and the interop
# test says what is missing.
npm_ws() {
    [ -f tests/node_modules/ws/package.json ] && return 0
    if [ -f /usr/share/nodejs/ws/package.json ]; then
        mkdir -p tests/node_modules && ln -sfn /usr/share/nodejs/ws tests/node_modules/ws
        return 0
    fi
    command -v npm >/dev/null 2>&1 || { echo "setup: no node-ws and no npm: the relay interop test will fail" >&2; return 0; }
    echo "setup: npm install ws into tests/node_modules"
    (npm install --no-save --no-package-lock --no-audit --no-fund \
        --prefix tests ws@8 >/dev/null) ||
        echo "setup: npm install ws failed: the relay interop test will fail" >&2
}

if [ -n "$missing" ]; then
    echo "setup: installing missing Debian packages:$missing"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
            echo "setup: not root and no sudo; install these packages by hand:$missing" >&2
            exit 1
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    if ! $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null; then
        # One package that cannot be installed must not keep the others out: retry them one
        # by one, and fail only when a package the build itself needs is still missing.
        failed=""
        for p in $missing; do
            $SUDO apt-get install -y -qq --no-install-recommends "$p" >/dev/null 2>&1 ||
                failed="$failed $p"
        done
        if [ -n "$failed" ]; then
            echo "setup: could not install:$failed" >&2
            for p in $failed; do
                case " $BUILD_PKGS " in
                    *" $p "*) echo "setup: $p is needed to build; giving up" >&2; exit 1 ;;
                esac
            done
            echo "setup: the tests that need those packages will say so" >&2
        fi
    fi
    echo "setup: done"
fi
cd "$(dirname "$0")/.." && npm_ws
