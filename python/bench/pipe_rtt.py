#!/usr/bin/env python3
# Round trip of a small length-prefixed frame over a pipe to a warm child interpreter
# (the hop a worker adds when it relays an actor call to a Python actor's process).
import os, struct, subprocess, sys, time, statistics
CHILD = r'''
import sys, struct
r, w = sys.stdin.buffer, sys.stdout.buffer
while True:
    h = r.read(4)
    if not h: break
    n = struct.unpack(">I", h)[0]
    b = r.read(n)
    w.write(h + b); w.flush()
'''
p = subprocess.Popen([sys.executable, "-u", "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
msg = b"x" * 64
frame = struct.pack(">I", len(msg)) + msg
for size_label in ["64B"]:
    ts = []
    for i in range(5000):
        t = time.perf_counter_ns()
        p.stdin.write(frame); p.stdin.flush()
        h = p.stdout.read(4); p.stdout.read(struct.unpack(">I", h)[0])
        ts.append(time.perf_counter_ns() - t)
    ts = ts[500:]
    ts.sort()
    print(f"pipe round trip {size_label}: p50 {ts[len(ts)//2]/1000:.1f} us, p99 {ts[int(len(ts)*0.99)]/1000:.1f} us")
p.stdin.close(); p.wait()
