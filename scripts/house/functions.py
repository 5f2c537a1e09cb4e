#!/usr/bin/env python3
"""Functions longer than a limit (80 lines by default) in the workspace's non-test Rust code.

usage: scripts/house/functions.py [--limit N] [--all] [DIR...]   (default DIR: crates)

Test code is left out: files named tests.rs, *_tests.rs, testing.rs, files under a tests/ or
benches/ directory, and everything after a `#[cfg(test)]` module. A function's length is from
its `fn` line to its closing brace. Prints `lines  path:line  name`, longest first, and a count
per crate; --all prints every function over the limit, not only the first 40.
"""
import os
import re
import sys

FN = re.compile(r'^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+"[^"]*"\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)')


def strip_code(line, state):
    """The line with string and char literals and comments blanked; state carries block
    comments and multi-line strings across lines."""
    out = []
    i = 0
    n = len(line)
    while i < n:
        if state['block']:
            end = line.find('*/', i)
            if end < 0:
                return ''.join(out), state
            state['block'] = False
            i = end + 2
            continue
        if state['str']:
            raw = state['raw']
            if raw is not None:
                end = line.find('"' + '#' * raw, i)
                if end < 0:
                    return ''.join(out), state
                state['str'] = False
                state['raw'] = None
                i = end + 1 + raw
                continue
            while i < n:
                c = line[i]
                if c == '\\':
                    i += 2
                    continue
                if c == '"':
                    state['str'] = False
                    i += 1
                    break
                i += 1
            continue
        c = line[i]
        if line.startswith('//', i):
            break
        if line.startswith('/*', i):
            state['block'] = True
            i += 2
            continue
        m = re.match(r'b?r(#*)"', line[i:])
        if m and (i == 0 or not (line[i - 1].isalnum() or line[i - 1] == '_')):
            state['str'] = True
            state['raw'] = len(m.group(1))
            i += m.end()
            continue
        if c == '"':
            state['str'] = True
            state['raw'] = None
            i += 1
            continue
        if c == "'":
            m = re.match(r"'(\\.|[^\\'])'", line[i:]) or re.match(r"'\\u\{[0-9a-fA-F]+\}'", line[i:])
            if m:
                i += m.end()
                continue
        out.append(c)
        i += 1
    return ''.join(out), state


def is_test_file(path):
    base = os.path.basename(path)
    parts = path.split(os.sep)
    return (base in ('tests.rs', 'testing.rs') or base.endswith('_tests.rs')
            or 'tests' in parts[:-1] or 'benches' in parts[:-1])


def functions(path):
    with open(path, encoding='utf-8', errors='replace') as f:
        lines = f.read().split('\n')
    state = {'block': False, 'str': False, 'raw': None}
    code = []
    for line in lines:
        text, state = strip_code(line, state)
        code.append(text)
    # cut at a #[cfg(test)] module
    for i, line in enumerate(code):
        if line.strip() == '#[cfg(test)]':
            j = i + 1
            while j < len(code) and (code[j].strip().startswith('#[') or not code[j].strip()):
                j += 1
            if j < len(code) and re.match(r'\s*(pub\s+)?mod\s', code[j]):
                code = code[:i]
                break
    out = []
    depth = 0
    open_fns = []  # (name, start line, depth at which its body opened)
    pending = None  # a fn header whose body brace has not been seen
    for no, line in enumerate(code, 1):
        m = FN.match(line)
        if m and pending is None:
            pending = (m.group(1), no)
        for c in line:
            if c == '{':
                depth += 1
                if pending is not None:
                    open_fns.append((pending[0], pending[1], depth))
                    pending = None
            elif c == '}':
                if open_fns and open_fns[-1][2] == depth:
                    name, start, _ = open_fns.pop()
                    out.append((no - start + 1, start, name))
                depth -= 1
            elif c == ';' and pending is not None and '[' not in line:
                pending = None  # a declaration without a body (a trait's method)
    return out


def crate_of(path):
    parts = path.split(os.sep)
    if 'crates' in parts:
        return parts[parts.index('crates') + 1]
    return parts[0]


def main():
    args = sys.argv[1:]
    limit = 80
    show_all = False
    dirs = []
    while args:
        a = args.pop(0)
        if a == '--limit':
            limit = int(args.pop(0))
        elif a == '--all':
            show_all = True
        else:
            dirs.append(a)
    dirs = dirs or ['crates']
    found = []
    for d in dirs:
        for root, _, files in os.walk(d):
            if '/target' in root or '/fuzz/' in root:
                continue
            for f in files:
                if not f.endswith('.rs'):
                    continue
                path = os.path.join(root, f)
                if is_test_file(path):
                    continue
                for length, line, name in functions(path):
                    if length > limit:
                        found.append((length, f'{path}:{line}', name, crate_of(path)))
    found.sort(reverse=True)
    for length, where, name, _ in found if show_all else found[:40]:
        print(f'{length:5}  {where}  {name}')
    per = {}
    for *_, crate in found:
        per[crate] = per.get(crate, 0) + 1
    print(f'functions over {limit} lines: {len(found)}')
    for crate, n in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f'  {crate}: {n}')


if __name__ == '__main__':
    main()
