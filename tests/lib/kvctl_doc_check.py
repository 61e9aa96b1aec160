# kvctl_doc_check.py KVCTL docs/kvctl.md: every command kvctl --help lists has a section in
# docs/kvctl.md, and every option that a command's --help names is documented in that
# command's section (used by tests/integration/test-kvctl-cli.sh).
import re, subprocess, sys
kvctl, doc = sys.argv[1], open(sys.argv[2]).read()
secs = {}
for part in re.split(r'^## ', doc, flags=re.M)[1:]:
    head, _, body = part.partition('\n')
    secs[head.strip()] = body
# The commands: those `kvctl --help` lists (kvctl/main.c's commands[] table, so a new command
# is checked without being named here), and the forms whose --help is their own.
top = subprocess.run([kvctl, '--help'], capture_output=True, text=True).stdout
listed = re.findall(r'^  ([a-z]+) ', top.partition('\ncommands:\n')[2], flags=re.M)
if len(listed) < 10:
    print(f"kvctl --help lists {len(listed)} commands: {listed}"); sys.exit(1)
cmds = {c: [c] for c in listed}
cmds.update({'ring up': ['ring', 'up'], 'ring down': ['ring', 'down'],
             'generate --ring': ['generate', '--ring', 'x']})
bad = 0
for c, argv in cmds.items():
    h = subprocess.run([kvctl] + argv + ['--help'], capture_output=True, text=True)
    flags_skip = {'--help'}
    if h.returncode != 0:
        print(f"kvctl {c} --help: exit {h.returncode}"); bad += 1; continue
    flags = set(re.findall(r'(?<![\w-])(--[a-z][a-z0-9-]*|-[a-zA-Z])\b', h.stdout))
    first = c.split()[0]
    body = ''.join(b for hd, b in secs.items() if hd.split()[0] == first)
    if not body:
        print(f"docs/kvctl.md: no section for {c}"); bad += 1; continue
    for f in sorted(flags - flags_skip):
        if not re.search(r'(?<![\w-])' + re.escape(f) + r'(?![\w-])', body):
            print(f"docs/kvctl.md: kvctl {c}: {f} (in --help) is not documented"); bad += 1
sys.exit(1 if bad else 0)
