#!/usr/bin/env python3
"""The module import graph of one Rust crate: which of its files use which, the import circles
(strongly connected components of more than one file), and, given the crate's layers top down,
the imports that run back up.

    python3 scripts/house/imports.py crates/xds-server
    python3 scripts/house/imports.py crates/pilot-discovery --no-tests
    python3 scripts/house/imports.py crates/xds-server --layers "grpc | stream sotw delta | connection"
    python3 scripts/house/imports.py crates/xds-server --json

What counts as an import of file B by file A: every path in A's code (a `use` declaration or a
path written inline) that starts at `crate::`, `super::`, `self::`, a module in scope (a child of
the current module), or, from a binary of the package, the package's library (`my_crate::`), and
names B's module or an item in it. A path through the crate root that names something the root
re-exports (`pub use server::DiscoveryServer`) is followed to the file that defines it, because the
root is the crate's facade, not a layer of its own; items defined in the root are edges to the
root. Paths inside comments and strings do not count (intra-doc links included). Code under
`#[cfg(test)]` counts, and is marked "test" (`--no-tests` leaves it out).

The module tree is read from the crate roots (`src/lib.rs`, `src/main.rs`, `src/bin/*.rs`) and
their `mod` declarations (`#[path]` too), so `foo.rs` + `foo/` and `foo/mod.rs` styles both work;
files under `src/` that no root declares are listed as unreached.

Layers come from `--layers` (layers separated by `|` or `;`, top first; inside a layer, module
names separated by spaces or commas), or else from the crate root's doc comment: a line ending
with ":" in a paragraph that mentions "layers", then a list (`1.`, `-` or `*` items, continued on
indented lines), each item one layer whose members are the backticked module names before the
item's first ": " (`stream`, `stream::sotw`, `stream/sotw.rs`; other backticked words are
ignored). A module covers its file and every file under it unless one of those is named in a
layer itself. The crate root stays above every layer unless a layer names it (`lib`, `main`, or
`crate`). An import from a file to a file of a higher layer is a back-up arrow; one within a
layer is sideways (allowed, but counted; any circle is still a circle).

What it cannot see: a method that one file defines in an `impl` block on another file's type is
reached by method calls, which name no module; such a dependency is not counted.

Standard library only. Exit status 0 always (it measures, it does not judge) unless the crate
cannot be read; `--check` makes it exit 1 when there are circles or back-up arrows.
"""
import argparse
import json
import pathlib
import re
import sys
from collections import defaultdict

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
KEYWORD_ROOTS = ("crate", "super", "self")


# ---------------------------------------------------------------------------------------------
# Lexing: blank out comments, strings and char literals (keeping offsets and newlines)
# ---------------------------------------------------------------------------------------------

def strip(src):
    """`src` with comments, string, byte-string, raw-string and char literals replaced by spaces
    (newlines kept), so that offsets and line numbers stay those of the source."""
    out = list(src)
    n = len(src)
    i = 0

    def blank(a, b):
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif m := re.compile(r'b?r(#*)"').match(src, i):
            if i > 0 and (src[i - 1].isalnum() or src[i - 1] == "_"):
                i += 1
                continue
            end = '"' + m.group(1)
            j = src.find(end, m.end())
            j = n if j < 0 else j + len(end)
            blank(i, j)
            i = j
        elif c == '"' or (c == "b" and src.startswith('b"', i) and not (i > 0 and (src[i - 1].isalnum() or src[i - 1] == "_"))):
            j = i + (2 if c == "b" else 1)
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            blank(i, j + 1)
            i = j + 1
        elif c == "'":
            # a char literal ('a', '\n', '\u{1F600}') or a lifetime ('a): only the former is blanked
            m = re.compile(r"'(\\(u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'").match(src, i)
            if m:
                blank(i, m.end())
                i = m.end()
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def matching_brace(text, open_at):
    """Offset just past the `}` matching the `{` at `open_at`."""
    depth = 0
    for k in range(open_at, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return k + 1
    return len(text)


ATTR = re.compile(r"#\s*\[")


def attributes_before(text, at):
    """The outer attributes (`#[...]`) right before offset `at`: (start, end) of each one's inside."""
    attrs = []
    k = at
    while True:
        j = k
        while j > 0 and text[j - 1].isspace():
            j -= 1
        if j == 0 or text[j - 1] != "]":
            return attrs
        # find the `#[` that opens this attribute (brackets may nest)
        depth, p = 0, j - 1
        while p >= 0:
            if text[p] == "]":
                depth += 1
            elif text[p] == "[":
                depth -= 1
                if depth == 0:
                    break
            p -= 1
        q = p - 1
        while q >= 0 and text[q].isspace():
            q -= 1
        if q < 0 or text[q] != "#":
            return attrs
        attrs.append((p + 1, j - 1))
        k = q


def is_test_cfg(attr):
    a = re.sub(r"\s+", "", attr)
    return a.startswith("cfg(") and re.search(r"\btest\b", a) is not None and "not(test" not in a


# ---------------------------------------------------------------------------------------------
# The module tree
# ---------------------------------------------------------------------------------------------

class Module:
    def __init__(self, path, file, parent, span=None, test=False, child_dir=None):
        self.path = path            # ("crate", "a", "b")
        self.file = file            # the file it lives in
        self.parent = parent
        self.span = span            # (start, end) in its file's text for an inline module
        self.test = test
        self.children = {}
        self.child_dir = child_dir  # where `mod x;` of this module looks for x
        self.uses = {}              # name -> (absolute path tuple) for `use` declarations
        self.globs = []             # absolute paths of `use x::*`
        self.items = set()          # names defined here


class File:
    def __init__(self, path, text, crate, test):
        self.path = path
        self.text = text
        self.lines = text.count("\n") + (0 if text.endswith("\n") else 1)
        self.code = strip(text)
        self.crate = crate
        self.test = test            # the whole file is test code (`#[cfg(test)] mod x;`)
        self.module = None          # its file module
        self.inline = []            # inline modules, outermost first
        self.test_spans = []        # (start, end) of `#[cfg(test)]` items


MOD_DECL = re.compile(r"(?<![A-Za-z0-9_])(?:pub(?:\s*\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*([;{])")
ITEM_DEF = re.compile(
    r"(?<![A-Za-z0-9_])(?:fn|struct|enum|trait|type|const|static|union|macro_rules!)\s+(" + IDENT + r")")


class Crate:
    def __init__(self, name, root_file, src_dir):
        self.name = name
        self.root = None
        self.root_file = root_file
        self.src_dir = src_dir


def load(crate_dir):
    crate_dir = pathlib.Path(crate_dir).resolve()
    src = crate_dir / "src"
    if not src.is_dir():
        sys.exit(f"{crate_dir}: no src/ directory")
    package = crate_dir.name
    manifest = crate_dir / "Cargo.toml"
    if manifest.exists():
        m = re.search(r'^\s*\[package\][^\[]*?^\s*name\s*=\s*"([^"]+)"', manifest.read_text(), re.M | re.S)
        if m:
            package = m.group(1)
    lib_name = package.replace("-", "_")
    roots = []
    if (src / "lib.rs").exists():
        roots.append(("lib", src / "lib.rs"))
    if (src / "main.rs").exists():
        roots.append(("main", src / "main.rs"))
    bindir = src / "bin"
    if bindir.is_dir():
        for p in sorted(bindir.glob("*.rs")):
            roots.append((f"bin/{p.stem}", p))
        for p in sorted(bindir.glob("*/main.rs")):
            roots.append((f"bin/{p.parent.name}", p))
    if not roots:
        sys.exit(f"{crate_dir}: no crate root (src/lib.rs, src/main.rs, src/bin/)")
    files = {}
    crates = []
    for name, root in roots:
        crate = Crate(name, root, src)
        crates.append(crate)
        crate.root = read_file_module(root, ("crate",), None, crate, files, False, root.parent)
    reached = set(files)
    unreached = sorted(p for p in src.rglob("*.rs") if p not in reached)
    return crate_dir, lib_name, crates, files, unreached


def read_file_module(path, modpath, parent, crate, files, test, child_dir):
    text = path.read_text()
    f = File(path, text, crate, test)
    files[path] = f
    mod = Module(modpath, f, parent, test=test, child_dir=child_dir)
    f.module = mod
    scan_module_body(f, mod, 0, len(f.code), files)
    return mod


def scan_module_body(f, mod, start, end, files):
    """Finds the `mod` declarations, `#[cfg(test)]` items, item definitions and `use`s directly in
    `mod` (between `start` and `end` of `f`), descending into inline modules."""
    code = f.code
    pos = start
    while pos < end:
        m = MOD_DECL.search(code, pos, end)
        if not m:
            break
        # only declarations at this module's own level: skip those nested in an inner `{}` (an
        # inline module is handled by recursion; a `mod` inside a fn body is rare)
        if nesting(code, start, m.start()) != 0:
            pos = m.end()
            continue
        name, kind = m.group(1), m.group(2)
        attrs = attributes_before(code, m.start())
        test = mod.test or any(is_test_cfg(code[a:b]) for a, b in attrs)
        path_attr = None
        for a, b in attrs:
            # the attribute's string is blanked in `code`: read it from the source
            pm = re.match(r'\s*path\s*=\s*"([^"]+)"', f.text[a:b])
            if pm:
                path_attr = pm.group(1)
        if kind == "{":
            open_at = m.end() - 1
            close = matching_brace(code, open_at)
            child = Module(mod.path + (name,), f, mod, span=(open_at, close), test=test,
                           child_dir=(mod.child_dir / name) if mod.child_dir else None)
            mod.children[name] = child
            f.inline.append(child)
            if test:
                f.test_spans.append((m.start(), close))
            scan_module_body(f, child, open_at + 1, close - 1, files)
            pos = close
        else:
            target = None
            if path_attr:
                base = f.path.parent if mod.span is None else mod.child_dir
                target = (base / path_attr) if base else None
            else:
                d = mod.child_dir
                for cand in (d / f"{name}.rs", d / name / "mod.rs"):
                    if cand.exists():
                        target = cand
                        break
            if target is None or not target.exists():
                print(f"warning: {f.path}: mod {name}: file not found", file=sys.stderr)
                pos = m.end()
                continue
            target = target.resolve()
            child_dir = target.parent if target.name == "mod.rs" else target.parent / target.stem
            child = read_file_module(target, mod.path + (name,), mod, f.crate, files, test, child_dir)
            mod.children[name] = child
            pos = m.end()
    # `#[cfg(test)]` items other than modules
    for am in ATTR.finditer(code, start, end):
        if nesting(code, start, am.start()) != 0:
            continue
        close = find_close_bracket(code, am.end() - 1)
        attr = code[am.end():close - 1]
        if not is_test_cfg(attr):
            continue
        # the item after the attribute(s): to its matching `}` or to its `;`, whichever first
        k = close
        while True:
            k2 = skip_ws(code, k)
            if code.startswith("#", k2):
                nxt = code.find("[", k2)
                k = find_close_bracket(code, nxt)
            else:
                k = k2
                break
        semi = code.find(";", k)
        brace = code.find("{", k)
        if brace >= 0 and (semi < 0 or brace < semi):
            item_end = matching_brace(code, brace)
        else:
            item_end = semi + 1 if semi >= 0 else end
        f.test_spans.append((am.start(), item_end))
    # item definitions and `use`s at this level (inner modules' ones belong to them)
    for im in ITEM_DEF.finditer(code, start, end):
        if inner_module_at(mod, im.start()) is None:
            mod.items.add(im.group(1))
    for use_start, use_end, paths, in_test in use_decls(f, start, end):
        if inner_module_at(mod, use_start) is not None:
            continue
        for segs, alias in paths:
            if segs and segs[-1] == "*":
                mod.globs.append(segs[:-1])
            elif alias != "_":
                name = alias or segs[-1]
                if name == "self" and len(segs) >= 2:
                    name = segs[-2]
                mod.uses[name] = segs


def inner_module_at(mod, offset):
    for child in mod.children.values():
        if child.span and child.file is mod.file and child.span[0] <= offset < child.span[1]:
            return child
    return None


def nesting(code, start, at):
    """Brace depth at `at`, counted from `start`."""
    return code.count("{", start, at) - code.count("}", start, at)


def skip_ws(code, k):
    while k < len(code) and code[k].isspace():
        k += 1
    return k


def find_close_bracket(code, open_at):
    depth = 0
    for k in range(open_at, len(code)):
        if code[k] == "[":
            depth += 1
        elif code[k] == "]":
            depth -= 1
            if depth == 0:
                return k + 1
    return len(code)


USE = re.compile(r"(?<![A-Za-z0-9_])(?:pub(?:\s*\([^)]*\))?\s+)?use\s+")


def use_decls(f, start=0, end=None):
    """Every `use` declaration in `f.code[start:end]`: (start, end, [(segments, alias)], test)."""
    code = f.code
    end = len(code) if end is None else end
    for m in USE.finditer(code, start, end):
        semi = code.find(";", m.end())
        if semi < 0:
            continue
        yield m.start(), semi + 1, expand_use_tree(code[m.end():semi]), in_spans(f.test_spans, m.start())


def expand_use_tree(tree):
    """`a::{b, c::{self, D as E}, *}` ->
    [(["a","b"], None), (["a","c","self"], None), (["a","c","D"], "E"), (["a","*"], None)]"""
    tree = re.sub(r"\s+as\s+", "@", tree)
    tree = re.sub(r"\s+", "", tree).lstrip(":")
    out = []

    def walk(prefix, s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        parts.append(cur)
        for part in parts:
            if not part:
                continue
            brace = part.find("{")
            if brace >= 0:
                head = [x for x in part[:brace].split("::") if x]
                walk(prefix + head, part[brace + 1:part.rfind("}")])
                continue
            segs = [x for x in part.split("::") if x]
            alias = None
            if segs and "@" in segs[-1]:
                last, alias = segs[-1].split("@", 1)
                segs[-1] = last
            out.append((prefix + segs, alias))

    walk([], tree)
    return out


def in_spans(spans, at):
    return any(a <= at < b for a, b in spans)


# ---------------------------------------------------------------------------------------------
# Resolution
# ---------------------------------------------------------------------------------------------

def module_at(f, offset):
    """The innermost module of `f` at `offset`."""
    best = f.module
    for m in f.inline:
        if m.span[0] <= offset < m.span[1]:
            if best.span is None or (m.span[0] >= best.span[0]):
                best = m
    return best


def absolute(mod, segs, lib_roots, lib_name):
    """`segs` as written in `mod`, made absolute: (root Module, remaining segments), or None when
    it does not start inside the package."""
    if not segs:
        return None
    first = segs[0]
    if first == "crate":
        return crate_root(mod), segs[1:]
    if first in ("super", "self"):
        cur, k = mod, 0
        while k < len(segs) and segs[k] in ("super", "self"):
            if segs[k] == "super":
                if cur.parent is None:
                    return None
                cur = cur.parent
            k += 1
        return cur, segs[k:]
    if first in mod.children:
        return mod.children[first], segs[1:]
    if first == lib_name and "lib" in lib_roots and crate_root(mod) is not lib_roots["lib"]:
        return lib_roots["lib"], segs[1:]
    return None


def crate_root(mod):
    while mod.parent is not None:
        mod = mod.parent
    return mod


def resolve(start, rest, lib_roots, lib_name, follow_all, depth=0):
    """The file that `start::rest` names: the deepest module the path reaches, followed through
    the crate root's `use`s (and any module's with `follow_all`). None when it leaves the crate."""
    cur = start
    k = 0
    while k < len(rest) and rest[k] in cur.children:
        cur = cur.children[rest[k]]
        k += 1
    if depth < 8 and k < len(rest) and (cur.parent is None or follow_all):
        name = rest[k]
        if name not in cur.items:
            if name in cur.uses:
                a = absolute(cur, cur.uses[name], lib_roots, lib_name)
                if a is None:
                    return None  # a re-export of another crate's item
                return resolve(a[0], a[1] + rest[k + 1:], lib_roots, lib_name, follow_all, depth + 1)
            for g in cur.globs:
                a = absolute(cur, g, lib_roots, lib_name)
                if a is None:
                    continue
                target = resolve(a[0], a[1] + rest[k:], lib_roots, lib_name, follow_all, depth + 1)
                if target is not None and (name in defined_names(target)):
                    return target
    return cur


def defined_names(mod):
    return mod.items | set(mod.children) | set(mod.uses)


INLINE_PATH = re.compile(r"(?<![A-Za-z0-9_:])((?:" + IDENT + r")(?:\s*::\s*(?:" + IDENT + r"|\*))+)")


def references(f, lib_roots, lib_name, follow_all):
    """(line, target Module, text, test, kind) of every in-package path in `f`."""
    code = f.code
    refs = []
    masked = list(code)
    for s, e, paths, test in use_decls(f):
        mod = module_at(f, s)
        line = code.count("\n", 0, s) + 1
        for segs, _alias in paths:
            segs = [x for x in segs if x != "*"]
            if segs and segs[-1] == "self":
                segs = segs[:-1]
            a = absolute(mod, segs, lib_roots, lib_name)
            if a is None:
                continue
            target = resolve(a[0], a[1], lib_roots, lib_name, follow_all)
            if target is not None:
                refs.append((line, target, "::".join(segs), test, "use"))
        for k in range(s, e):
            if masked[k] != "\n":
                masked[k] = " "
    # declarations (`mod x;`) are structure, not imports
    masked = "".join(masked)
    masked = MOD_DECL.sub(lambda m: " " * len(m.group(0)), masked)
    for m in INLINE_PATH.finditer(masked):
        segs = [x.strip() for x in m.group(1).split("::")]
        segs = [x for x in segs if x and x != "*"]
        if len(segs) < 2:
            continue
        mod = module_at(f, m.start())
        a = absolute(mod, segs, lib_roots, lib_name)
        if a is None:
            continue
        target = resolve(a[0], a[1], lib_roots, lib_name, follow_all)
        if target is None:
            continue
        line = code.count("\n", 0, m.start()) + 1
        refs.append((line, target, "::".join(segs), in_spans(f.test_spans, m.start()), "path"))
    return refs


# ---------------------------------------------------------------------------------------------
# Graph
# ---------------------------------------------------------------------------------------------

def tarjan(nodes, edges):
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def suggest(nodes, adj, sccs):
    """Layers top first: each file is placed by the longest import chain below it, so every
    import runs down (the files of one circle share a layer)."""
    comp = {}
    for i, c in enumerate(sccs):
        for p in c:
            comp[p] = i
    key = {p: ("c", comp[p]) if p in comp else ("f", p) for p in nodes}
    members = defaultdict(list)
    for p in nodes:
        members[key[p]].append(p)
    down = defaultdict(set)
    for a in nodes:
        for b in adj.get(a, ()):
            if b in key and key[a] != key[b]:
                down[key[a]].add(key[b])
    height = {}

    def h(k):
        if k not in height:
            height[k] = 0
            height[k] = 1 + max((h(x) for x in down[k]), default=-1)
        return height[k]

    for k in members:
        h(k)
    top = max(height.values(), default=0)
    return [[p for k in members if height[k] == lvl for p in members[k]] for lvl in range(top, -1, -1)]


def parse_layers(spec):
    layers = []
    for part in re.split(r"[|;]", spec):
        names = [x for x in re.split(r"[\s,]+", part.strip()) if x]
        if names:
            layers.append(names)
    return layers


def layers_from_doc(root_file):
    """The layer list in the crate root's doc comment (see the module doc)."""
    docs = []
    for line in root_file.text.splitlines():
        s = line.strip()
        if s.startswith("//!"):
            docs.append(s[3:])
        elif not s or s.startswith("#!"):
            continue
        else:
            break
    items, started, paragraph = [], False, ""
    for d in docs:
        t = d.strip()
        if not started:
            paragraph = f"{paragraph} {t}" if t else ""
            started = bool(re.search(r"\blayers?\b", paragraph, re.I) and t.endswith(":"))
            continue
        item = re.match(r"^(\d+\.|[-*])\s+(.*)$", t)
        if item:
            items.append(item.group(2))
        elif t and items and d.startswith("  "):
            items[-1] += " " + t  # a continuation line of the item
        elif not t and not items:
            continue
        else:
            break
    return [re.findall(r"`([^`]+)`", members(text)) for text in items]


def members(item):
    """The part of a list item before its first `: ` outside backticks: where the members are."""
    quoted = False
    for k, ch in enumerate(item):
        if ch == "`":
            quoted = not quoted
        elif ch == ":" and not quoted and (k + 1 == len(item) or item[k + 1] == " "):
            return item[:k]
    return item


def norm_module(name):
    """`stream/sotw.rs`, `stream::sotw`, `stream/`, `crate::stream` -> ("stream", "sotw")"""
    n = name.strip().strip("`")
    n = re.sub(r"\.rs$", "", n).strip("/")
    n = n.replace("/", "::")
    parts = [p for p in n.split("::") if p]
    if parts and parts[0] == "crate":
        parts = parts[1:]
    if parts and parts[-1] == "mod":
        parts = parts[:-1]
    if parts and parts[0] == "src":
        parts = parts[1:]
    return tuple(parts)


def assign_layers(layers, files, roots):
    """file path -> layer index (0 = top); the crate roots are -1 unless a layer names them."""
    known = {f.module.path[1:]: p for p, f in files.items()}
    named = {}
    for i, names in enumerate(layers):
        for n in names:
            key = norm_module(n)
            if key in (("lib",), ("main",), ()):
                named[()] = i
            elif key in known or any(k[:len(key)] == key for k in known):
                named[key] = i
    out = {}
    for p, f in files.items():
        mp = f.module.path[1:]
        best = None
        for k in range(len(mp), -1, -1):
            if mp[:k] in named and (k > 0 or mp == ()):
                best = named[mp[:k]]
                break
        if best is None and mp == ():
            best = -1
        out[p] = best
    return out, [n for names in layers for n in names if norm_module(n) not in named and norm_module(n) not in (("lib",), ("main",), ())]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("crate", help="the crate's directory (holds Cargo.toml and src/)")
    ap.add_argument("--layers", help='top first: "grpc | stream sotw delta | connection"; default: the root doc')
    ap.add_argument("--no-tests", action="store_true", help="leave out #[cfg(test)] code")
    ap.add_argument("--follow-all-reexports", action="store_true",
                    help="follow every module's `use`s to the defining file, not only the root's")
    ap.add_argument("--sites", action="store_true", help="list every import site under its edge")
    ap.add_argument("--suggest", action="store_true",
                    help="also print the tightest layering the graph allows (files by the longest import chain below them)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the report")
    ap.add_argument("--check", action="store_true", help="exit 1 on circles or back-up arrows")
    args = ap.parse_args()

    crate_dir, lib_name, crates, files, unreached = load(args.crate)
    lib_roots = {c.name: c.root for c in crates}
    src = crate_dir / "src"

    def rel(p):
        return str(p.relative_to(src))

    edges = defaultdict(list)  # (from, to) -> [(line, text, test, kind)]
    for p, f in files.items():
        for line, target, text, test, kind in references(f, lib_roots, lib_name, args.follow_all_reexports):
            if args.no_tests and (test or f.test):
                continue
            to = target.file.path
            if to == p:
                continue
            edges[(p, to)].append((line, text, test or f.test, kind))

    nodes = [p for p, f in files.items() if not (args.no_tests and f.test)]
    adj = defaultdict(set)
    for (a, b) in edges:
        adj[a].add(b)
    sccs = [c for c in tarjan(nodes, adj) if len(c) > 1]

    if args.layers:
        layers = parse_layers(args.layers)
        source = "--layers"
    else:
        root = next((c for c in crates if c.name == "lib"), crates[0])
        layers = layers_from_doc(files[root.root.file.path])
        source = f"{rel(root.root.file.path)} doc" if layers else None
    layer_of, unknown = assign_layers(layers, files, crates) if layers else ({}, [])
    back, sideways = [], []
    if layers:
        for (a, b), sites in sorted(edges.items()):
            la, lb = layer_of.get(a), layer_of.get(b)
            if la is None or lb is None:
                continue
            if lb < la:
                back.append((a, b, sites))
            elif lb == la:
                sideways.append((a, b, sites))
    sites_total = sum(len(s) for s in edges.values())
    test_only = sum(1 for s in edges.values() if all(x[2] for x in s))
    largest = max(files.values(), key=lambda f: f.lines)
    summary = {
        "crate": str(crate_dir),
        "files": len(nodes),
        "lines": sum(files[p].lines for p in nodes),
        "largest_file": [rel(largest.path), largest.lines],
        "edges": len(edges),
        "edges_test_only": test_only,
        "import_sites": sites_total,
        "circles": len(sccs),
        "files_in_circles": sum(len(c) for c in sccs),
        "largest_circle": max((len(c) for c in sccs), default=0),
        "layers": len(layers),
        "back_up_edges": len(back) if layers else None,
        "back_up_sites": sum(len(s) for _, _, s in back) if layers else None,
        "sideways_edges": len(sideways) if layers else None,
    }
    if args.json:
        summary.update({
            "file_lines": {rel(p): files[p].lines for p in sorted(nodes)},
            "edge_list": [[rel(a), rel(b), len(s)] for (a, b), s in sorted(edges.items())],
            "circle_list": [[rel(p) for p in c] for c in sccs],
            "layer_list": layers,
            "back_up": [[rel(a), rel(b)] for a, b, _ in back],
            "unreached": [rel(p) for p in unreached],
        })
        print(json.dumps(summary))
        return 1 if args.check and (sccs or back) else 0

    def tag(p):
        if not layers:
            return ""
        l = layer_of.get(p)
        return "  [root]" if l == -1 else ("  [no layer]" if l is None else f"  [L{l + 1}]")

    out_deg = defaultdict(int)
    in_deg = defaultdict(int)
    for (a, b) in edges:
        out_deg[a] += 1
        in_deg[b] += 1
    print(f"crate {crate_dir.name}: {len(nodes)} files, {summary['lines']} lines"
          f"{' (tests left out)' if args.no_tests else ''}")
    print(f"\nfiles (lines, imports out/in):")
    for p in sorted(nodes, key=lambda p: ((layer_of.get(p) or 0) if layers else 0, rel(p))):
        f = files[p]
        print(f"  {f.lines:5}  {out_deg[p]:2}/{in_deg[p]:<2}  {rel(p)}{' (test)' if f.test else ''}{tag(p)}")
    print(f"\nedges: {len(edges)} file pairs ({test_only} from test code only), {sites_total} import sites")
    for (a, b), sites in sorted(edges.items(), key=lambda e: (rel(e[0][0]), rel(e[0][1]))):
        names = sorted({s[1] for s in sites})
        t = " (test)" if all(s[2] for s in sites) else ""
        print(f"  {rel(a)} -> {rel(b)}  x{len(sites)}{t}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}")
        if args.sites:
            for line, text, test, kind in sorted(sites):
                print(f"      {rel(a)}:{line}  {kind} {text}{' (test)' if test else ''}")
    print(f"\ncircles (import cycles of more than one file): {len(sccs)}")
    for c in sccs:
        print(f"  {len(c)} files: {', '.join(rel(p) for p in c)}")
    if layers:
        print(f"\nlayers ({source}), top first:")
        for i, names in enumerate(layers):
            print(f"  L{i + 1}: {' '.join(names)}")
        for n in unknown:
            print(f"  warning: {n!r} names no module of the crate")
        nolayer = [rel(p) for p in nodes if layer_of.get(p) is None]
        if nolayer:
            print(f"  files in no layer (not judged): {', '.join(sorted(nolayer))}")
        print(f"\nback-up arrows (an import of a higher layer): {len(back)} file pairs, "
              f"{sum(len(s) for _, _, s in back)} import sites")
        for a, b, sites in back:
            names = sorted({s[1] for s in sites})
            print(f"  {rel(a)} [L{layer_of[a] + 1}] -> {rel(b)} [L{layer_of[b] + 1}]  x{len(sites)}: {', '.join(names[:4])}")
        print(f"sideways (within one layer): {len(sideways)} file pairs")
        for a, b, sites in sideways:
            print(f"  {rel(a)} -> {rel(b)}  x{len(sites)}")
    else:
        print("\nlayers: none given (--layers, or a 'Layers ...:' list in the crate root's doc)")
    if args.suggest:
        print("\nsuggested layers (longest import chain below each file; a circle counts as one):")
        for i, layer in enumerate(suggest(nodes, adj, sccs)):
            print(f"  {i + 1}. {' '.join(sorted(rel(p) for p in layer))}")
    if unreached:
        print(f"\nfiles under src/ that no crate root declares: {', '.join(rel(p) for p in unreached)}")
    print("\nsummary: " + json.dumps({k: v for k, v in summary.items() if k != "crate"}))
    return 1 if args.check and (sccs or back) else 0


if __name__ == "__main__":
    sys.exit(main())
