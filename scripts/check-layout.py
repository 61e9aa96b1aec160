#!/usr/bin/env python3
"""The layout's rules, checked from the source and the built objects:

1. No include cycle: the graph of `#include "..."` between the project's own files has no
   cycle (a header never reaches itself).
2. No file cycle: a source file A depends on B when A's object uses a global symbol that
   B's object defines (read with nm), or when a header A includes (directly or through other
   headers) has a static inline function that calls such a symbol: the call is A's even when
   A never calls that inline function, as nm would not show it. No two files depend on each
   other, directly or through a cycle; within a module, files form a dependency order.
3. Modules depend only downwards: each module may use the modules listed for it in LAYERS
   and nothing else, by #include and by symbol, the calls of a header's static inline
   functions included (a header that calls up is reported, and so is every file including it).

Usage: check-layout.py BUILD_DIR  (the objects under BUILD_DIR/obj). Prints every violation
and exits 1 when there is one.
"""
import os
import re
import subprocess
import sys

# module folder -> the modules it may use (besides itself). The order of the dict is the
# layering, lowest first.
LAYERS = {
    "util": [],
    "wtype": ["util"],
    "kernels": ["util", "wtype"],
    "gguf": ["util", "wtype"],
    "net": ["util"],
    "model": ["util", "wtype", "kernels", "gguf"],
    "planner": ["util", "model"],
    "ring": ["util", "wtype", "kernels", "net"],
    "seed": ["util", "gguf", "net", "ring"],
    "api": ["util", "wtype", "kernels", "gguf", "model", "net"],
    "kvd": ["util", "wtype", "kernels", "gguf", "model", "net", "planner", "ring", "seed", "api"],
    "kvctl": ["util", "wtype", "kernels", "gguf", "model", "net", "planner", "ring", "seed", "api"],
}
SRC_DIRS = list(LAYERS)


def module_of(path):
    top = path.split("/", 1)[0]
    return top if top in LAYERS else None


def project_files(root):
    out = []
    for d in SRC_DIRS:
        for dirpath, _, names in os.walk(os.path.join(root, d)):
            for n in names:
                if n.endswith((".c", ".h", ".inc")):
                    out.append(os.path.relpath(os.path.join(dirpath, n), root))
    return sorted(out)


INC = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def include_graph(root, files):
    g = {}
    for f in files:
        text = open(os.path.join(root, f), encoding="utf-8", errors="replace").read()
        deps = set()
        for inc in INC.findall(text):
            cand = [inc, os.path.normpath(os.path.join(os.path.dirname(f), inc))]
            for c in cand:
                if c == f:  # a source compiled in passes (kernels/cpu/simd_neon.c) is no cycle
                    break
                if os.path.exists(os.path.join(root, c)):
                    deps.add(c)
                    break
        g[f] = deps
    return g


# Sources the Makefile compiles for one architecture only (see its arm64 section).
ARCH_ONLY = {"kernels/cpu/simd_neon.c": "aarch64"}


STATIC_INLINE = re.compile(r'^[ \t]*static\s+inline\b[^;{]*?\b([A-Za-z_]\w*)\s*\([^;{]*\)\s*\{', re.M)
CALL = re.compile(r'\b([A-Za-z_]\w*)\s*\(')
COMMENT = re.compile(r'/\*.*?\*/|//[^\n]*', re.S)


def inline_calls(root, files):
    """header -> the names its static inline functions call, less their calls to each other."""
    out = {}
    for f in files:
        if not f.endswith(".h"):
            continue
        text = COMMENT.sub(" ", open(os.path.join(root, f), encoding="utf-8", errors="replace").read())
        bodies = {}
        for m in STATIC_INLINE.finditer(text):
            depth, i = 1, m.end()
            while i < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            bodies[m.group(1)] = set(CALL.findall(text[m.end():i]))
        calls = set()
        for b in bodies.values():
            calls |= b
        out[f] = calls - set(bodies)
    return out


def included(ig, f):
    """Every file f includes, directly or through others."""
    seen, todo = set(), [f]
    while todo:
        for d in ig.get(todo.pop(), ()):
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def symbol_graph(build, files, ig, hcalls):
    defs, uses = {}, {}
    for f in files:
        if not f.endswith(".c"):
            continue
        obj = os.path.join(build, "obj", f[:-2] + ".o")
        if not os.path.exists(obj) and f in ARCH_ONLY:
            continue  # the Makefile builds it only for that architecture
        if not os.path.exists(obj):
            raise SystemExit(f"check-layout: {obj} is missing (build first: make)")
        out = subprocess.run(["nm", "-g", obj], capture_output=True, text=True, check=True).stdout
        d, u = set(), set()
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "U":
                u.add(parts[1])
            elif len(parts) == 3 and parts[1] in "TDBRVWCG":
                d.add(parts[2])
        defs[f], uses[f] = d, u
    owner = {}
    for f, d in defs.items():
        for s in d:
            owner.setdefault(s, f)
    g = {f: set() for f in defs}
    why = {}
    for f, u in uses.items():
        for s in u:
            o = owner.get(s)
            if o and o != f:
                g[f].add(o)
                why.setdefault((f, o), s)
    # A header with inline calls is a node of its own: it uses the files whose symbols it
    # calls, and every file that includes it uses it, so a header that calls up into a file
    # including it is a cycle, and every file including it depends on what it calls.
    for h, calls in sorted(hcalls.items()):
        for s in sorted(calls):
            o = owner.get(s)
            if o:
                g.setdefault(h, set()).add(o)
                why.setdefault((h, o), s)
    for f in list(g):
        for h in sorted(included(ig, f)):
            if h in g and h != f:
                g[f].add(h)
                why.setdefault((f, h), "#include")
            for s in sorted(hcalls.get(h, ())):
                o = owner.get(s)
                if o and o != f:
                    g[f].add(o)
                    why.setdefault((f, o), f"{s} (called by an inline function of {h})")
    return g, why


def sccs(g):
    """Tarjan's strongly connected components (iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for v0 in g:
        if v0 in index:
            continue
        work = [(v0, iter(sorted(g[v0])))]
        index[v0] = low[v0] = counter[0]; counter[0] += 1
        stack.append(v0); on.add(v0)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in g:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]; counter[0] += 1
                    stack.append(nxt); on.add(nxt)
                    work.append((nxt, iter(sorted(g[nxt]))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build"))
    files = project_files(root)
    bad = []
    ig = include_graph(root, files)
    for comp in sccs(ig):
        bad.append("include cycle: " + " -> ".join(comp))
    sg, why = symbol_graph(build, files, ig, inline_calls(root, files))
    for comp in sccs(sg):
        pairs = [f"{a} includes {b}" if why[(a, b)] == "#include" else f"{a} uses {why[(a, b)]} from {b}"
                 for a in comp for b in sorted(sg[a]) if b in comp]
        bad.append("file cycle among " + ", ".join(comp) + ":\n    " + "\n    ".join(pairs))
    for g, kind in ((ig, "includes"), (sg, "uses")):
        for f, deps in sorted(g.items()):
            mf = module_of(f)
            for d in sorted(deps):
                if kind == "uses" and why[(f, d)] == "#include":
                    continue  # the include graph's own check reports it
                md = module_of(d)
                if md and md != mf and md not in LAYERS[mf]:
                    extra = f" ({why[(f, d)]})" if kind == "uses" else ""
                    bad.append(f"layering: {f} {kind} {d}{extra}: module {mf} may use only "
                               f"{', '.join(LAYERS[mf]) or 'nothing else'}")
    for b in bad:
        print(b)
    n_c = sum(1 for f in files if f.endswith(".c"))
    print(f"check-layout: {len(files)} files ({n_c} sources), {len(bad)} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
