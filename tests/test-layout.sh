#!/bin/bash
# The layout's rules (scripts/check-layout.py): no include cycle, no two source files that use
# each other (directly or through a cycle), modules that depend only downwards.
. "$(dirname "$0")/lib.sh"
python3 scripts/check-layout.py "$B"
