#!/bin/sh
# make bench: grows with each issue.
set -e
cd "$(dirname "$0")/.."
echo "bench: not built yet"
