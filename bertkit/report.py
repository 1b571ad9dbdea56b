"""`bertkit report RUN_DIR`: one self-contained HTML page for a pretraining run, a plan of them, a fine-tuning run or
a corpus.

Plots (matplotlib, embedded as PNG data URIs, so the page is one file that opens anywhere): losses and accuracies,
training and held-out; the learning-rate schedule; throughput and padding efficiency; for pretraining the instances'
statistics from their manifest (length histogram, masking shares, NotNext share); then the run's settings.
"""
import base64
import html
import io
import json
from pathlib import Path

from bertkit.formats import METRICS, RUN_CONFIG, FormatError, folder_kind, read_instances_manifest, read_run_config
from bertkit.runlog import read_metrics


class ReportError(FormatError):
    pass


GENERATOR = '<meta name="generator" content="bertkit report">'  # how a report knows its own earlier page


def _plt():
    try:
        import matplotlib
    except ImportError as e:
        raise ReportError("bertkit report draws with matplotlib: pip install 'bertkit[report]'") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    _plt().close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _series(records: list[dict], key: str):
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [p[0] for p in points], [p[1] for p in points]


def _line_plot(records, title, keys, ylabel=None, logy=False, level=None, marks=()):
    """A figure of the keys against steps, or None when no record has any of them; level = (value, label) draws a
    dashed horizontal line (the unigram baseline on the accuracy plot), marks = [(step, label)] vertical ones (a
    plan's phase boundaries)."""
    plt = _plt()
    drawn = [(k, *_series(records, k)) for k in keys]
    drawn = [d for d in drawn if d[1]]
    if not drawn:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for key, steps, values in drawn:
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3,
                label=key.replace("eval_", "held-out ").replace("_", " ").replace("$", r"\$"))  # text, not math
    if level is not None:
        ax.axhline(level[0], linestyle="--", color="grey", linewidth=1, label=level[1])
    for step, label in marks:
        ax.axvline(step, linestyle=":", color="grey", linewidth=1)
        ax.annotate(label, (step, 1), xycoords=("data", "axes fraction"), fontsize=7, va="top")
    ax.set(title=title, xlabel="step", ylabel=ylabel or "")
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return title, _png(fig)


def _instance_plots(manifest) -> list:
    plt = _plt()
    stats, figures = manifest.stats, []
    hist = stats.get("length_histogram")
    if hist and hist.get("counts"):
        fig, ax = plt.subplots(figsize=(7, 3.6))
        width = hist["bin_width"]
        ax.bar([i * width for i in range(len(hist["counts"]))], hist["counts"], width=width * 0.9, align="edge")
        ax.set(title="instance lengths (train)", xlabel="tokens", ylabel="instances")
        figures.append(("instance lengths", _png(fig)))
    shares = {k: stats[k] for k in ("mask_share", "random_share", "kept_share", "not_next_share") if k in stats}
    if shares:
        fig, ax = plt.subplots(figsize=(7, 3.0))
        ax.barh(list(shares), [100 * v for v in shares.values()])
        for y, v in enumerate(shares.values()):
            ax.text(100 * v, y, f" {100 * v:.1f}%", va="center")
        ax.set(title="masking and NotNext shares (train)", xlabel="%", xlim=(0, 100))
        figures.append(("masking and NotNext shares", _png(fig)))
    return figures


def _classes(run_dir: Path) -> tuple[list, list]:
    """(figures, sections) for the kept epoch's dev_classes.json, when the run wrote one: the confusion matrix drawn
    with its counts, and per-class precision, recall, F1 and support as a table. A file of another shape is said,
    not drawn (a folder from someone else is read, never trusted)."""
    path = run_dir / "dev_classes.json"
    if not path.is_file():
        return [], []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        labels, confusion, per_class = data["labels"], data["confusion"], data["per_class"]
        if len(confusion) != len(labels) or any(len(row) != len(labels) for row in confusion):
            raise ValueError("the matrix is not labels x labels")
        counts = [[int(v) for v in row] for row in confusion]
    except (ValueError, KeyError, TypeError):
        return [], [("per class", f"<p>{html.escape(str(path.name))}: not the shape bertkit writes; not drawn</p>")]
    plt = _plt()
    size = max(3.0, 0.6 * len(labels) + 1.5)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    image = ax.imshow(counts, cmap="Blues")
    for i, row in enumerate(counts):
        for j, v in enumerate(row):
            ax.text(j, i, str(v), ha="center", va="center", fontsize=8,
                    color="white" if v > 0.6 * max(map(max, counts)) else "black")
    names = [str(label).replace("$", r"\$") for label in labels]
    ax.set_xticks(range(len(labels)), names, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), names)
    ax.set(title="confusion matrix (kept epoch, scored set)", xlabel="predicted", ylabel="gold")
    fig.colorbar(image, ax=ax, fraction=0.046)
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th>" + "".join(
        f"<td>{v:.4f}</td>" if isinstance(v, float) else f"<td>{html.escape(str(v))}</td>"
        for v in (s.get("precision"), s.get("recall"), s.get("f1"), s.get("support"))) + "</tr>"
        for k, s in per_class.items() if isinstance(s, dict))
    table = f"<table><tr><th>class</th><th>precision</th><th>recall</th><th>F1</th><th>support</th></tr>{rows}</table>"
    return [("confusion matrix", _png(fig))], [("per class (kept epoch, scored set)", table)]


def _table(rows: dict) -> str:
    def cell(v):
        return html.escape(json.dumps(v) if isinstance(v, (dict, list)) else str(v))

    return "<table>" + "".join(f"<tr><th>{cell(k)}</th><td>{cell(v)}</td></tr>" for k, v in rows.items()) + "</table>"


def _page(title: str, figures: list, sections: list) -> str:
    images = "".join(f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{data}">'
                     f"<figcaption>{html.escape(name)}</figcaption></figure>" for name, data in figures)
    body = "".join(f"<h2>{html.escape(heading)}</h2>{content}" for heading, content in sections)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">{GENERATOR}<title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
figure {{ display: inline-block; margin: 0.5em; }} img {{ max-width: 100%; }}
table {{ border-collapse: collapse; font-size: 0.85em; }} th, td {{ border: 1px solid #ccc; padding: 2px 8px;
text-align: left; vertical-align: top; }} td {{ font-family: monospace; word-break: break-all; }}
</style></head>
<body><h1>{html.escape(title)}</h1>{images}{body}</body></html>
"""


def _notes(records: list[dict]) -> str:
    """What the run said once, as the log recorded it: the unigram plateau, rollbacks, settings a --resume changed."""
    items = []
    for r in records:
        if "plateau" in r:
            p = r["plateau"]
            items.append(f"step {r['step']}: held-out [MASK] accuracy was still at the unigram baseline "
                         f"({100 * p['baseline']:.1f} %, always guessing '{p['token']}'): the model had not left the "
                         "plateau (the log's note says what usually moves it)")
        if "rollback_to" in r:
            items.append(f"step {r['step']}: {r.get('rollback_reason')}; rolled back to step {r['rollback_to']}")
        if "resume_changes" in r:
            items.append(f"step {r['step']}: --resume changed " + ", ".join(
                f"{k} {v[0]} -> {v[1]}" for k, v in r["resume_changes"].items()))
    return "<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in items) + "</ul>" if items else ""


def pretrain_report(run_dir: Path) -> str:
    run = read_run_config(run_dir)
    records = read_metrics(run_dir)
    plateau = next((r["plateau"] for r in records if "plateau" in r), None)
    baseline = (plateau["baseline"], f"unigram baseline ({plateau['token']})") if plateau else None
    figures = [f for f in (
        # the second task is NSP, SOP or (ELECTRA) the discriminator's replaced-token detection
        _line_plot(records, "loss", [f"{split}{k}" for split in ("", "eval_") for k in (
            "loss", "mlm_loss", "nsp_loss", "sop_loss", "disc_loss")]),
        _line_plot(records, "accuracy", [f"{split}{k}" for split in ("", "eval_") for k in (
            "mlm_acc", "mlm_mask_acc", "nsp_acc", "sop_acc", "rtd_acc", "rtd_f1")], level=baseline),
        _line_plot(records, "learning rate", ["lr"]),
        _line_plot(records, "gradient norm", ["grad_norm"], logy=True),
        _line_plot(records, "throughput (sequences/s)", ["seq_per_s"]),
        _line_plot(records, "tokens/s", ["tokens_per_s"]),
        _line_plot(records, "MFU and padding efficiency", ["mfu", "padding_efficiency"]),
        _line_plot(records, "fp16 loss scale", ["loss_scale"], logy=True),
    ) if f]
    sections = [("notes", notes)] if (notes := _notes(records)) else []
    try:
        manifest = read_instances_manifest(run.instances)
        figures += _instance_plots(manifest)
        sections.append(("instances", _table({"folder": run.instances, "mode": manifest.mode,
                                              "max_seq_length": manifest.max_seq_length,
                                              "masked_lm_prob": manifest.masking.masked_lm_prob,
                                              **{k: v for k, v in manifest.stats.items()
                                                 if k not in ("length_histogram", "train_counts")}})))
    except FormatError as e:
        sections.append(("instances", f"<p>not available: {html.escape(str(e))}</p>"))
    last = records[-1] if records else {}
    sections += [("last record", _table(last)), ("settings", _table(run.pretrain)),
                 ("resolved DeepSpeed settings", _table(run.resolved)), ("model", _table(run.model)),
                 ("run", _table({"init_from": run.init_from, "world_size": run.world_size, "kernels": run.kernels,
                                 "vocab_size": run.vocab_size, "vocab_sha256": run.vocab_sha256}))]
    return _page(f"bertkit pretraining run: {run_dir.resolve().name}", figures, sections)


def _rows(rows: list[dict]) -> str:
    """A table with a column per key of the rows."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    cells = ["".join(f"<td>{html.escape(json.dumps(r[k]) if k in r else '')}</td>" for k in keys) for r in rows]
    return f"<table><tr>{head}</tr>" + "".join(f"<tr>{c}</tr>" for c in cells) + "</table>"


def plan_report(plan_dir: Path) -> str:
    """A `pretrain --plan` folder: its phases' curves on one step axis (each boundary marked), then each phase's
    steps, tokens, batch, length, masking, RoPE theta, reach and sources, and the plan as given."""
    record = json.loads((plan_dir / "plan.json").read_text(encoding="utf-8"))
    records, marks, rows, offset = [], [], [], 0
    for phase in record.get("phases", []):
        if Path(str(phase.get("folder"))).name != phase.get("folder"):   # a plan.json from elsewhere: below it only
            raise ReportError(f"{plan_dir / 'plan.json'}: phase folder {phase.get('folder')!r} is not a folder name")
        folder = plan_dir / phase["folder"]
        settings = read_run_config(folder).pretrain if (folder / RUN_CONFIG).is_file() else {}
        marks.append((offset, phase["name"]))
        records += [{**r, "step": r["step"] + offset} for r in read_metrics(folder) if "step" in r]
        rows.append({"phase": phase["name"], "first step": offset + 1, "steps": phase.get("step"),
                     "tokens": phase.get("tokens"), "sequences a step": phase.get("global_batch"),
                     "length": phase.get("max_seq_length"), "masked_lm_prob": settings.get("masked_lm_prob"),
                     "rope_theta": settings.get("rope_theta"),
                     "rope_theta_local": settings.get("rope_theta_local"),
                     "trains": ",".join(settings.get("train_only") or []) or "all", "optimizer state": (
                         "carried" if settings.get("init_optimizer") else "new"),
                     "done": phase.get("done"), "last checkpoint": Path(phase.get("checkpoint") or "").name})
        offset += phase.get("step") or 0
    figures = [f for f in (
        _line_plot(records, "loss (held-out at one fixed masking rate)", ["loss", "eval_loss"], marks=marks),
        _line_plot(records, "learning rate", ["lr"], marks=marks),
        _line_plot(records, "held-out per source", sorted({k for r in records for k in r
                                                           if k.startswith("eval_loss/")}), marks=marks),
    ) if f]
    sections = [("phases", _rows(rows))]
    for phase in record.get("phases", []):
        if phase.get("reach"):
            sections.append((f"{phase['name']}: how much reaches the new length", _rows(phase["reach"])))
        if phase.get("sources"):
            sections.append((f"{phase['name']}: tokens per source", _rows(phase["sources"])))
    sections += [("every phase's settings", _table(record.get("defaults", {}))),
                 ("the phases as planned", _rows(record.get("phases_planned", [])))]
    return _page(f"bertkit plan: {plan_dir.resolve().name}", figures, sections)


def finetune_report(run_dir: Path) -> str:
    summary = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    records = read_metrics(run_dir)
    epochs = summary.get("epochs", [])
    dev_keys = sorted({k for e in epochs for k, v in e.items()
                       if isinstance(v, (int, float)) and k not in ("epoch", "train_loss", "train_seconds")})
    figures = [f for f in (
        _line_plot(records, "training loss", ["loss"]),
        _line_plot(records, "held-out (dev) metrics", [f"eval_{k}" for k in dev_keys]),
        _line_plot(records, "learning rate", ["lr"]),
        _line_plot(records, "gradient norm", ["grad_norm"], logy=True),
        _line_plot(records, "throughput (sequences/s)", ["seq_per_s"]),
        _line_plot(records, "padding efficiency", ["padding_efficiency"]),
    ) if f]
    if not records and epochs:  # a run from before metrics.jsonl: per-epoch numbers only
        per_epoch = [{"step": e["epoch"], **e} for e in epochs]
        figures = [f for f in (_line_plot(per_epoch, "per epoch (x: epoch)", ["train_loss", *dev_keys]),) if f]
    class_figures, class_sections = _classes(run_dir)
    figures += class_figures
    sections = [("kept epoch", _table({"epoch": summary.get("best_epoch"), **summary.get("best", {})})),
                *class_sections,
                ("epochs", "".join(_table(e) for e in epochs)), ("settings", _table(summary.get("settings", {})))]
    return _page(f"bertkit fine-tuning run: {summary.get('task')} ({run_dir.resolve().name})", figures, sections)


def corpus_report(corpus_dir: Path) -> str:
    """A prepare-corpus folder: documents removed by reason, the near-duplicate cluster sizes, each quality step's
    counts, and the largest clusters' kept documents."""
    import numpy as np
    import pyarrow as pa

    from bertkit.formats import CorpusColumns as C, corpus_shards, read_corpus_manifest

    manifest = read_corpus_manifest(corpus_dir)
    plt, figures = _plt(), []
    removed = {k: v for k, v in manifest.dropped.items() if v}
    if removed:
        fig, ax = plt.subplots(figsize=(7, 0.4 * len(removed) + 1.2))
        ax.barh(list(removed), list(removed.values()))
        for y, v in enumerate(removed.values()):
            ax.text(v, y, f" {v:,}", va="center")
        ax.set(title=f"documents removed, by reason ({manifest.totals.get('documents', 0):,} kept)", xlabel="documents")
        figures.append(("documents removed by reason", _png(fig)))
    sections = [("totals", _table({k: v for k, v in manifest.totals.items() if not isinstance(v, dict)}))]
    sections += [(k.replace("_", " "), _table(manifest.totals[k]))
                 for k in ("near_dedup", "pii_found", "decontamination") if k in manifest.totals]
    if C.CLUSTER_SIZE in manifest.schema:
        rows = [(size, title, sentences[0] if sentences else "")
                for path in corpus_shards(corpus_dir) + corpus_shards(corpus_dir, "holdout")
                for size, title, sentences in zip(*(pa.ipc.open_file(str(path)).read_all().column(c).to_pylist()
                                                    for c in (C.CLUSTER_SIZE, C.TITLE, C.SENTENCES)))]
        sizes = np.array([r[0] for r in rows])
        fig, ax = plt.subplots(figsize=(7, 3.6))
        ax.hist(sizes, bins=np.arange(1, sizes.max() + 2) - 0.5 if sizes.max() < 50 else 50, log=True)
        ax.set(title="near-duplicate cluster sizes (kept documents)", xlabel="documents in the cluster", ylabel="kept")
        figures.append(("cluster sizes", _png(fig)))
        largest = sorted(rows, key=lambda r: (-r[0], str(r[1])))[:10]
        sections.append(("largest clusters (the kept document)", _table(
            {f"{size} ({title})": first[:200] for size, title, first in largest})))
    if any(s.split == "removed" for s in manifest.shards):
        removed = pa.concat_tables([pa.ipc.open_file(str(p)).read_all() for p in corpus_shards(corpus_dir, "removed")])
        sections.append(("removed documents, three of each reason (seeded)", _removed_examples(removed)))
        figures += _signal_plots(corpus_dir, removed, manifest.options.get("filters", "none"))
    sections.append(("options", _table(manifest.options)))
    return _page(f"bertkit corpus: {corpus_dir.resolve().name}", figures, sections)


def _removed_examples(removed) -> str:
    import random

    reasons = removed.column("reason").to_pylist()
    rows = {}
    for reason in sorted(set(reasons)):
        at = [i for i, r in enumerate(reasons) if r == reason]
        for i in random.Random(0).sample(at, min(3, len(at))):
            first = " ".join(removed.column("sentences")[i].as_py())[:200]
            rows[f"{reason} ({removed.column('title')[i].as_py() or removed.column('id')[i].as_py()})"] = first
    return _table(rows)


def _signal_plots(corpus_dir: Path, removed, preset: str) -> list:
    """A few quality signals over a seeded sample of kept and removed documents, the preset's Korean and English
    thresholds marked (what --filters judged by). The shards keep sentences, not lines: here a document's lines are
    its sentences, so the line signals are near what the filter saw, not equal."""
    import random

    import pyarrow as pa
    import pyarrow.compute as pc

    from bertkit.formats import corpus_shards
    from bertkit.pipelines.quality import PRESETS, batch_signals

    if preset not in PRESETS:
        return []
    kept = pa.concat_tables([pa.ipc.open_file(str(p)).read_all() for p in corpus_shards(corpus_dir)])
    sample = {"kept": kept, "removed": removed.filter(pc.starts_with(removed.column("reason"), "quality_"))}
    found = {}
    for name, table in sample.items():
        rows = random.Random(0).sample(range(len(table)), min(300, len(table)))
        texts = ["\n".join(table.column("sentences")[i].as_py()) for i in rows]
        found[name] = batch_signals([t.split("\n") for t in texts])
    plt, figures = _plt(), []
    for signal in ("words", "mean_word_length", "alpha_words", "stop_words", "dup_line_frac", "line_punct"):
        fig, ax = plt.subplots(figsize=(6, 3.2))
        for name, values in found.items():
            if values:
                ax.hist([v[signal] for v in values], bins=30, alpha=0.6, label=name)
        for lang, style in (("ko", "--"), ("en", ":")):
            for bound in PRESETS[preset][lang].get(signal, (None, None)):
                if bound is not None:
                    ax.axvline(bound, color="black", linestyle=style, linewidth=1, label=f"{preset} {lang}")
        ax.set(title=f"{signal} (a seeded sample)", yscale="log")
        ax.legend(fontsize=7)
        figures.append((signal, _png(fig)))
    return figures


def report(run_dir, out=None) -> Path:
    """Write the page (default RUN_DIR/report.html); returns its path."""
    run_dir = Path(run_dir)
    if (run_dir / RUN_CONFIG).is_file() and (run_dir / METRICS).is_file() and not (run_dir / "metrics.json").is_file():
        page = pretrain_report(run_dir)
    elif (run_dir / "metrics.json").is_file():
        page = finetune_report(run_dir)
    elif (run_dir / "plan.json").is_file():
        page = plan_report(run_dir)
    elif folder_kind(run_dir) == "prepare-corpus":
        page = corpus_report(run_dir)
    else:
        raise ReportError(f"{run_dir}: neither a pretraining run (config.json + metrics.jsonl), a plan (plan.json), a "
                          "fine-tuning run (metrics.json) nor a corpus (prepare-corpus); pass the folder given as "
                          "--out to one")
    from bertkit.fileio import atomic_write_bytes, disk_errors

    out = Path(out) if out else run_dir / "report.html"
    if out.exists() and (not out.is_file() or GENERATOR.encode() not in out.read_bytes()[:2048]):
        raise ReportError(f"{out}: exists and is not a page bertkit report wrote; choose another --out (a report "
                          "replaces only an earlier report)")
    with disk_errors(out.parent, "free space, then run the same report again"):
        atomic_write_bytes(out, page.encode("utf-8"))
    return out
