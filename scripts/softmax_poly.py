#!/usr/bin/env python3
"""Coefficients of `codegen::kernels::math::softmax_numerator`'s polynomial (`SOFTMAX_NUMERATOR_POLY`).

p(f) ~ 255 * 2^f on [-1/2, 1/2], degree DEG, the constant fixed at exactly 255 (so that the row's
maximum, t = 0, gets the numerator 255 and the byte 255), the other coefficients fitted in relative
error by Lawson's iteratively reweighted least squares (towards minimax), then rounded to f32.
Prints the Rust constant and the worst relative error of the f32 Horner evaluation (one rounding
per step, as `mul_add`) on a dense grid of f. Needs numpy.

    python3 scripts/softmax_poly.py
"""
import numpy as np

DEG, SCALE = 4, 255.0


def horner_f32(c32, f32):
    """`p = p.mul_add(f, c)` from the highest coefficient down, each step rounded once to f32."""
    p = np.full(f32.shape, np.float64(c32[-1]))
    for k in range(DEG - 1, -1, -1):
        p = (p * f32.astype(np.float64) + np.float64(c32[k])).astype(np.float32).astype(np.float64)
    return p


def fit():
    fs = np.linspace(-0.5, 0.5, 4000)
    fs = fs[fs != 0]
    vander = np.vander(fs, DEG + 1, increasing=True)[:, 1:]
    y = SCALE * np.exp2(fs)
    w = np.ones_like(fs)
    best = None
    for _ in range(200):
        sw = np.sqrt(w) / y
        c, *_ = np.linalg.lstsq(vander * sw[:, None], (y - SCALE) * sw, rcond=None)
        err = np.abs(vander @ c + SCALE - y) / y
        if best is None or err.max() < best[0]:
            best = (err.max(), c)
        w = w * err
        w /= w.sum()
    return np.concatenate([[SCALE], best[1]]).astype(np.float32)


def main():
    c32 = fit()
    f = np.linspace(-0.5, 0.5, 400001).astype(np.float32)
    exact = SCALE * np.exp2(f.astype(np.float64))
    worst = (np.abs(horner_f32(c32, f) - exact) / exact).max()
    coeffs = ", ".join(repr(float(c)) for c in c32[::-1])
    print(f"const SOFTMAX_NUMERATOR_POLY: [f32; {DEG + 1}] = [{coeffs}];")
    print(f"// worst relative error of the f32 evaluation: {worst:.2e}")


if __name__ == "__main__":
    main()
