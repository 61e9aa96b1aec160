#!/bin/sh
# Installs the Debian packages Kvasir needs (docs/design.md, "Dependencies") that are missing,
# and does nothing when all are present. Uses sudo when not root.
#   scripts/setup.sh            what building and running need (make, make demo)
#   scripts/setup.sh --test     that plus what tests, benchmarks and fuzzers use (make test, bench)
#   --dry-run                   print the packages that would be installed, install nothing
set -eu

TEST=0
DRY=0
for a in "$@"; do
    case "$a" in
        --test) TEST=1 ;;
        --dry-run) DRY=1 ;;
        *) echo "usage: scripts/setup.sh [--test] [--dry-run]" >&2; exit 2 ;;
    esac
done

# What the build links against and what running it (kvd, kvctl, the demo: curl) uses.
BUILD_PKGS="build-essential pkg-config libuv1-dev libssl-dev libopenblas-dev libzstd-dev
libwslay-dev libhttp-parser-dev libcurl4-openssl-dev libcjson-dev libsqlite3-dev libpq-dev libpcre2-dev
libsystemd-dev curl ocl-icd-opencl-dev opencl-headers libclblast-dev xxd"
BUILD_PKGS=$(echo $BUILD_PKGS)
# What only the tests, benchmarks and fuzzers use.
TEST_PKGS="pocl-opencl-icd clinfo
clang-14 libclang-rt-14-dev valgrind iproute2 nftables python3 python3-websockets nginx
openssl procps nodejs node-ws chromium testssl.sh systemd python3-jinja2 postgresql"
TEST_PKGS=$(echo $TEST_PKGS)
PKGS="$BUILD_PKGS"
[ "$TEST" = 1 ] && PKGS="$BUILD_PKGS $TEST_PKGS"

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

# The official `openai` client (the version tests/package.json pins) for the API tests, from
# the npm registry. Never fatal: the API tests say what is missing. npm prunes what the
# package.json does not list, so this runs before npm_ws links Debian's ws.
npm_openai() {
    want=$(sed -n 's/.*"openai": *"\([^"]*\)".*/\1/p' tests/package.json)
    have=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' tests/node_modules/openai/package.json 2>/dev/null | head -1)
    [ -n "$want" ] && [ "$have" = "$want" ] && return 0
    command -v npm >/dev/null 2>&1 || { echo "setup: no npm: the API tests will fail (openai client missing)" >&2; return 0; }
    echo "setup: npm install openai@$want into tests/node_modules"
    (cd tests && npm install --no-package-lock --no-audit --no-fund >/dev/null) ||
        echo "setup: npm install openai failed: the API tests will fail" >&2
}

if [ "$DRY" = 1 ]; then
    echo "setup: would install:$missing"
    exit 0
fi
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
[ "$TEST" = 1 ] || exit 0
cd "$(dirname "$0")/.." && npm_openai && npm_ws
