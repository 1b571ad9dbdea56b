"""What `bertkit finetune korean` and `finetune compare` print: the tasks' scores, a sweep's rates x seeds, and two
sweeps side by side (each at its best rate); and the reading of a sweep's folder for the comparison."""
from pathlib import Path

from bertkit.errors import DataError
from bertkit.fileio import read_json_or_none

# what the summary table shows of each task's kept epoch (every score stays in its metrics.json)
KOREAN_COLUMNS = {"nsmc": ("accuracy",), "klue-nli": ("accuracy",), "kornli": ("accuracy",),
                  "korsts": ("pearson", "spearman"), "klue-sts": ("pearson", "spearman", "f1"),
                  "klue-ner": ("entity_macro_f1", "char_macro_f1"), "korquad": ("exact_match", "f1")}


def korean_table(summary: dict) -> str:
    lines = [f"{'task':<9} {'kept epoch':>10}  scores"]
    for task, row in summary.items():
        scores = "  ".join(f"{k} {row[k]:.4f}" for k in KOREAN_COLUMNS[task] if k in row)
        lines.append(f"{task:<9} {str(row.get('best_epoch')):>10}  {scores}")
    return "\n".join(lines)


def sweep_table(summary: dict) -> str:
    lines = [f"{'task':<9} {'metric':<16} {'rate':>7}  {'mean':>8}  {'min .. max':>17}  seeds"]
    for task, row in summary.items():
        on = row.get("rate_chosen_on", "scored set")
        for rate, r in row["rates"].items():
            best = "" if rate != row["best_rate"] or on == "one rate run" else f"  <- best (chosen on the {on})"
            lines.append(f"{task:<9} {row['metric']:<16} {rate:>7}  {r['mean']:8.4f}  {r['min']:8.4f} .. "
                         f"{r['max']:<8.4f} {','.join(map(str, r['seeds']))}{best}")
    if any(row.get("rate_chosen_on", "scored set") == "scored set" for row in summary.values()):
        lines.append("a rate chosen on the scored set flatters it (a maximum over noisy means); --select validation "
                     "chooses it on held-out training rows instead")
    return "\n".join(lines)


def read_sweep(folder) -> dict:
    """The tasks of a sweep's folder (`finetune korean --lrs ... --seeds ...`); DataError for any other folder."""
    manifest = read_json_or_none(Path(folder) / "manifest.json")
    if not (isinstance(manifest, dict) and manifest.get("stage") == "finetune-korean"
            and (manifest.get("settings") or {}).get("sweep")):
        raise DataError(f"{folder}: not a sweep's folder (made by `bertkit finetune korean --lrs ... --seeds ...`, "
                        "holding its manifest.json)")
    return manifest["tasks"]


def comparison_table(first: str, second: str, rows: list[dict]) -> str:
    """compare_sweeps' rows: each sweep's mean (min .. max, best rate), the difference, and the verdict of a
    seed-paired test (none below 3 seeds: one seed's difference reads as real whatever its size)."""
    def shown(s):
        return f"{s['mean']:.4f} ({s['min']:.4f} .. {s['max']:.4f}, lr {s['rate']})"

    def verdict(r):
        if r["interval"] is None:
            return f"no verdict ({r['paired_seeds']} paired seed(s); 3 needed)"
        low, high = r["interval"]
        return f"{r['verdict']} (95 % CI {low:+.4f} .. {high:+.4f}, {r['paired_seeds']} seeds)"

    head = "first: mean (min .. max, best rate)"
    lines = [f"first: {first}", f"second: {second}",
             f"{'task':<9} {'metric':<16} {head:>40}  {'second: the same':>40}  {'second - first':>14}  verdict"]
    for r in rows:
        lines.append(f"{r['task']:<9} {r['metric']:<16} {shown(r['first']):>40}  {shown(r['second']):>40}  "
                     f"{r['difference']:+14.4f}  {verdict(r)}")
    lines.append("verdict: the seed-paired difference at each side's best rate and its 95 % t-interval")
    if any("scored set" in r["rate_chosen_on"] for r in rows):
        lines.append("a rate chosen on the scored set flatters its side (sweep with --select validation to choose "
                     "it on held-out training rows)")
    if any(r["interval"] is None for r in rows):
        lines.append("no verdict below 3 seeds run by both: run both sweeps with --seeds 0,1,2")
    return "\n".join(lines)
