"""The standard normal CDF Φ, vectorised, to float64 accuracy (numpy has no erf).

Φ(x) = ½·erfc(−x/√2) is evaluated piecewise in u = |x|/√2 with the rational approximations of
Sun Microsystems' fdlibm ``s_erf.c`` (accurate to under 1 ulp of erf/erfc in float64):

* u < 0.84375:          erf(u) = u + u·P(u²)/Q(u²), so Φ = ½ ± ½·erf(u);
* 0.84375 ≤ u < 1.25:   erf(u) = erx + P(u − 1)/Q(u − 1);
* u ≥ 1.25:             erfc(u) = exp(−u² − 0.5625 + R(1/u²)/S(1/u²)) / u, with one pair of
                        rationals below u = 1/0.35 and another above.

In the left tail Φ comes from erfc directly, never as 1 − (something near 1), so it keeps its
relative accuracy down to underflow. The constants are Python floats, so float32 input is
computed in float32 (no up-cast).
"""
from __future__ import annotations

import math

from . import array_module

SQRT1_2 = math.sqrt(0.5)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)

ERX = 8.45062911510467529297e-01  # erf(1) rounded to 24 bits, the centre of the second region
# numerator and denominator coefficients, constant term first (denominators' constant is 1)
_PP = (1.28379167095512558561e-01, -3.25042107247001499370e-01, -2.84817495755985104766e-02,
       -5.77027029648944159157e-03, -2.37630166566501626084e-05)
_QQ = (1.0, 3.97917223959155352819e-01, 6.50222499887672944485e-02, 5.08130628187576562776e-03,
       1.32494738004321644526e-04, -3.96022827877536812320e-06)
_PA = (-2.36211856075265944077e-03, 4.14856118683748331666e-01, -3.72207876035701323847e-01,
       3.18346619901161753674e-01, -1.10894694282396677476e-01, 3.54783043256182359371e-02,
       -2.16637559486879084300e-03)
_QA = (1.0, 1.06420880400844228286e-01, 5.40397917702171048937e-01, 7.18286544141962662868e-02,
       1.26171219808761642112e-01, 1.36370839120290507362e-02, 1.19844998467991074170e-02)
_RA = (-9.86494403484714822705e-03, -6.93858572707181764372e-01, -1.05586262253232909814e+01,
       -6.23753324503260060396e+01, -1.62396669462573470355e+02, -1.84605092906711035994e+02,
       -8.12874355063065934246e+01, -9.81432934416914548592e+00)
_SA = (1.0, 1.96512716674392571292e+01, 1.37657754143519042600e+02, 4.34565877475229228821e+02,
       6.45387271733267880336e+02, 4.29008140027567833386e+02, 1.08635005541779435134e+02,
       6.57024977031928170135e+00, -6.04244152148580987438e-02)
_RB = (-9.86494292470009928597e-03, -7.99283237680523006574e-01, -1.77579549177547519889e+01,
       -1.60636384855821916062e+02, -6.37566443368389627722e+02, -1.02509513161107724954e+03,
       -4.83519191608651397019e+02)
_SB = (1.0, 3.03380607434824582924e+01, 3.25792512996573918826e+02, 1.53672958608443695994e+03,
       3.19985821950859553908e+03, 2.55305040643316442583e+03, 4.74528541206955367215e+02,
       -2.24409524465858183362e+01)


def _poly(coefs, z):
    """Σ coefs[i]·z**i by Horner's rule, in z's dtype, in place on one new array."""
    r = z * coefs[-1]
    for c in coefs[-2:0:-1]:
        r += c
        r *= z
    r += coefs[0]
    return r


def _erfc_tail(ax):
    """erfc(u), u = ax/√2, for u ≥ 1.25 (and inf, NaN): exp(−u² − 0.5625 + R/S) / u.

    −u² is taken as −z²/2 − (ax − z)(ax + z)/2, with z = ax cut to half the mantissa so z² is
    exact (fdlibm splits u the same way): exp(−u²) from a rounded u = ax·(1/√2) would carry
    u's rounding error times 2u² (some 280 ulps at x = −20.7).
    """
    xp = array_module(ax)
    ax = xp.minimum(ax, 30.0 / SQRT1_2)  # erfc(30) underflows to 0 in float64; inf → 0 not NaN; NaN stays
    u = ax * SQRT1_2
    s = 1.0 / (u * u)
    near = u < 1.0 / 0.35
    rs = xp.where(near, _poly(_RA, s) / _poly(_SA, s), _poly(_RB, s) / _poly(_SB, s))
    scale = 2.0 ** ((xp.finfo(ax.dtype).nmant + 1) // 2 - 6)  # z has ≤ half the bits while ax < 64
    z = xp.floor(ax * scale)
    z /= scale
    rs += 0.5 * ((z - ax) * (z + ax))
    head = z * z
    head *= 0.5
    head += 0.5625
    xp.negative(head, out=head)
    xp.exp(head, out=head)
    xp.exp(rs, out=rs)
    rs *= head
    rs /= u
    return rs


def ndtr(x):
    """Φ(x), the standard normal CDF, elementwise in x's dtype (numpy or cupy); NaN stays NaN.

    The first region's formula is evaluated on every element (most inputs of a layer fall in
    it, and a dense pass is cheaper than gathering them); the other regions' elements are
    gathered by flat index (a boolean mask is several times slower for scattered elements),
    computed, and put back.
    """
    xp = array_module(x)
    x = xp.ascontiguousarray(x)
    v = xp.clip(x, -_CORE_X, _CORE_X)  # beyond, the result is overwritten; clipped, no inf/inf
    v *= SQRT1_2
    z = v * v
    out = _poly(_PP, z)
    out /= _poly(_QQ, z)
    out *= v
    out += v  # erf(v), right where |v| < 0.84375
    out *= 0.5
    out += 0.5
    xf, of = x.reshape(-1), out.reshape(-1)
    rest = xp.flatnonzero(~(xp.abs(xf) < _CORE_X))  # also inf and NaN
    if rest.size:
        sub = xf[rest]
        res = xp.empty_like(sub)
        inner = xp.abs(sub) < _MID_X
        for idx, region in ((xp.flatnonzero(inner), _ndtr_mid), (xp.flatnonzero(~inner), _ndtr_tail)):
            if idx.size:
                res[idx] = region(sub[idx])
        of[rest] = res
    return out


_CORE_X = 0.84375 / SQRT1_2  # the regions' bounds on |x| (0.84375 and 1.25 on |x|/√2)
_MID_X = 1.25 / SQRT1_2


def _ndtr_mid(x):
    """Φ(x) where 0.84375 ≤ |x|/√2 < 1.25: erf(u) = ERX + P/Q, erfc(u) = (1 − ERX) − P/Q."""
    s = array_module(x).abs(x) * SQRT1_2
    s -= 1.0
    pq = _poly(_PA, s)
    pq /= _poly(_QA, s)
    return 0.5 * array_module(x).where(x < 0, (1.0 - ERX) - pq, (1.0 + ERX) + pq)


def _ndtr_tail(x):
    """Φ(x) where |x|/√2 ≥ 1.25 (and inf, NaN): ½·erfc(|x|/√2) on the left, 1 minus it on the right."""
    half_erfc = _erfc_tail(array_module(x).abs(x))
    half_erfc *= 0.5
    return array_module(x).where(x < 0, half_erfc, 1.0 - half_erfc)


def normal_pdf(x):
    """φ(x) = exp(−x²/2)/√(2π), elementwise in x's dtype."""
    xp = array_module(x)
    e = x * x
    e *= -0.5
    xp.exp(e, out=e)
    e *= INV_SQRT_2PI
    return e
