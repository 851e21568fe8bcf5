"""The soak gate's judgement of numbers: performance against a baseline within tolerances, and
what a soak's crash count proves about the crash rate (the exact Poisson bound: zero crashes in
T minutes -> rate < 3/T per minute at 95%, an MTBF target -> the minutes it needs).

Plain Python (no ``ansible`` import), unit-tested in tests/unit/test_soak.py.
"""

from __future__ import annotations

import math


class SoakConfigError(ValueError):
    """The soak cannot run as configured; the message says what to change."""


# Performance metrics a baseline may name: direction, how the tolerance applies, default tolerance.
#   higher: observed >= baseline * (1 - tol)   lower: observed <= baseline * (1 + tol)
#   lower_abs (KV cache, a 0-1 fraction): observed <= baseline + tol (tol in fraction points)
PERF_METRICS = {
    "total_token_throughput": ("higher", 0.05),
    "output_throughput": ("higher", 0.05),
    "request_throughput": ("higher", 0.05),
    "mean_tpot_ms": ("lower", 0.10),
    "median_tpot_ms": ("lower", 0.10),
    "p99_tpot_ms": ("lower", 0.20),
    "mean_ttft_ms": ("lower", 0.20),
    "median_ttft_ms": ("lower", 0.20),
    "p99_ttft_ms": ("lower", 0.30),
    "mean_itl_ms": ("lower", 0.10),
    "median_itl_ms": ("lower", 0.10),
    "p99_itl_ms": ("lower", 0.20),
    "kv_cache_peak": ("lower_abs", 0.05),
}
PERF_UNITS = {"total_token_throughput": " tokens/s", "output_throughput": " tokens/s",
              "request_throughput": " req/s"}


# A tolerance is a fraction of the baseline (KV cache: fraction points); 5 meant as 5% would
# pass everything, and half the baseline or more is no gate.
TOLERANCE_RANGE = (0.0, 0.5)


def _kind(value) -> str:
    """What a value is, in words (Ansible's templated values are tagged subclasses of the plain types)."""
    for kind, name in ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
                       (list, "a list")):
        if isinstance(value, kind):
            return name
    return "null" if value is None else type(value).__name__


def validate_performance_spec(baseline: dict | None, tolerances: dict | None, *, baseline_name: str = "baseline",
                              tolerances_name: str = "tolerances") -> None:
    """Unknown metric names would silently skip a check, a tolerance out of range passes
    everything: refuse them. The names are what the message calls the two mappings."""
    known = sorted(PERF_METRICS)
    low, high = TOLERANCE_RANGE
    for what, spec in ((baseline_name, {} if baseline is None else baseline),
                       (tolerances_name, {} if tolerances is None else tolerances)):
        if not isinstance(spec, dict):
            raise SoakConfigError(f"{what} must be a mapping of metric name to number, got {_kind(spec)} {spec!r}")
        for key, value in spec.items():
            if key not in PERF_METRICS:
                raise SoakConfigError(f"{what}: unknown metric {key!r}; known: {', '.join(known)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise SoakConfigError(f"{what}.{key} must be a number > 0, got {value!r}")
    for key, value in (tolerances or {}).items():
        if not low < value < high:
            raise SoakConfigError(f"{tolerances_name}.{key} is {value!r}: a tolerance is a fraction, "
                                  f"{low:g} < tolerance < {high:g} (0.05 for 5%)")
        if key not in (baseline or {}):
            raise SoakConfigError(f"{tolerances_name}.{key} has no {baseline_name}.{key} to apply to: add the "
                                  "baseline value or remove the tolerance")
    for key, value in (baseline or {}).items():
        if key == "kv_cache_peak" and value > 1:
            raise SoakConfigError(f"{baseline_name}.kv_cache_peak is a 0-1 fraction (vllm:kv_cache_usage_perc), "
                                  f"got {value}: write 0.55 for 55%")


def judge_performance(observed: dict, baseline: dict | None, tolerances: dict | None) -> dict:
    """Each baseline metric: observed vs baseline within tolerance -> passed."""
    metrics = {}
    for key, base in (baseline or {}).items():
        direction, default_tol = PERF_METRICS[key]
        tol = float((tolerances or {}).get(key, default_tol))
        if direction == "higher":
            limit, ok = base * (1 - tol), (lambda v, lim: v >= lim)
        elif direction == "lower":
            limit, ok = base * (1 + tol), (lambda v, lim: v <= lim)
        else:
            limit, ok = base + tol, (lambda v, lim: v <= lim)
        value = observed.get(key)
        entry = {"observed": value, "baseline": base, "tolerance": tol, "limit": round(limit, 6),
                 "direction": "at least" if direction == "higher" else "at most",
                 "passed": None if value is None else bool(ok(value, limit))}
        if value is not None and base:
            entry["change"] = round(value / base - 1, 4) if direction != "lower_abs" else round(value - base, 4)
        metrics[key] = entry
    judged = [m["passed"] for m in metrics.values()]
    return {"metrics": metrics, "passed": all(p is not False for p in judged),
            "unmeasured": sorted(k for k, m in metrics.items() if m["passed"] is None)}


def format_number(value: float) -> str:
    """12160.4 -> "12,160"; small figures keep three significant digits (41.3, 0.62)."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def performance_message(key: str, m: dict) -> str:
    """One judged metric in words, e.g. "total_token_throughput: 12,160 tokens/s is 6.9% below
    the baseline 13,060 (tolerance 5%)"; the KV cache in percent and points."""
    if key == "kv_cache_peak":
        points = (m["observed"] - m["baseline"]) * 100
        return (f"{key}: {m['observed'] * 100:.3g}% is {abs(points):.3g} points {'above' if points > 0 else 'below'} "
                f"the baseline {m['baseline'] * 100:.3g}% (tolerance {m['tolerance'] * 100:.3g} points)")
    change = (m["observed"] / m["baseline"] - 1) * 100
    return (f"{key}: {format_number(m['observed'])}{PERF_UNITS.get(key, ' ms')} is {abs(change):.1f}% "
            f"{'above' if change > 0 else 'below'} the baseline {format_number(m['baseline'])} "
            f"(tolerance {m['tolerance'] * 100:.3g}%)")


# --------------------------------------------------------------------------- statistics

def poisson_cdf(k: int, mu: float) -> float:
    """P(X <= k) for X ~ Poisson(mu), summed in log space."""
    if mu <= 0:
        return 1.0
    return min(1.0, sum(math.exp(-mu + i * math.log(mu) - math.lgamma(i + 1)) for i in range(k + 1)))


def poisson_upper_mean(k: int, confidence: float = 0.95) -> float:
    """The one-sided upper confidence bound of a Poisson mean after observing k events.

    Solves P(X <= k; mu) = 1 - confidence by bisection (the exact, "chi-square" bound
    chi2.ppf(confidence, 2k + 2) / 2, without scipy). k = 0 gives -ln(1 - confidence),
    2.996 at 95%: zero crashes in T minutes -> rate < 3/T per minute.
    """
    if not 0 < confidence < 1:
        raise SoakConfigError(f"confidence must be between 0 and 1, got {confidence}")
    if k < 0:
        raise ValueError("k must be >= 0")
    alpha = 1 - confidence
    if k == 0:
        return -math.log(alpha)
    lo, hi = 0.0, float(k + 10)
    while poisson_cdf(k, hi) > alpha:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if poisson_cdf(k, mid) > alpha:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * hi:
            break
    return (lo + hi) / 2


def crash_rate_upper(crashes: int, minutes: float, confidence: float = 0.95) -> float | None:
    """Upper bound on crashes per minute of load; None for a zero-length soak."""
    if minutes <= 0:
        return None
    return poisson_upper_mean(crashes, confidence) / minutes


def required_minutes(target_mtbf_hours: float, confidence: float = 0.95, crashes: int = 0) -> float:
    """Minutes of load with at most ``crashes`` crashes that show MTBF >= target at ``confidence``."""
    return poisson_upper_mean(crashes, confidence) * target_mtbf_hours * 60


def proof(crashes: int, minutes: float, confidence: float = 0.95, target_mtbf_hours: float | None = None,
          failure: str | None = None) -> dict:
    """What a soak of ``minutes`` with ``crashes`` crashes shows about the crash rate.

    ``failure``: why the soak failed. A failed soak proves nothing (a wedged engine does
    not crash, and minutes without load are no evidence): no statement, long_enough false,
    ``not_proved`` says why."""
    pct = f"{confidence * 100:g}%"
    rate = crash_rate_upper(crashes, minutes, confidence)
    mtbf_h = (1 / rate / 60) if rate else None
    out = {
        "confidence": confidence,
        "minutes": round(minutes, 3),
        "crashes": crashes,
        "crash_rate_upper_per_min": rate,
        "mtbf_lower_hours": mtbf_h,
        "target_mtbf_hours": target_mtbf_hours,
        "long_enough": None,
        "required_minutes": None,
        "remaining_minutes": None,
    }
    if rate is None:
        out["statement"] = "The soak ran for no time: it proves nothing about the crash rate."
    else:
        head = (f"Zero crashes in {minutes:.1f} min" if crashes == 0
                else f"{crashes} crash(es) in {minutes:.1f} min")
        out["statement"] = (f"{head} of load: the crash rate is below {rate:.4g}/min "
                            f"(MTBF above {mtbf_h:.3g} h) at {pct} confidence.")
    if failure:
        out.update(statement=None, crash_rate_upper_per_min=None, mtbf_lower_hours=None, long_enough=False,
                   not_proved=f"The soak failed ({failure}): it proves nothing about the crash rate.")
    if target_mtbf_hours:
        need = required_minutes(target_mtbf_hours, confidence, 0)
        out["required_minutes"] = math.ceil(need)
        out["remaining_minutes"] = max(0, math.ceil(need - minutes))
        out["long_enough"] = bool(crashes == 0 and minutes >= need and not failure)
        if failure:
            out["target_statement"] = (f"A failed soak cannot show MTBF >= {target_mtbf_hours:g} h; after the fix, "
                                       f"{out['required_minutes']} min without a crash or a wedge would at {pct}.")
        elif crashes:
            out["target_statement"] = (f"A soak that crashed cannot show MTBF >= {target_mtbf_hours:g} h; after the "
                                       f"fix, {out['required_minutes']} min without a crash would at {pct}.")
        elif out["long_enough"]:
            out["target_statement"] = (f"Long enough: {minutes:.1f} min without a crash shows MTBF >= "
                                       f"{target_mtbf_hours:g} h at {pct} (needs {out['required_minutes']} min).")
        else:
            out["target_statement"] = (f"Not long enough for MTBF >= {target_mtbf_hours:g} h at {pct}: that needs "
                                       f"{out['required_minutes']} min without a crash "
                                       f"({out['remaining_minutes']} min more than this soak).")
    return out
