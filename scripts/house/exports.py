#!/usr/bin/env python3
"""Exported items per library crate, and how many of them other crates name.

usage: scripts/house/exports.py [--unused CRATE]

An exported item is a top-level `pub` (not `pub(crate)`/`pub(super)`) fn, struct, enum, trait,
type, const, static or mod in a crate's non-test sources (methods are not counted). It is used
when its name appears as a word in another crate of the workspace (its sources, tests, benches,
binaries) or in tests/: an upper bound, since names like `new` collide. --unused CRATE lists that
crate's exported items no other crate names.
"""
import os
import re
import sys

ITEM = re.compile(r'^pub\s+(?:(?:async|const|unsafe)\s+)*(fn|struct|enum|trait|type|const|static|mod)\s+([A-Za-z_][A-Za-z0-9_]*)')


def is_test_file(path):
    base = os.path.basename(path)
    parts = path.split(os.sep)
    return (base in ('tests.rs', 'testing.rs') or base.endswith('_tests.rs')
            or 'tests' in parts[:-1] or 'benches' in parts[:-1])


def rust_files(d):
    for root, _, files in os.walk(d):
        if '/target' in root:
            continue
        for f in files:
            if f.endswith('.rs'):
                yield os.path.join(root, f)


def before_tests(text):
    lines = text.split('\n')
    for i, line in enumerate(lines):
        if line.strip() == '#[cfg(test)]':
            j = i + 1
            while j < len(lines) and (lines[j].strip().startswith('#[') or lines[j].strip().startswith('//')):
                j += 1
            if j < len(lines) and re.match(r'\s*(pub\s+)?mod\s', lines[j]):
                return '\n'.join(lines[:i])
    return text


def main():
    args = sys.argv[1:]
    unused_of = None
    if args[:1] == ['--unused']:
        unused_of = args[1]
    crates = sorted(d for d in os.listdir('crates') if os.path.exists(f'crates/{d}/src/lib.rs'))
    texts = {}
    for d in os.listdir('crates'):
        texts[d] = '\n'.join(open(p, encoding='utf-8', errors='replace').read() for p in rust_files(f'crates/{d}'))
    texts['tests/'] = '\n'.join(open(p, encoding='utf-8', errors='replace').read() for p in rust_files('tests'))
    print(f'{"crate":16} {"exported":>8} {"pub mod":>8} {"used outside":>12}')
    total = [0, 0]
    for c in crates:
        items = []
        for p in rust_files(f'crates/{c}/src'):
            if is_test_file(p) or '/bin/' in p:
                continue
            for line in before_tests(open(p, encoding='utf-8', errors='replace').read()).split('\n'):
                m = ITEM.match(line)
                if m:
                    items.append((m.group(1), m.group(2), p))
        others = '\n'.join(t for k, t in texts.items() if k != c)
        used = [i for i in items if re.search(r'\b' + re.escape(i[1]) + r'\b', others)]
        mods = sum(1 for i in items if i[0] == 'mod')
        print(f'{c:16} {len(items):8} {mods:8} {len(used):12}')
        total[0] += len(items)
        total[1] += len(used)
        if c == unused_of:
            for kind, name, p in items:
                if (kind, name, p) not in used:
                    print(f'    unused: {kind} {name}  ({p})')
    print(f'{"all":16} {total[0]:8} {"":8} {total[1]:12}')


if __name__ == '__main__':
    main()
