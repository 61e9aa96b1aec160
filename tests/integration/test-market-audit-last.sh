#!/bin/bash
# test-market-audit-last.sh — test-market-audit.sh with the node that is wrong on real traffic on
# the last rank (X_LAST=1): its tokens are judged by the set its sampler draws from, by the
# session's sampling, which the last edge's receipts commit to (docs/market.md, "Audits"); the
# test's greedy sessions leave it one token, so the first corrupted session that is audited
# catches it.
X_LAST=1 exec "$(dirname "$0")/test-market-audit.sh"
