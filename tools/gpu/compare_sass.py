#!/usr/bin/env python3
"""Compares the SASS of two builds kernel by kernel (cuobjdump -sass of each library).

Usage: compare_sass.py OLD.txt NEW.txt [--drop-arg REGEX]

Instruction addresses are ignored. --drop-arg REGEX names a pattern to remove from NEW's kernel
names, for a template parameter added with a default (e.g. the decode chunk kernel's PF: a new
trailing `Lb0E` after its TL bool). Prints the kernels only in one build, and each kernel whose
code differs; exits 1 if any kernel of OLD is missing from NEW or differs, 0 otherwise (kernels
only in NEW are listed, not an error: a new variant).
"""
import re
import sys


def kernels(path, drop=None):
    out, name, body = {}, None, []
    for line in open(path):
        m = re.match(r'\s+Function : (\S+)', line)
        if m:
            if name:
                out[name] = body
            name = m.group(1)
            if drop:
                name = re.sub(drop[0], drop[1], name)
            body = []
        elif name:
            text = re.sub(r'/\*[0-9a-f]{4,}\*/', '', line).strip()
            if text:
                body.append(text)
    if name:
        out[name] = body
    return out


def main(argv):
    args = [a for a in argv[1:] if not a.startswith('--')]
    drop = None
    if '--drop-arg' in argv:
        drop = (argv[argv.index('--drop-arg') + 1], r'\1')
        args = [a for a in args if a != drop[0]]
    if len(args) != 2:
        print(__doc__)
        return 2
    old, new = kernels(args[0]), kernels(args[1], drop)
    missing = [k for k in old if k not in new]
    added = [k for k in new if k not in old]
    changed = [k for k in old if k in new and old[k] != new[k]]
    for k in missing:
        print('only in old:', k)
    for k in added:
        print('only in new:', k)
    for k in changed:
        n = sum(1 for a, b in zip(old[k], new[k]) if a != b) + abs(len(old[k]) - len(new[k]))
        print('changed:', k, f'({len(old[k])} -> {len(new[k])} lines, {n} differ)')
    same = len(old) - len(missing) - len(changed)
    print(f'{same} of {len(old)} kernels identical, {len(changed)} changed, {len(missing)} missing, {len(added)} new')
    return 1 if missing or changed else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
