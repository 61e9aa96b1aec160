#!/bin/sh
# make demo: grows with each issue.
set -e
cd "$(dirname "$0")/.."
echo "demo: not built yet"
