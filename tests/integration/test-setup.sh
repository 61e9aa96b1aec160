#!/bin/bash
# test-setup: the set-up script installs what is needed for what is asked. On a machine with
# none of the packages (a stand-in dpkg-query says so), `scripts/setup.sh` (make demo) would
# install exactly the build-and-run list and none of the test list, `--test` (make test) both;
# every package named exists in this machine's apt lists; and the Makefile wires demo to the
# first and test to the second.
. "$(dirname "$0")/../lib/lib.sh"
mkdir -p "$T/bin"
printf '#!/bin/sh\nexit 1\n' > "$T/bin/dpkg-query"   # nothing is installed
chmod +x "$T/bin/dpkg-query"
lists() { sed -n "/^$1=\"/,/\"/p" scripts/setup.sh | tr -d '"' | sed "s/^$1=//" | tr -s ' \n' '\n' | grep -v '^$' | sort; }
lists BUILD_PKGS > "$T/build.txt"
lists TEST_PKGS > "$T/test.txt"
[ "$(wc -l < "$T/build.txt")" -ge 10 ] && [ "$(wc -l < "$T/test.txt")" -ge 5 ] || die "cannot read the package lists of scripts/setup.sh"
PATH="$T/bin:$PATH" sh scripts/setup.sh --dry-run | sed -n 's/^setup: would install://p' | tr ' ' '\n' | grep -v '^$' | sort > "$T/demo.txt"
PATH="$T/bin:$PATH" sh scripts/setup.sh --test --dry-run | sed -n 's/^setup: would install://p' | tr ' ' '\n' | grep -v '^$' | sort > "$T/all.txt"
cmp -s "$T/demo.txt" "$T/build.txt" && echo "ok   make demo's set-up: exactly the $(wc -l < "$T/build.txt") build-and-run packages" ||
    fail "make demo's set-up would install: $(tr '\n' ' ' < "$T/demo.txt") (want: $(tr '\n' ' ' < "$T/build.txt"))"
sort -u "$T/build.txt" "$T/test.txt" > "$T/want-all.txt"
cmp -s "$T/all.txt" "$T/want-all.txt" && echo "ok   make test's set-up: both lists" ||
    fail "make test's set-up would install: $(tr '\n' ' ' < "$T/all.txt")"
[ -z "$(comm -12 "$T/demo.txt" "$T/test.txt")" ] || fail "test packages in make demo's set-up: $(comm -12 "$T/demo.txt" "$T/test.txt" | tr '\n' ' ')"
sh scripts/setup.sh --bogus > /dev/null 2>&1 && fail "setup.sh accepted an unknown option"
# every name is a package apt knows (a typo would fail only on a fresh machine)
# (one apt-cache call for all of them: a package it knows comes back as a "Package:" line)
apt-cache show --no-all-versions $(cat "$T/want-all.txt") 2>/dev/null | sed -n 's/^Package: //p' |
    sort -u > "$T/known.txt"
for p in $(comm -23 "$T/want-all.txt" "$T/known.txt"); do
    fail "scripts/setup.sh names '$p', which apt does not know"
done
echo "ok   every package named is known to apt"
grep -q '^demo: setup$' Makefile && grep -q '^test: setup-test$' Makefile && grep -q 'scripts/setup.sh --test' Makefile ||
    fail "Makefile: demo should depend on setup, test on setup-test (scripts/setup.sh --test)"
finish
