#!/usr/bin/env python3
"""Model of the seesaw verify-attention schedule (kernels/cuda/verify_attention/seesaw.cu
and its headers seesaw_tiles.cuh, seesaw_fp8.cuh, seesaw_roles.cuh).

Three parts, all host-only, for whoever changes the schedule:

  algebra  replays the kernel's per-pair online-softmax algebra (64-key tiles taken two at a
           time, output columns split over two warpgroups, one shared running max, one row
           sum per warpgroup, odd tile counts, fully masked rows and tiles) and compares it
           with a plain softmax. Exit status 1 on a mismatch.
  cycles   an event model of one CTA on one SM: the tensor pipe serves wgmma groups one at
           a time in issue order, softmax runs on the CUDA cores, a KV buffer part is full
           LOAD cycles after its last reader released it. Prints cycles per tile and the
           tensor-pipe busy fraction (docs/KERNEL_NOTES.md uses it for its predictions).
  protocol random interleavings of the kernel's synchronisation, per warp (4 producer, 4 +
           4 math warps): mbarrier counts / phases / parities, named barriers, cp.async
           groups landing late. Fails on a deadlock, on a read that sees the wrong tile /
           pair, or on a buffer, P or stats slot overwritten before its reader is done.
           Mirror any change of the kernel's barrier code here (it caught nothing in the
           final code; removing any one release or wait makes it fail). Also the FP8
           instance's protocol (codes landed in atoms 0-3, converted by the math warpgroup
           that computes the tile's Q K^T), with two mutations that must be caught.

Usage: python3 bench/seesaw_schedule_model.py [algebra] [cycles] [protocol]   (default: all)
"""
import random
import sys

try:  # the algebra part needs numpy; the protocol and cycle parts run without it (CTest)
    import numpy as np
except ImportError:
    np = None

NEG = float("-inf")


def _exp2(x):
    with np.errstate(invalid="ignore", over="ignore"):
        return np.exp2(x)


def seesaw_attention(s, v, vis):
    """s [R, K] scores already in the log2 domain, v [K, 512], vis [R, K] visibility.
    Returns (out [R, 512], lse2 [R]) computed the way the kernel does."""
    with np.errstate(invalid="ignore", over="ignore"):  # (-inf) - (-inf): masked out below
        return _seesaw(s, v, vis)


def _seesaw(s, v, vis):
    rows, keys = s.shape
    s = np.where(vis, s, NEG)
    num_tiles = (keys + 63) // 64
    m = np.full(rows, NEG)
    l0 = np.zeros(rows)
    l1 = np.zeros(rows)
    o_l = np.zeros((rows, 256))
    o_r = np.zeros((rows, 256))

    def tile(t):  # keys past the range: score -inf (masked), V zero (zero-filled)
        lo, hi = 64 * t, min(keys, 64 * t + 64)
        st = np.full((rows, 64), NEG)
        st[:, : hi - lo] = s[:, lo:hi]
        vt = np.zeros((64, 512))
        vt[: hi - lo] = v[lo:hi]
        return st, vt

    def rescale(m_old, m_new):  # 2^(m_old - m_new), 1 while the row has seen nothing
        return np.where(m_new == NEG, 1.0, _exp2(m_old - m_new))

    def probs(st, mm):
        return np.where(mm[:, None] == NEG, 0.0, _exp2(st - mm[:, None]))

    for p in range((num_tiles + 1) // 2):
        s0, v0 = tile(2 * p)
        has1 = 2 * p + 1 < num_tiles
        # WG0: S0, softmax against m, P0 V0_L.
        m0 = np.maximum(m, s0.max(1))
        scale0 = rescale(m, m0)
        p0 = probs(s0, m0)
        l0 = l0 * scale0 + p0.sum(1)
        o_l = o_l * scale0[:, None] + p0 @ v0[:, :256]
        # WG1: S1, softmax against m0.
        if has1:
            s1, v1 = tile(2 * p + 1)
            m1 = np.maximum(m0, s1.max(1))
            scale1 = rescale(m0, m1)
            p1 = probs(s1, m1)
            sum1 = p1.sum(1)
        else:
            m1, scale1, sum1 = m0, np.ones(rows), 0.0
        l1 = l1 * (scale0 * scale1) + sum1
        # WG1: O_R = (O_R * scale0 + P0 V0_R) * scale1 + P1 V1_R.
        o_r = o_r * scale0[:, None] + p0 @ v0[:, 256:]
        if has1:
            o_r = o_r * scale1[:, None] + p1 @ v1[:, 256:]
            # WG0: O_L = O_L * scale1 + P1 V1_L.
            l0 = l0 * scale1
            o_l = o_l * scale1[:, None] + p1 @ v1[:, :256]
        m = m1
    l = l0 + l1
    safe = np.where(l > 0, l, 1.0)
    out = np.concatenate([o_l, o_r], 1) * np.where(l > 0, 1.0 / safe, 0.0)[:, None]
    lse2 = np.where(l > 0, m + np.log2(safe), NEG)
    return out, lse2


def check_algebra(cases=300, seed=1):
    rng = np.random.default_rng(seed)
    worst = 0.0
    for case in range(cases):
        rows, keys = 8, int(rng.integers(0, 400))
        # Row offsets far apart so the running max moves inside a pair.
        s = rng.normal(0, 3, (rows, keys)) + rng.normal(0, 20, (rows, 1))
        s += np.linspace(0, rng.normal(0, 30), keys)[None, :] if keys else 0
        vis = rng.random((rows, keys)) < rng.choice([0.0, 0.05, 0.5, 1.0])
        v = rng.normal(size=(keys, 512))
        out, lse2 = seesaw_attention(s, v, vis)
        for r in range(rows):
            if not vis[r].any():
                if not (np.all(out[r] == 0) and lse2[r] == NEG):
                    print(f"case {case} row {r}: a row that sees nothing must give 0 / -inf")
                    return False
                continue
            x = s[r][vis[r]]
            w = np.exp2(x - x.max())
            ref = (w / w.sum()) @ v[vis[r]]
            ref_lse2 = x.max() + np.log2(w.sum())
            err = max(np.abs(out[r] - ref).max(), abs(lse2[r] - ref_lse2))
            worst = max(worst, err)
            if err > 1e-9:
                print(f"case {case} (keys {keys}) row {r}: error {err:.3e}")
                return False
    print(f"algebra: {cases} random cases match a plain softmax (worst abs error {worst:.1e})")
    return True


def cycles_per_tile(softmax=400.0, load=0.0, pairs=40, s_cycles=1152.0, pv_half=512.0,
                    bar=40.0):
    """Event model of one CTA. s_cycles: S = 64x64x576 at 4096 FLOP/clk; pv_half: one tile's
    PV for one warpgroup's 256 columns."""
    pipe = [0.0]

    def mma(ready, dur):
        start = max(ready, pipe[0])
        pipe[0] = start + dur
        return pipe[0]

    def mma_pair(ready_a, ready_b, dur):
        """Two groups of `dur` issued in the order they are ready (a first on a tie); their
        end times (a, b)."""
        if ready_a <= ready_b:
            done_a = mma(ready_a, dur)
            return done_a, mma(ready_b, dur)
        done_b = mma(ready_b, dur)
        return mma(ready_a, dur), done_b

    empty_a0 = empty_bc0 = empty_a1 = empty_bc1 = 0.0
    wg0 = wg1 = 0.0
    ends = []
    for p in range(pairs):
        full0 = 0.0 if p == 0 else max(empty_a0, empty_bc0) + load
        full1 = 0.0 if p == 0 else max(empty_a1, empty_bc1) + load
        r0, r1 = max(wg0, full0), max(wg1, full1)
        s0, s1 = mma_pair(r0, r1, s_cycles)
        p0_ready = s0 + softmax + bar
        p1_ready = max(s1, p0_ready) + softmax + bar
        # WG0's P0 V0_L and WG1's P0 V0_R compete for the pipe in issue order.
        c_done, g1 = mma_pair(p0_ready, p1_ready, pv_half)
        g2 = mma(g1 + bar, pv_half)                 # WG1: P1 V1_R after the rescale wait
        d_done = mma(max(c_done, p1_ready), pv_half)  # WG0: P1 V1_L
        empty_a0, empty_bc0 = c_done, g1
        empty_a1, empty_bc1 = d_done, max(d_done, g2)
        wg0, wg1 = d_done + bar, g2 + bar
        ends.append(max(wg0, wg1))
    per_pair = (ends[-1] - ends[9]) / (pairs - 10)
    busy = (2 * s_cycles + 4 * pv_half) / per_pair
    return per_pair / 2, busy


# ---- protocol ------------------------------------------------------------------------


class Mbar:
    def __init__(s, count): s.count = count; s.pending = count; s.phase = 0
    def arrive(s):
        s.pending -= 1
        assert s.pending >= 0
        if s.pending == 0: s.phase += 1; s.pending = s.count
    def done(s, parity):  # phase with this parity completed (current phase parity differs)
        return (s.phase & 1) != parity

class NamedBar:
    def __init__(s, n): s.n = n; s.arrived = 0; s.gen = 0
def run_protocol(num_tiles, seed, fp8=False, mutate=None):
    """fp8: the FP8 instance (SeesawFp8S64): the producer lands a tile's codes in atoms 0-3
    ('A') after empty_a (full A) and its rope ('C') after empty_bc (full C); the math
    warpgroup that computes the tile's Q K^T converts it (writes 'A' and 'B') after full A
    and after empty_bc of the tile two back (for WG1 that is its own other warps' P1 V1_R:
    the warps of a warpgroup are not in step), then a named barrier of its 4 warps.
    mutate: drop one wait of the FP8 protocol ('wg0_empty_bc', 'wg1_empty_bc' or
    'wg1_codes') to check that the model notices."""
    rnd = random.Random(seed)
    full = {(g, b): Mbar(4) for g in range(3) for b in range(2)}  # 4 producer warps
    emptyA = [Mbar(4), Mbar(4)]; emptyBC = [Mbar(4), Mbar(8)]; qbar = Mbar(4)
    named = {i: NamedBar(8) for i in (1, 2, 3)}
    named.update({i: NamedBar(4) for i in (5, 6)})  # FP8: one warpgroup's 4 warps
    conv = {}  # FP8: (buffer, tile) -> warps that converted their rows
    # data tags
    buf = {(b, part): None for b in range(2) for part in ('A', 'B', 'C')}   # tile loaded
    pslot = [None, None]   # P tag in atom 8 of buffer b: ('P', pair)
    stats0 = None; stats1 = None
    reading = {}           # (agent, key) -> expected tag, checked at release
    inflight = []          # (land_time, part key, tile, agent)
    num_pairs = (num_tiles + 1) // 2
    def producer(w):
        yield ('noop',)
        for t in range(num_tiles):
            b = t & 1; par = ((t >> 1) - 1) & 1
            if t >= 2: yield ('wait', emptyA[b], par)
            if fp8:
                yield ('load', (b, 'A'), ('codes', t), full[(0, b)])
                if t >= 2: yield ('wait', emptyBC[b], par)
                yield ('load', (b, 'C'), t, full[(2, b)])
                continue
            yield ('load', (b, 'A'), t, full[(0, b)])
            if t >= 2: yield ('wait', emptyBC[b], par)
            yield ('load', (b, 'B'), t, full[(1, b)])
            yield ('load', (b, 'C'), t, full[(2, b)])
    def convert(wgi, t, p):  # FP8: warpgroup wgi converts tile t (buffer wgi) before its S
        if not (mutate == 'wg1_codes' and wgi == 1):
            yield ('wait', full[(0, wgi)], p & 1)
        if p >= 1 and mutate != f'wg{wgi}_empty_bc':
            yield ('wait', emptyBC[wgi], (p - 1) & 1)
        yield ('convert', wgi, t)
        yield ('sync_named', 5 + wgi)
    def waits_for_s(b, p):  # the full barriers Q K^T waits on (FP8: the rope only)
        for g in ((2,) if fp8 else range(3)): yield ('wait', full[(g, b)], p & 1)
    def wg0(w):
        yield ('wait', qbar, 0)
        for p in range(num_pairs):
            t0, t1 = 2 * p, 2 * p + 1; has1 = t1 < num_tiles
            if fp8: yield from convert(0, t0, p)
            yield from waits_for_s(0, p)
            yield ('read', (0, 'A'), t0); yield ('read', (0, 'B'), t0); yield ('read', (0, 'C'), t0)
            yield ('endread', (0, 'B')); yield ('endread', (0, 'C'))   # S0 done (wgmma waited)
            yield ('writeP', 0, p); yield ('writestats', 0, p)
            yield ('arrive_named', 1)
            yield ('endread', (0, 'A'))                                  # P0 V0_L done
            yield ('arrive', emptyA[0])
            yield ('sync_named', 2)
            yield ('readstats', 1, p)
            if has1:
                yield ('read', (1, 'A'), t1); yield ('readP', 1, p)
                yield ('endread', (1, 'A')); yield ('endP', 1)
                yield ('arrive', emptyA[1]); yield ('arrive', emptyBC[1])
        yield ('sync_named', 3)
    def wg1(w):
        yield ('wait', qbar, 0)
        for p in range(num_pairs):
            t0, t1 = 2 * p, 2 * p + 1; has1 = t1 < num_tiles
            if has1:
                if fp8: yield from convert(1, t1, p)
                yield from waits_for_s(1, p)
                yield ('read', (1, 'A'), t1); yield ('read', (1, 'B'), t1); yield ('read', (1, 'C'), t1)
                yield ('endread', (1, 'A')); yield ('endread', (1, 'B')); yield ('endread', (1, 'C'))
            yield ('sync_named', 1)
            yield ('readstats', 0, p)
            if has1: yield ('writeP', 1, p)
            yield ('writestats', 1, p)
            yield ('arrive_named', 2)
            yield ('read', (0, 'B'), t0); yield ('readP', 0, p)
            yield ('endread', (0, 'B')); yield ('endP', 0)
            yield ('arrive', emptyBC[0])
            if has1:
                yield ('read', (1, 'B'), t1)
                yield ('endread', (1, 'B'))
                yield ('arrive', emptyBC[1])
        yield ('sync_named', 3)
    agents = {}
    for w in range(4):
        agents[('P', w)] = producer(w); agents[('W0', w)] = wg0(w); agents[('W1', w)] = wg1(w)
    cur = {a: next(g) for a, g in agents.items()}
    # q load lands
    for w in range(4): inflight.append((rnd.random() * 5, 'Q', None, None))
    named_wait = {}  # agent -> (bar id, gen)
    now = 0.0
    pread = {}  # (agent, slot) -> tag
    def runnable(a):
        op = cur[a]
        if op is None: return False
        if op[0] == 'wait': return op[1].done(op[2])
        if op[0] == 'sync_named':
            if a in named_wait: return named[op[1]].gen > named_wait[a]
            return True
        return True
    steps = 0
    while True:
        steps += 1
        if steps > 200000: return 'too many steps'
        # land copies
        inflight.sort(key=lambda x: x[0])
        ready = [a for a in cur if runnable(a)]
        if not ready and not inflight:
            if all(v is None for v in cur.values()): return None
            return 'DEADLOCK ' + str({a: (cur[a][0], cur[a][1] if len(cur[a]) > 1 and isinstance(cur[a][1], int) else '') for a in cur if cur[a] is not None})
        if inflight and (not ready or rnd.random() < 0.3):
            t, key, tile, mb = inflight.pop(0)
            if key == 'Q': qbar.arrive(); continue
            # landing writes the part: must not be under read
            for (ag, k), exp in reading.items():
                if k == key: return f'overwrite of {key} (tile {exp}) by tile {tile} while {ag} reads'
            if key[1] == 'C' and pslot[key[0]] is not None and any(k == key[0] for (ag, k) in pread):
                return f'P slot {key[0]} overwritten while read'
            buf[key] = tile
            if key[1] == 'C': pslot[key[0]] = None
            mb.arrive()
            continue
        a = rnd.choice(ready); op = cur[a]
        k = op[0]
        if k == 'wait': pass
        elif k == 'load':
            # a producer warp's copies: the part lands when all 4 warps' copies land; model:
            # per-warp landing arrives once on the full barrier; data tag written at each.
            inflight.append((now + rnd.random() * 10, op[1], op[2], op[3]))
        elif k == 'read':
            if buf[op[1]] != op[2]: return f'{a} reads {op[1]} expecting tile {op[2]} found {buf[op[1]]}'
            reading[(a, op[1])] = op[2]
        elif k == 'endread':
            del reading[(a, op[1])]
        elif k == 'convert':
            # this warp's rows of buffer b: the codes in 'A' become the f16 tile in 'A' and 'B'
            b, tile = op[1], op[2]
            if buf[(b, 'A')] != ('codes', tile) and conv.get((b, tile), 0) == 0:
                return f'{a} converts buffer {b} expecting the codes of tile {tile}, found {buf[(b, "A")]}'
            for (ag, key), exp in reading.items():
                if key in ((b, 'A'), (b, 'B')):
                    return f'{a} converts tile {tile} into {key} while {ag} reads tile {exp}'
            if any(key in ((b, 'A'),) for _, key, _, _ in inflight):
                return f'{a} converts tile {tile} while codes for buffer {b} are still landing'
            conv[(b, tile)] = conv.get((b, tile), 0) + 1
            buf[(b, 'A')] = buf[(b, 'B')] = ('partial', tile)
            if conv[(b, tile)] == 4: buf[(b, 'A')] = buf[(b, 'B')] = tile
        elif k == 'writeP':
            for (ag, sl) in pread:
                if sl == op[1]: return f'P{op[1]} written by {a} while {ag} reads it'
            pslot[op[1]] = op[2]
        elif k == 'readP':
            if pslot[op[1]] != op[2]: return f'{a} reads P{op[1]} expecting pair {op[2]} found {pslot[op[1]]}'
            pread[(a, op[1])] = op[2]
        elif k == 'endP':
            del pread[(a, op[1])]
        elif k == 'writestats':
            if op[1] == 0: stats0 = op[2]
            else: stats1 = op[2]
        elif k == 'readstats':
            got = stats0 if op[1] == 0 else stats1
            if got != op[2]: return f'{a} reads stats{op[1]} expecting pair {op[2]} found {got}'
        elif k == 'arrive': op[1].arrive()
        elif k == 'arrive_named':
            nb = named[op[1]]; nb.arrived += 1
            if nb.arrived == nb.n: nb.arrived = 0; nb.gen += 1
        elif k == 'sync_named':
            nb = named[op[1]]
            if a not in named_wait:
                named_wait[a] = nb.gen; nb.arrived += 1
                if nb.arrived == nb.n: nb.arrived = 0; nb.gen += 1
                if nb.gen == named_wait[a]: continue  # blocked until released
            del named_wait[a]
        now += 1
        try: cur[a] = next(agents[a])
        except StopIteration: cur[a] = None



def check_protocol(max_tiles=12, seeds=300, fp8=False, mutate=None, quiet=False):
    bad = 0
    name = "protocol" + (" (FP8 instance)" if fp8 else "") + (f" [{mutate} removed]" if mutate else "")
    for num_tiles in range(max_tiles):
        for seed in range(seeds):
            r = run_protocol(num_tiles, seed, fp8, mutate)
            if r:
                if not quiet:
                    print(f"{name}: tiles", num_tiles, "seed", seed, r)
                bad += 1
                if bad > 5:
                    return False
    if not bad:
        print(f"{name}: no deadlock / hazard in {max_tiles * seeds} random interleavings "
              f"(0..{max_tiles - 1} tiles)")
    return bad == 0


def check_protocol_fp8():
    """The FP8 instance's protocol is clean, and removing either of its conversion waits
    makes the model fail (so the check can fail)."""
    ok = check_protocol(fp8=True)
    for mutate in ("wg0_empty_bc", "wg1_empty_bc", "wg1_codes"):
        if check_protocol(fp8=True, mutate=mutate, quiet=True):
            print(f"protocol (FP8 instance): removing {mutate} went unnoticed")
            ok = False
        else:
            print(f"protocol (FP8 instance): removing {mutate} is caught")
    return ok


def main(argv):
    parts = argv[1:] or ["algebra", "cycles", "protocol"]
    ok = True
    if "algebra" in parts:
        if np is None:
            sys.exit("seesaw_schedule_model: the algebra part needs numpy")
        ok = check_algebra() and ok
    if "protocol" in parts:
        ok = check_protocol() and ok
        ok = check_protocol_fp8() and ok
    if "cycles" in parts:
        print("| softmax cycles | load cycles | cycles / tile | tensor busy |")
        print("|---|---|---|---|")
        for softmax in (300, 400, 600):
            for load in (0, 1500, 2500):
                per_tile, busy = cycles_per_tile(softmax, load)
                print(f"| {softmax} | {load} | {per_tile:.0f} | {100 * busy:.0f} % |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
