#!/usr/bin/env python3
# Reads a LOCKSTEP_DECODE_TIMELINE file (Note [decode timeline]) and summarizes its last call.
import sys, collections, statistics as st
calls = []; cur = None; in_merge = False
for line in open(sys.argv[1]):
    if line.startswith('## merge'):
        in_merge = True; cur['mhdr'] = line.split()[3:5]; continue
    if line.startswith('#'):
        cur = {'hdr': line.strip(), 'b': [], 'm': []}; calls.append(cur); in_merge = False; continue
    v = list(map(int, line.split()))
    if in_merge:
        if all(x > 0 for x in v[3:7]): cur['m'].append(v)  # x y sm start counter merged final
    elif all(x > 0 for x in v[4:9]):  # a block with every mark (not past the length, not row-major)
        cur['b'].append(v)
want = int(sys.argv[2]) if len(sys.argv) > 2 else None
sel = [c for c in calls if want is None or len(c['b']) == want]
c = sel[-1] if sel else calls[-1]
B = c['b']
print(c['hdr'], 'blocks', len(B), 'calls in file', len(calls))
if not B:  # the CPU's row-major path and the STAGES knobs mark only the start (Note [decode timeline])
    sys.exit('no block of this call has every mark (a CPU run, or a LOCKSTEP_DECODE_STAGES variant): nothing to summarize')
# per block: t0 start, t1 first tile, t2 scores done, t3 softmax done, t4 PV done, t5 partials stored
end = max(b[3+5] for b in B)
print('kernel span (first start to last partials) us %.2f' % (end / 1e3))
durs = [(b[8] - b[3]) / 1e3 for b in B]
print('block duration us: min %.2f median %.2f max %.2f' % (min(durs), st.median(durs), max(durs)))
for name, i, j in [('start->first tile', 3, 4), ('first tile->scores done', 4, 5), ('softmax', 5, 6), ('P x V', 6, 7), ('epilogue', 7, 8)]:
    d = [(b[j] - b[i]) / 1e3 for b in B]
    print('  %-24s min %.2f median %.2f max %.2f' % (name, min(d), st.median(d), max(d)))
starts = sorted(b[3] / 1e3 for b in B)
print('block starts (us) deciles:', ' '.join('%.1f' % starts[int(q * (len(starts) - 1))] for q in [0, .1, .25, .5, .51, .52, .55, .75, .9, 1]))
ends = sorted(b[8] / 1e3 for b in B)
print('block ends (us) deciles:', ' '.join('%.1f' % ends[int(q * (len(ends) - 1))] for q in [0, .1, .25, .4, .48, .5, .52, .75, .9, .99, 1]))
# resident blocks and blocks in each phase over time (1 us bins)
T = int(end / 1e3) + 2
res = [0] * T; reading = [0] * T; soft = [0] * T; epi = [0] * T; pre = [0] * T
for b in B:
    for t in range(T):
        lo, hi = t * 1000, (t + 1) * 1000
        def ov(a, z): return max(0, min(hi, z) - max(lo, a)) / 1000
        res[t] += ov(b[3], b[8]); pre[t] += ov(b[3], b[4]); reading[t] += ov(b[4], b[5]) + ov(b[6], b[7]); soft[t] += ov(b[5], b[6]); epi[t] += ov(b[7], b[8])
print('us: resident / prologue / streaming (scores, PxV) / softmax / epilogue (block-equivalents)')
for t in range(T):
    print('%3d %6.1f %6.1f %6.1f %6.1f %6.1f' % (t, res[t], pre[t], reading[t], soft[t], epi[t]))
sms = collections.Counter(b[2] for b in B)
print('SMs used', len(sms), 'blocks per SM min/max', min(sms.values()), max(sms.values()))
# Note [merge timeline]: per merge block, from the last partials stored of its chunk-grid row y
# (its kv head group: head = x / slices, y = head / 4 with 4 heads per chunk block).
M = c['m']
rows = int(c['hdr'].split()[2])
if M and rows > 1:
    print('merge blocks', len(M), '(not summarized: the chunk lines carry no row, and this call has', rows, 'rows)')
elif M:
    gx = int(c['mhdr'][0]); H = int(c['hdr'].split()[4]); S = gx // H
    last = collections.defaultdict(int)
    for b in B: last[b[1]] = max(last[b[1]], b[8])
    M = [m for m in M if (m[0] // S) // 4 in last]  # groups with a complete chunk block
    def q(d): d = sorted(d); return 'min %.2f median %.2f max %.2f' % (d[0], st.median(d), d[-1])
    print('merge blocks', len(M), 'slices', S)
    print('  start (from first chunk start)      ', q([m[3] / 1e3 for m in M]))
    print('  last partials of group -> counter   ', q([(m[4] - last[(m[0] // S) // 4]) / 1e3 for m in M]))
    print('  counter -> merged                   ', q([(m[5] - m[4]) / 1e3 for m in M]))
    print('  merged -> after final wait          ', q([(m[6] - m[5]) / 1e3 for m in M]))
    print('  last chunk partials %.2f us; last merged %.2f; last final %.2f' % (end / 1e3, max(m[5] for m in M) / 1e3, max(m[6] for m in M) / 1e3))
