#!/usr/bin/env python3
"""Coefficients of `codegen::kernels::math::gelu_erf`'s tail table (`PHI_TAIL`).

Phi(-a) = erfc(a/sqrt 2)/2 for a in [0, 5.75], cut into PIECES pieces centred on the integers of
v = a * PHI_SCALE, PHI_SCALE = SPAN/5.75 as the f32 it is: piece k holds the v that round to k
(ties to even), a = (k + t)/PHI_SCALE with t = v - k in [-1/2, 1/2] (piece 0 only t >= 0, the
last piece only up to v = SPAN). SPAN = PIECES - 3/4 keeps round(v) at PIECES - 1 at most, so the
piece index is the low bits of v + 1.5 * 2^23 rounded once, and t one fused multiply-add: no
conversion between floats and integers. Each piece is a degree-DEG polynomial in t, fitted in
relative error by Lawson's iteratively reweighted least squares (towards minimax), then rounded to
f32. Prints the Rust table and the worst relative error of the f32 Horner evaluation (single
rounding per step, as `mul_add`) on a dense grid of t. Needs numpy.

    python3 scripts/gelu_table.py > table.rs
"""
import sys
from math import erfc, sqrt

import numpy as np

PIECES, DEG, FLUSH = 32, 5, 5.75
SPAN = PIECES - 0.75
SCALE = float(np.float32(SPAN / FLUSH))


def tail(a):
    return 0.5 * erfc(a / sqrt(2.0))


def t_range(k):
    lo = 0.0 if k == 0 else -0.5
    hi = min(0.5, FLUSH * SCALE - k)
    return lo, hi


def horner_f32(c32, t32):
    """`p = p.mul_add(t, c)` from the highest coefficient down, each step rounded once to f32."""
    p = np.full(t32.shape, c32[-1], dtype=np.float64)
    for k in range(DEG - 1, -1, -1):
        p = (p * t32.astype(np.float64) + np.float64(c32[k])).astype(np.float32).astype(np.float64)
    return p


def fit(k):
    lo, hi = t_range(k)
    ts = np.linspace(lo, hi, 1501)
    vander = np.vander(ts, DEG + 1, increasing=True)
    y = np.array([tail((k + t) / SCALE) for t in ts])
    w = np.ones_like(ts)
    best = None
    for _ in range(60):
        sw = np.sqrt(w) / y
        c, *_ = np.linalg.lstsq(vander * sw[:, None], y * sw, rcond=None)
        err = np.abs(vander @ c - y) / y
        if best is None or err.max() < best[0]:
            best = (err.max(), c)
        w = w * err
        w /= w.sum()
    c32 = best[1].astype(np.float32)
    p = horner_f32(c32, ts.astype(np.float32))
    return c32, float(np.max(np.abs(p - y) / y))


def main():
    table, worst = [], 0.0
    for k in range(PIECES):
        c, err = fit(k)
        table.append(c)
        worst = max(worst, err)
    print(f"// worst relative error of the f32 evaluation: {worst:.3e}", file=sys.stderr)
    print(f"static PHI_TAIL: [[f32; PHI_PIECES]; {DEG + 1}] = [")
    for d in range(DEG + 1):
        print("    [")
        for k in range(PIECES):
            v = table[k][d]
            if v == 0 or abs(v) >= 1e-4:
                text = np.format_float_positional(v, unique=True, trim="0")
            else:
                text = np.format_float_scientific(v, unique=True, trim="0")
            print(f"        {text},")
        print("    ],")
    print("];")


if __name__ == "__main__":
    main()
