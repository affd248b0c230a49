#!/usr/bin/env python3
"""clean.py CMD...: runs CMD until a run during which other processes took < 4% of the 2 cores
(at most 6 attempts; before each, waits up to 120 s for a quiet second); prints its stdout and,
on stderr, what the other processes took."""
import os, subprocess, sys, time
def busy():
    f = open('/proc/stat').readline().split()[1:]
    v = list(map(int, f)); idle = v[3] + v[4]
    return sum(v) - idle, sum(v)
hz = os.sysconf('SC_CLK_TCK')
for attempt in range(6):
    start = time.time()
    while time.time() - start < 120:  # wait for a quiet second
        b0, t0 = busy(); time.sleep(1.0); b1, t1 = busy()
        if (b1 - b0) / max(1, t1 - t0) < 0.03: break
    b0, t0 = busy(); r0 = os.times()
    p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    b1, t1 = busy(); r1 = os.times()
    own = ((r1.children_user - r0.children_user) + (r1.children_system - r0.children_system)) * hz
    other = (b1 - b0) - own
    frac = other / max(1, t1 - t0)
    if frac < 0.04:
        sys.stdout.buffer.write(p.stdout); sys.stderr.write(f"[clean run, others {frac:.3f}, attempt {attempt}]\n"); sys.exit(p.returncode)
    sys.stderr.write(f"[others took {frac:.3f}; again]\n")
sys.stdout.buffer.write(p.stdout); sys.stderr.write(f"[gave up waiting for a quiet machine: others {frac:.3f}]\n")
sys.exit(p.returncode)
