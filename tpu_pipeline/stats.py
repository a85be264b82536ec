"""Confidence intervals shared by convert's verdicts and rl's evaluations (neither may import
the other)."""

from __future__ import annotations

import math

WILSON_Z = 1.96  # 95% two-sided


def wilson(k: int, n: int, z: float = WILSON_Z) -> list[float]:
    """Wilson score interval of a proportion k/n (stays inside [0, 1] and is honest at 0 and n,
    where the normal approximation collapses to a point)."""
    if n <= 0:
        return [0.0, 1.0]
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return [max(0.0, mid - half), min(1.0, mid + half)]
