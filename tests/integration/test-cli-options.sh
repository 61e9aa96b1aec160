#!/bin/bash
# test-cli-options: the option rules of both programs, walked from their own --help. Every
# kvctl command and kvd role answers --help (exit 0, on stdout); every long option its help
# names is recognised when written --opt=VALUE (whatever VALUE then means to it, the option
# itself is never "unknown"); both programs have --version.
. "$(dirname "$0")/../lib/lib.sh"
need_exec "$B/kvd" "$B/kvctl"
cmds=$("$KVCTL" help | sed -n 's/^  \([a-z]*\) .*/\1/p')
[ "$(echo "$cmds" | wc -w)" -ge 10 ] || die "kvctl help lists too few commands: $cmds"
n_opts=0
unknown_re='unknown option|unrecognized option|unexpected argument .--|invalid option|is not an option'
walk() {  # walk PROGRAM WORDS...: its --help, then each option it names as --opt=x
    local help
    help=$("$@" --help 2> "$T/help.err")
    local rc=$?
    if [ $rc -ne 0 ] || [ -z "$help" ]; then
        fail "$* --help: exit $rc, $(wc -c < "$T/help.err") bytes on stderr, $(echo -n "$help" | wc -c) on stdout"
        return
    fi
    local opts
    # the options of its usage and option lines (prose that names another command's
    # options, "as kvd stage --print-key does", is not this command's)
    opts=$(echo "$help" | grep -E '^\s*(usage:|\[|-|\(|kvctl |kvd )' | grep -o -- '--[a-z][a-z0-9-]*' | sort -u |
        grep -vx -- '--help\|--version\|--role')
    local o
    for o in $opts; do
        n_opts=$((n_opts + 1))
        # a value no option accepts as meaningful: only the option's recognition is checked
        timeout 10 "$@" "$o=/nonexistent/kvtest-x" < /dev/null > "$T/o.out" 2>&1
        if grep -Eiq -- "($unknown_re).*${o}|${o}.*($unknown_re)" "$T/o.out"; then
            fail "$* $o=VALUE: not recognised: $(head -2 "$T/o.out")"
        fi
    done
}
for c in $cmds; do
    case "$c" in
        ring) walk "$KVCTL" ring up; walk "$KVCTL" ring down ;;
        *) walk "$KVCTL" "$c" ;;
    esac
done
for r in stage relay seeder; do walk "$B/kvd" "$r"; done
echo "ok   $n_opts options of $(echo "$cmds" | wc -w) kvctl commands and 3 kvd roles take --opt=VALUE"
"$KVCTL" --version | grep -Eq '^kvctl [0-9]' || fail "kvctl --version"
"$B/kvd" --version | grep -Eq '^kvd [0-9]' || fail "kvd --version"
finish
