"""The benchmarks' own logic: the transfer benchmarks' tables (benchmarks/lib/transfer.py and korean_tables.py,
read by pretrain_transfer.py and korean_transfer.py: which rate is each start's best, when the seed-paired verdict
shows two starts apart; checked against sums done by hand), the runs they record while under way, and the GPU-only
scripts on a machine without a GPU."""
from pathlib import Path

import pytest


@pytest.fixture
def transfer():
    import pretrain_transfer

    return pretrain_transfer


def test_best_rate_is_the_best_mean_over_seeds_and_every_rate_is_reported(transfer):
    best = transfer.best_rate({"1e-4": {0: 0.5, 1: 0.7, 2: 0.6}, "3e-4": {0: 0.55, 1: 0.65, 2: 0.66}})
    assert best["lr"] == 3e-4 and best["mean"] == pytest.approx(0.62)
    assert best["rates"]["1e-4"]["mean"] == pytest.approx(0.6) and best["rates"]["1e-4"]["sd"] == pytest.approx(0.1)


def test_best_rate_chooses_on_the_seeds_every_rate_ran(transfer):
    # 5e-5 ran three seeds (mean 0.284); 1e-4 one lucky seed 0 (0.30) that 5e-5's seed 0 (0.333) beats
    best = transfer.best_rate({"5e-5": {0: 0.333, 1: 0.100, 2: 0.420}, "1e-4": {0: 0.30}})
    assert best["lr"] == 5e-5 and best["mean"] == pytest.approx(0.853 / 3)
    # no seed in common: each rate's own mean
    assert transfer.best_rate({"5e-5": {0: 0.2}, "1e-4": {1: 0.3}})["lr"] == 1e-4


def test_sweep_table_differences_and_seed_paired_verdicts(transfer):
    sweep = {"sst2": {"random": {"1e-4": {0: 0.80, 1: 0.82, 2: 0.81}},
                      "pretrained": {"1e-4": {0: 0.83, 1: 0.86, 2: 0.84}}},
             "stsb": {"random": {"1e-4": {0: 0.10, 1: 0.30, 2: 0.20}},
                      "pretrained": {"1e-4": {0: 0.25, 1: 0.40, 2: 0.10}}},
             "mrpc": {"random": {"1e-4": {0: 0.60}}, "pretrained": {"1e-4": {0: 0.90}}}}
    rows = {r["task"]: r for r in transfer.sweep_table(sweep)}
    # paired differences .03, .04, .03: mean .0333, sd .00577, t(.975, 2) = 4.303, half-width .0143 > 0 by hand
    assert rows["sst2"]["difference"] == pytest.approx(0.1 / 3) and rows["sst2"]["shown"]
    # .15, .10, -.10: mean .05, sd .132, half-width .328: no difference shown although the mean is ahead
    assert rows["stsb"]["difference"] == pytest.approx(0.05) and not rows["stsb"]["shown"]
    assert not rows["mrpc"]["shown"]   # one seed: no verdict, however far apart (the old "apart" said yes)


def test_korean_starts_compare_at_the_rates_both_ran_in_full(transfer):
    import korean_tables

    three = lambda a, b, c: {"0": a, "1": b, "2": c}  # noqa: E731
    sweep = {"nsmc": {"modernbert-2h": {"1e-4": three(0.70, 0.71, 0.72), "3e-4": three(0.80, 0.79, 0.81),
                                        "1e-3": three(0.78, 0.79, 0.80)},
                      "modernbert-4h": {"3e-4": {"0": 0.90, "1": 0.91}, "1e-3": three(0.81, 0.82, 0.83)}},
             "korsts": {"modernbert-2h": {"1e-3": three(0.20, 0.25, 0.30)},
                        "modernbert-4h": {"1e-3": three(0.28, 0.22, 0.36)}},
             "klue-nli": {"modernbert-2h": {"1e-3": three(0.4, 0.4, 0.4)}}}  # one start only: no row
    tables = korean_tables.vocab_tables(sweep, korean_tables.BUDGET_STARTS)
    assert list(tables) == ["modernbert"]
    rows = {r["task"]: r for r in tables["modernbert"]}
    assert set(rows) == {"nsmc", "korsts"}
    # 4h's 3e-4 has two seeds: both sides are read at 1e-3 alone (2h's 3e-4 is not compared with it)
    assert rows["nsmc"]["rates"] == [1e-3]
    two, four = rows["nsmc"]["arms"]["modernbert-2h"], rows["nsmc"]["arms"]["modernbert-4h"]
    assert (two["mean"], four["mean"]) == (pytest.approx(0.79), pytest.approx(0.82)) and four["shown"]
    assert not rows["korsts"]["arms"]["modernbert-4h"]["shown"]  # paired differences .08, -.03, .06


KORSTS_ROWS = [("가나 다", "가나", 4.0), ("가나 라", "라", 1.0), ("다", "다", 5.0)]


@pytest.fixture
def korsts_folder(tmp_path):
    """A KorSTS folder as published (genre, filename, year, id, score, sentence1, sentence2), three pairs."""
    folder = tmp_path / "data" / "kornlu" / "KorSTS"
    folder.mkdir(parents=True)
    lines = ["genre\tfilename\tyear\tid\tscore\tsentence1\tsentence2"]
    lines += [f"main-captions\tMSRvid\t2012test\t{i:04d}\t{s:.3f}\t{a}\t{b}" for i, (a, b, s) in enumerate(KORSTS_ROWS)]
    for name in ("sts-train.tsv", "sts-dev.tsv"):
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return tmp_path / "data"


def test_korsts_overlap_floor_correlates_character_overlap_without_spaces(transfer, korsts_folder):
    import korean_tables

    # overlaps 2/3, 1/3, 1 (a space counted would make the first 2/4) against 4, 1, 5: r = 12 / sqrt(156), by hand
    floor = korean_tables.overlap_floor(korsts_folder)
    assert floor["train"] == floor["dev"] == pytest.approx(12 / 156 ** 0.5)


def test_input_lengths_counts_tokens_cut_and_unknown(transfer, korsts_folder, tmp_path, monkeypatch):
    import korean_tables

    import bertkit.testing

    monkeypatch.setattr(bertkit.testing, "minilm_dir", lambda: tmp_path / "no-reference")  # the plain vocabulary only
    tokenizer = tmp_path / "work" / "ko-tokenizer"
    tokenizer.mkdir(parents=True)
    (tokenizer / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "가나", "다"]) + "\n")
    (tokenizer / "tokenizer_config.json").write_text('{"do_lower_case": false, "strip_accents": false}')
    # [CLS] 가나 다 [SEP] 가나 [SEP]: 6 tokens; [CLS] 가나 [UNK] [SEP] [UNK] [SEP]: 6, a third unknown;
    # [CLS] 다 [SEP] 다 [SEP]: 5
    out = korean_tables.input_lengths(tmp_path / "work", max_seq_length=5, data_dir=korsts_folder, tasks=("korsts",))
    assert out == {"plain": {"korsts": {"median_tokens": 6.0, "share_over_5": round(2 / 3, 4),
                                        "unk_share": round(1 / 9, 4)}}}


def test_korean_budgets_against_hours_scale_f1_and_need_whole_sweeps(transfer):
    import korean_tables

    nine = lambda a, b, c: {lr: {"0": a, "1": b, "2": c} for lr in ("1e-4", "3e-4", "1e-3")}  # noqa: E731
    sweep = {"klue-ner": {"modernbert-random": nine(30.0, 31.0, 32.0), "modernbert-2h": nine(40.0, 41.0, 42.0),
                          "modernbert-4h": nine(31.5, 41.0, 45.0)},
             "nsmc": {"modernbert-random": nine(0.70, 0.71, 0.72), "modernbert-2h": nine(0.80, 0.80, 0.80),
                      "modernbert-4h": {"1e-3": {"0": 0.9}}}}  # one cell of nine: not on the figure yet
    rows = korean_tables.by_hours(korean_tables.table(sweep), "modernbert")
    assert [r["hours"] for r in rows] == [2.0, 4.0]
    assert rows[0]["tasks"]["klue-ner"] == {"difference": pytest.approx(0.10), "shown": True}  # F1 points / 100
    assert rows[0]["tasks"]["nsmc"] == {"difference": pytest.approx(0.09), "shown": True}
    assert rows[1]["tasks"] == {"klue-ner": {"difference": pytest.approx(0.245 / 3), "shown": False}}  # 39.17 - 31


def test_runs_under_way_are_recorded_until_their_run_is(transfer, tmp_path):
    """A pretraining spanning sessions: its held-out curve so far is recorded (the resumed run's later line for a
    step wins); a run already in `runs`, or exported, or with nothing logged is not under way."""
    import json

    import korean_transfer

    def run(name, lines, max_steps=100):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"pretrain": {"max_steps": max_steps}}))
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        return folder

    run("ko-run-4h", [{"step": 10, "loss": 5.0}, {"step": 20, "eval_mlm_loss": 4.0, "elapsed_s": 9.0},
                      {"step": 25, "loss": 4.1}, {"step": 20, "eval_mlm_loss": 3.9, "elapsed_s": 8.0},  # resumed
                      {"step": 30, "loss": 3.8}], max_steps=64)
    run("ko-modernbert-run-4h", [{"step": 40, "eval_mlm_loss": 3.0}])
    (tmp_path / "ko-modernbert-run-4h-export").mkdir()
    (tmp_path / "ko-modernbert-run-4h-export" / "model.safetensors").write_bytes(b"")
    run("ko-run-2h", [{"step": 5, "loss": 6.0}])
    run("ko-modernbert-mecab-run-2h", [{"step": 7, "loss": 6.0}])
    out = korean_transfer.runs_under_way(tmp_path, {"2h": {}})
    assert set(out) == {"4h", "modernbert-mecab-2h"}
    assert out["4h"]["step"] == 30 and out["4h"]["of_steps"] == 64
    assert out["4h"]["curve"] == [{"step": 20, "eval_mlm_loss": 3.9, "elapsed_s": 8.0}]
    assert out["modernbert-mecab-2h"]["curve"] == []
    results = {"runs": {"2h": {}, "4h": {}}, "partial_runs": {"4h": out["4h"], "modernbert-mecab-2h": {}}}
    korean_transfer.drop_finished_runs(results)  # the 4-hour run finished: its curve so far goes
    assert results["partial_runs"] == {"modernbert-mecab-2h": {}}
    results["runs"]["modernbert-mecab-2h"] = {}
    korean_transfer.drop_finished_runs(results)
    assert "partial_runs" not in results


def test_a_rerun_never_replaces_the_recorded_run():
    """The recorded run made the recorded scores: a second run of the same name (a fresh work folder) goes beside it
    under `reruns`, once however often it is recorded; the same run recorded again changes nothing."""
    import korean_transfer

    first = {"steps": 10, "curve": [{"step": 10, "eval_mlm_loss": 3.2, "elapsed_s": 100.0}]}
    again = {"steps": 10, "curve": [{"step": 10, "eval_mlm_loss": 3.3, "elapsed_s": 90.0}]}
    results = {"runs": {}}
    korean_transfer.record_run(results, "modernbert-2h", first)
    korean_transfer.record_run(results, "modernbert-2h", dict(first))
    assert results == {"runs": {"modernbert-2h": first}}
    korean_transfer.record_run(results, "modernbert-2h", again)
    korean_transfer.record_run(results, "modernbert-2h", again)
    assert results["runs"] == {"modernbert-2h": first}
    [rerun] = results["reruns"]["modernbert-2h"]
    assert {k: v for k, v in rerun.items() if k != "recorded"} == again and rerun["recorded"].endswith("UTC")


@pytest.mark.parametrize("script", ["attention", "attention_tiles", "layer_norm", "modernbert_attention",
                                    "host_overhead", "triton_launch", "gpu_compile_check"])
def test_gpu_only_benchmarks_say_so_on_a_machine_without_one(script, tmp_path):
    """`make bench` on a laptop, or a lease's step run by mistake on the CPU: a sentence and exit 0, no traceback
    and no result file claiming a measurement."""
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the script would measure")
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / f"{script}.json"
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "gates" / f"{script}.py"), "--out", str(out)],
    cwd=tmp_path,                    capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert f"benchmarks/gates/{script}.py needs a CUDA GPU" in r.stderr and not out.exists()


def test_a_study_stops_rather_than_score_a_run_cut_short(tmp_path):
    """pretrain() saves and returns when a signal stops it; a study that exported then would score a model of 14
    steps as one of 300 (vocab_extension did, 2026-12-02): benchlib stops it, naming the run and the way on."""
    from benchlib import trained_to_the_end

    with pytest.raises(SystemExit, match="run-minilm-0 stopped at step 14 of 300; run the study again to resume"):
        trained_to_the_end({"step": 14}, 300, tmp_path / "run-minilm-0")
    trained_to_the_end({"step": 300}, 300, tmp_path / "run-minilm-0")   # finished: on to the export
