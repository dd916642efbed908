#!/usr/bin/env python3
# Reads `cuobjdump -sass` output (a file, or stdin) and lists every kernel whose LDGSTS (cp.async)
# copies name a memory descriptor register that no instruction of the kernel sets (Note
# [streamed tiles] in kernels/decode.hpp: ptxas 13.0 did so for hinted copies in the one-grid
# decode kernels, which then died with an illegal instruction). Exit status 1 when it finds one.
#   cuobjdump -sass build/gpu/liblockstep.so.0 | tools/gpu/check_descriptors.py
import collections, re, sys

fn = None
uses, defs = collections.defaultdict(set), collections.defaultdict(set)
for line in (open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin):
    m = re.search(r'Function : (\S+)', line)
    if m:
        fn = m.group(1)
        continue
    m = re.search(r'/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)\s+([^;]*);', line)
    if not m or fn is None:
        continue
    op, args = m.group(2), m.group(3)
    if op.startswith('LDGSTS'):  # a descriptor is the pair URn, URn+1
        for u in re.findall(r'desc\[UR(\d+)\]', args):
            uses[fn].update({'UR%s' % u, 'UR%d' % (int(u) + 1)})
    first = re.match(r'(UR\d+)', args.split(',')[0].strip())
    if first and not op.startswith(('LDGSTS', 'STG', 'STS', 'RED', 'ATOM')):
        n = int(first.group(1)[2:])
        defs[fn].add('UR%d' % n)
        if '.64' in op or '.WIDE' in op:
            defs[fn].add('UR%d' % (n + 1))
bad = sorted((f, u) for f, us in uses.items() for u in us if u not in defs[f])
for f, u in bad:
    print('%s: copies through desc[%s], which nothing sets' % (f, u))
print('%d kernels with cp.async copies, %d with an unset descriptor' % (len(uses), len({f for f, _ in bad})))
sys.exit(1 if bad else 0)
