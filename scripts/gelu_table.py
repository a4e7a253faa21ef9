#!/usr/bin/env python3
"""Coefficients of `codegen::kernels::math::gelu_erf`'s tail table (`PHI_TAIL`).

Phi(-a) = erfc(a/sqrt 2)/2 on each of PIECES pieces of a in [0, 5.75], a = (i + t)/PHI_SCALE
with t in [0, 1] and PHI_SCALE = PIECES/5.75 as the f32 it is: a degree-DEG polynomial in t per
piece, fitted in relative error by Lawson's iteratively reweighted least squares (towards
minimax), then rounded to f32. Prints the Rust table and the worst relative error of the f32
Horner evaluation on a dense grid of t. Needs numpy.

    python3 scripts/gelu_table.py > table.rs
"""
import sys
from math import erfc, sqrt

import numpy as np

PIECES, DEG, FLUSH = 32, 5, 5.75
SCALE = float(np.float32(PIECES / FLUSH))


def tail(a):
    return 0.5 * erfc(a / sqrt(2.0))


def fit(i, ts, vander):
    y = np.array([tail((i + t) / SCALE) for t in ts])
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
    t32 = ts.astype(np.float32)
    p = np.full_like(t32, c32[-1])
    for k in range(DEG - 1, -1, -1):
        p = (p * t32 + c32[k]).astype(np.float32)
    return c32, float(np.max(np.abs(p.astype(np.float64) - y) / y))


def main():
    ts = np.linspace(0.0, 1.0, 1501)
    vander = np.vander(ts, DEG + 1, increasing=True)
    table, worst = [], 0.0
    for i in range(PIECES):
        c, err = fit(i, ts, vander)
        table.append(c)
        worst = max(worst, err)
    print(f"// worst relative error of the f32 evaluation: {worst:.3e}", file=sys.stderr)
    print(f"static PHI_TAIL: [[f32; PHI_PIECES]; {DEG + 1}] = [")
    for k in range(DEG + 1):
        print("    [")
        for i in range(PIECES):
            v = table[i][k]
            if v == 0 or abs(v) >= 1e-4:
                text = np.format_float_positional(v, unique=True, trim="0")
            else:
                text = np.format_float_scientific(v, unique=True, trim="0")
            print(f"        {text},")
        print("    ],")
    print("];")


if __name__ == "__main__":
    main()
