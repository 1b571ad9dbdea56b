"""Whether two arms differ, from runs over seeds: a seed-paired difference and its 95 % t-interval, and no verdict at
all below MIN_SEEDS paired seeds (one seed's difference reads as real whatever its size; with two the interval spans
about 25 of its own widths). Each seed pairs the two arms' runs that share it (the same data order and head)."""
import math

MIN_SEEDS = 3


def paired_verdict(first: dict, second: dict, level: float = 0.95) -> dict:
    """first, second: {seed: score}. {"seeds": n paired, "difference": mean of second - first over them, "interval":
    [low, high] or None, "verdict": "second higher" | "first higher" | "no difference shown" | "no verdict", "test":
    what was done, in words}."""
    from scipy.stats import t

    shared = sorted(set(first) & set(second))
    diffs = [second[s] - first[s] for s in shared]
    n = len(diffs)
    mean = sum(diffs) / n if n else float("nan")
    if n < MIN_SEEDS:
        seeds = ",".join(str(s) for s in range(MIN_SEEDS))
        return {"seeds": n, "difference": mean, "interval": None, "verdict": "no verdict",
                "test": f"{n} paired seed(s): no verdict below {MIN_SEEDS}; run both with --seeds {seeds}"}
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    low, high = mean - half, mean + half
    verdict = "second higher" if low > 0 else "first higher" if high < 0 else "no difference shown"
    return {"seeds": n, "difference": mean, "interval": [low, high], "verdict": verdict,
            "test": f"seed-paired difference, {round(100 * level)} % t-interval over {n} seeds"}
