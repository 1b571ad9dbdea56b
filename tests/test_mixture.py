"""pretrain --mixture: several instance folders in set proportions. The shares counted from the batches the sampler
deals (every rank's), each epoch's exact; an up-weighted folder repeats in a new order, a down-weighted one shows
other rows each epoch; the run's mixture.json against the rows its batches held; a resume draws the same batches;
folders that cannot be mixed are refused naming the difference."""
import json
import shutil
import signal

import numpy as np
import pytest

from bertkit.data import EpochBatches
from bertkit.mixture import Mixture, apportion, parse_mixture, weights_for
from bertkit.pretrain import ConfigError, PretrainConfig, pretrain
from bertkit.testing import make_instances_dir
from tests.helpers import TINY


class Rows:
    """A stand-in dataset: row i of source `name` reads as (name, pass, i)."""

    def __init__(self, name: str, n: int, length: int = 5):
        self.name, self.n, self.length, self.dir = name, n, length, name
        self.manifest, self.dynamic = None, True

    def __len__(self):
        return self.n

    def __getitem__(self, key):
        return (self.name, *key)

    def lengths(self):
        return np.full(self.n, self.length)


def test_apportion_and_temperature():
    assert apportion(np.array([0.7, 0.3]), 10).tolist() == [7, 3]
    assert apportion(np.array([1, 1, 1]) / 3, 100).tolist() == [34, 33, 33]   # sums to the total; ties to the first
    assert weights_for([100, 100], [3.0, 1.0], None).tolist() == [0.75, 0.25]
    assert weights_for([900, 100], [None, None], 1.0) == pytest.approx([0.9, 0.1])
    assert weights_for([900, 100], [None, None], 0.5) == pytest.approx([30 / 40, 10 / 40])   # sqrt(900), sqrt(100)
    assert weights_for([900, 100], [None, None], 0.0) == pytest.approx([0.5, 0.5])
    for bad, message in ((["a=0.7"], "at least two"), (["a=0.7", "b"], "every folder or to none"),
                         (["a=x", "b=1"], "not a number"), (["a=0", "b=1"], "above 0"), (["a=1", "a=2"], "twice")):
        with pytest.raises(ValueError, match=message):
            parse_mixture(bad)


def test_every_epoch_holds_each_source_in_its_share():
    """A folder of 300 rows at 0.25 and one of 20 at 0.75: 80 and 240 slots an epoch. The small one is read 12 times
    an epoch, each row equally often, in a new order each pass; the large one shows rows it had not shown before."""
    mixture = Mixture([Rows("big", 300), Rows("small", 20)], np.array([0.25, 0.75]), seed=3)
    assert len(mixture) == 320 and mixture.slots.tolist() == [80, 240]
    seen_big = []
    for epoch in range(3):
        rows = [mixture[(epoch, slot)] for slot in range(len(mixture))]
        small = [r for r in rows if r[0] == "small"]
        assert len(small) == 240 and sum(r[0] == "big" for r in rows) == 80
        assert np.bincount([r[2] for r in small], minlength=20).tolist() == [12] * 20
        seen_big.append({r[2] for r in rows if r[0] == "big"})
        passes = [[r[2] for r in small if r[1] == p] for p in sorted({r[1] for r in small})]
        assert all(sorted(p) == list(range(20)) for p in passes) and passes[0] != passes[1]
    assert not seen_big[0] & seen_big[1] and len(seen_big[0] | seen_big[1] | seen_big[2]) == 240


def test_a_micro_batch_s_rows_found_together_are_those_found_one_by_one():
    """Mixture.rows (what the loader reads a micro batch with) against finding each key's source and row alone,
    over keys of three epochs in any order, some with a scheduled rate."""
    mixture = Mixture([Rows("big", 300), Rows("small", 20)], np.array([0.25, 0.75]), seed=3)
    rng = np.random.default_rng(0)
    keys = [(int(e), int(s), *([0.2] if i % 3 == 0 else []))
            for i, (e, s) in enumerate(zip(rng.integers(0, 3, 64), rng.integers(0, 320, 64)))]
    alone = []
    for epoch, slot, *rate in keys:
        source, passes, row = (int(x[0]) for x in mixture.rows_of(epoch, [slot]))
        alone.append(mixture.datasets[source][(passes, row, *rate)])
    assert mixture.rows(keys) == alone and mixture[keys[0]] == alone[0]
    with pytest.raises(IndexError, match="slot 320 out of range"):
        mixture.rows([(0, 5), (1, 320)])


@pytest.mark.parametrize("world", [1, 2])
def test_realised_counts_what_every_rank_drew(world):
    """Mixture.realised against the rows every rank's micro batches held, counted one by one."""
    mixture = Mixture([Rows("a", 70, 4), Rows("b", 50, 9)], np.array([0.7, 0.3]), seed=1)
    counts, tokens = {"a": 0, "b": 0}, {"a": 0, "b": 0}
    drawn = 23   # micro batches per rank: more than one epoch's
    for rank in range(world):
        batches = iter(EpochBatches(len(mixture), 4, seed=5, rank=rank, world_size=world))
        for _ in range(drawn):
            for key in next(batches):
                name = mixture[key][0]
                counts[name] += 1
                tokens[name] += 4 if name == "a" else 9
    found = mixture.realised(EpochBatches(len(mixture), 4, seed=5, rank=0, world_size=world), drawn)
    assert found == {"rows": [counts["a"], counts["b"]], "tokens": [tokens["a"], tokens["b"]]}
    assert found["rows"][0] / sum(found["rows"]) == pytest.approx(0.7, abs=0.05)


def test_the_held_out_splits_are_read_in_turn():
    from bertkit.mixture import Joined

    joined = Joined([Rows("a", 3), Rows("b", 1), Rows("c", 2)])
    assert [joined[(0, i)] for i in range(len(joined))] == [("a", 0, 0), ("b", 0, 0), ("c", 0, 0), ("a", 0, 1),
                                                            ("c", 0, 1), ("a", 0, 2)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture")
    make_instances_dir(root / "ko", n=96, holdout=8, max_len=32, seed=0)
    make_instances_dir(root / "en", n=40, holdout=8, max_len=32, seed=1)
    make_instances_dir(root / "long", n=40, holdout=8, max_len=48, seed=2)
    (root / "model.json").write_text(json.dumps(TINY))
    return root


def mixed(root, out, **config):
    args = dict(instances="instances", out=str(out), model=str(root / "model.json"), max_steps=6, micro_batch=8,
                optimizer="adamw", num_workers=0, eval_every=3, eval_batches=1, save_every=3, log_every=1,
                progress=False, report_to="none", mixture=(f"{root / 'ko'}=0.7", f"{root / 'en'}=0.3"))
    return pretrain(PretrainConfig(**{**args, **config}))


def test_a_mixed_run_records_its_shares_and_resumes_to_the_same_losses(folders, tmp_path, clean_dist_env,
                                                                       monkeypatch):
    result = mixed(folders, tmp_path / "whole")
    recorded = json.loads((tmp_path / "whole" / "mixture.json").read_text())
    assert result["mixture"] == recorded and recorded["step"] == 6
    ko, en = recorded["sources"]
    assert ko["folder"] == str((folders / "ko").resolve()) and ko["target"] == 0.7 and en["target"] == 0.3
    assert ko["rows"] + en["rows"] == 6 * 8   # every row of the 6 micro batches
    assert ko["slots_per_epoch"] == 95 and en["slots_per_epoch"] == 41   # 0.7 and 0.3 of 136
    evals = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if "eval_loss" in r]
    assert len(evals) == 2 and all({"eval_loss/ko", "eval_loss/en", "eval_mlm_acc/ko", "eval_mlm_acc/en"} <= set(r)
                                   and r["eval_loss/ko"] != r["eval_loss/en"] for r in evals)   # each folder's own
    config = json.loads((tmp_path / "whole" / "config.json").read_text())
    assert config["pretrain"]["mixture"] == [f"{(folders / 'ko').resolve()}=0.7", f"{(folders / 'en').resolve()}=0.3"]
    from bertkit.pretrain import train as loop

    real_step = loop.train_step

    def stopped_after_three(run):   # as a SIGTERM would: the run saves at step 3 and stops
        if run.step == 2:
            run.stop.signal = signal.SIGTERM
        return real_step(run)

    monkeypatch.setattr(loop, "train_step", stopped_after_three)
    assert mixed(folders, tmp_path / "halves")["step"] == 3
    monkeypatch.setattr(loop, "train_step", real_step)
    mixed(folders, tmp_path / "halves", resume=True, mixture=())   # the run's own mixture, from its config.json

    def losses(run):
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in records if "loss" in r], [r["eval_loss"] for r in records if "eval_loss" in r]

    assert losses(tmp_path / "halves") == losses(tmp_path / "whole")
    with pytest.raises(ConfigError, match="mixture"):   # another mixture would change the data order
        mixed(folders, tmp_path / "halves", resume=True, max_steps=9,
              mixture=(f"{folders / 'ko'}=0.5", f"{folders / 'en'}=0.5"))


def test_folders_that_cannot_be_mixed_are_refused(folders, tmp_path, clean_dist_env):
    with pytest.raises(ConfigError, match="another max_seq_length"):
        mixed(folders, tmp_path / "a", mixture=(str(folders / "ko"), str(folders / "long")))
    with pytest.raises(ConfigError, match="--token-budget"):
        mixed(folders, tmp_path / "b", token_budget=64, unpadded=True)
    with pytest.raises(ConfigError, match="--mixture-temperature goes with"):
        mixed(folders, tmp_path / "c", mixture=(), instances=str(folders / "ko"), mixture_temperature=0.5)


def test_masked_lm_prob_masks_training_at_its_rate_and_leaves_the_held_out_as_made(folders, tmp_path,
                                                                                      clean_dist_env):
    """--masked-lm-prob 0.3 (ModernBERT's): every training row of every folder masks round(0.3 n) of its n tokens
    (BERT's count rule), the held-out rows keep the instances' 0.15, so held-out curves compare; a run records it;
    static instances are refused."""
    from bertkit.formats import read_instances_manifest
    from bertkit.pretrain.run import training_data

    def counts(dataset):
        return [(len(r["input_ids"]), len(r["mlm_positions"])) for r in (dataset[(0, i)] for i in range(len(dataset)))]

    for mixture in ((), (f"{folders / 'ko'}=0.7", f"{folders / 'en'}=0.3")):
        cfg = PretrainConfig(instances=str(folders / "ko"), out=str(tmp_path / "r"), masked_lm_prob=0.3,
                             mixture=mixture)
        train, holdout = training_data(cfg, read_instances_manifest(folders / "ko"))
        assert all(k == min(10, max(1, round(n * 0.3))) for n, k in counts(train))
        assert all(k == min(10, max(1, round(n * 0.15))) for n, k in counts(holdout))
    result = mixed(folders, tmp_path / "run", masked_lm_prob=0.3, max_steps=2)
    assert result["step"] == 2 and json.loads((tmp_path / "run" / "config.json").read_text())["pretrain"][
        "masked_lm_prob"] == 0.3
    make_instances_dir(tmp_path / "static", n=40, holdout=8, max_len=32, mode="static")
    with pytest.raises(ConfigError, match="--masked-lm-prob: .*static instances"):
        mixed(folders, tmp_path / "s", mixture=(), instances=str(tmp_path / "static"), masked_lm_prob=0.3)


def test_the_command_line_mixture_by_temperature(folders, tmp_path, clean_dist_env):
    """`--mixture ko,en --mixture-temperature 0.5`: each folder by the square root of its rows (96 and 40)."""
    from click.testing import CliRunner

    from bertkit.cli import main

    out = tmp_path / "cli"
    r = CliRunner().invoke(main, [
        "pretrain", "--mixture", f"{folders / 'ko'},{folders / 'en'}", "--mixture-temperature", "0.5", "--model",
        str(folders / "model.json"), "--out", str(out), "--max-steps", "2", "--micro-batch", "8", "--save-every", "2",
        "--eval-every", "0", "--num-workers", "0", "--report-to", "none", "--no-progress"])
    assert r.exit_code == 0, r.output
    targets = [s["target"] for s in json.loads((out / "mixture.json").read_text())["sources"]]
    root_sum = 96 ** 0.5 + 40 ** 0.5
    assert targets == pytest.approx([96 ** 0.5 / root_sum, 40 ** 0.5 / root_sum], abs=1e-6)


def test_a_masking_rate_scheduled_inside_a_run(folders, tmp_path, clean_dist_env, monkeypatch):
    """--masked-lm-prob 0.4 --masked-lm-prob-end 0.1 over 6 steps (mmBERT lowers its rate): each step's rows, counted
    from the batches the loop trained on, mask BERT's count at that step's rate (0.4, 0.34, ... 0.1); the log says the
    rate; a run stopped at step 3 and resumed masks and scores as one never stopped."""
    import math

    from bertkit.pretrain import train as loop

    real_step, seen = loop.train_step, {}

    def counted(run, stop_at=None):
        if stop_at is not None and run.step == stop_at:
            run.stop.signal = signal.SIGTERM
        result = real_step(run)
        lengths = run.batch["attention_mask"].sum(1).tolist()
        masked = (run.batch["mlm_labels"] != -100).sum(1).tolist()
        seen.setdefault(run.cfg.out, {})[run.step] = (lengths, masked)
        return result

    schedule = dict(masked_lm_prob=0.4, masked_lm_prob_end=0.1)
    monkeypatch.setattr(loop, "train_step", counted)
    mixed(folders, tmp_path / "whole", **schedule)
    room = max(10, math.ceil(32 * 0.4))
    for step, (lengths, masked) in seen[str(tmp_path / "whole")].items():
        rate = round(0.4 - 0.3 * (step - 1) / 5, 6)   # the schedule states its rate to six places
        assert masked == [min(room, max(1, round(n * rate))) for n in lengths], step
    logged = [r["masked_lm_prob"] for r in map(json.loads, (tmp_path / "whole" / "metrics.jsonl").read_text()
                                                 .splitlines()) if "loss" in r]
    assert logged == pytest.approx([0.4, 0.34, 0.28, 0.22, 0.16, 0.1])

    monkeypatch.setattr(loop, "train_step", lambda run: counted(run, stop_at=2))
    assert mixed(folders, tmp_path / "halves", **schedule)["step"] == 3
    monkeypatch.setattr(loop, "train_step", counted)
    mixed(folders, tmp_path / "halves", resume=True, mixture=(), **schedule)
    assert seen[str(tmp_path / "halves")] == seen[str(tmp_path / "whole")]

    def losses(run):
        return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]

    assert losses(tmp_path / "halves") == losses(tmp_path / "whole")
    with pytest.raises(ConfigError, match="--masked-lm-prob-end 0.1: .*give both"):
        mixed(folders, tmp_path / "x", masked_lm_prob_end=0.1)


def test_a_cap_on_epochs_holds_a_small_folder_at_it(folders, tmp_path, clean_dist_env, capsys):
    """--mixture-max-epochs 1 over 10 steps of 8 rows (80 draws): en (40 rows) at 0.8 would be drawn 1.6 times over;
    held at 0.5 (40 of 80 in expectation), ko gets the rest; a resume that lengthens the run keeps the shares
    capped for the first length (so the data order too), saying so; a run longer than every folder's cap allows is
    refused."""
    from bertkit.mixture import capped

    assert capped(np.array([0.2, 0.8]), [96, 40], 80, 1.0) == pytest.approx([0.5, 0.5])
    assert capped(np.array([0.5, 0.3, 0.2]), [100, 10, 100], 100, 1.0) == pytest.approx([0.5 / 0.7 * 0.9, 0.1,
                                                                                          0.2 / 0.7 * 0.9])
    assert capped(np.array([0.2, 0.8]), [96, 40], 80, 4.0) == pytest.approx([0.2, 0.8])   # under the cap: as given
    with pytest.raises(ValueError, match="more than 0.5 passes"):
        capped(np.array([0.5, 0.5]), [96, 40], 80, 0.5)
    mix = (f"{folders / 'ko'}=0.2", f"{folders / 'en'}=0.8")
    result = mixed(folders, tmp_path / "run", mixture=mix, max_steps=10, mixture_max_epochs=1.0, eval_every=0)
    en = result["mixture"]["sources"][1]
    # held at half the draws; 80 of an epoch's 136 slots are a random sample of it: 40 rows give or take its spread
    assert en["target"] == pytest.approx(0.5) and 32 <= en["rows"] <= 48
    assert json.loads((tmp_path / "run" / "mixture.json").read_text())["capped_for_rows"] == 80
    shutil.copytree(tmp_path / "run", tmp_path / "longer")
    longer = mixed(folders, tmp_path / "longer", mixture=mix, resume=True, max_steps=12, mixture_max_epochs=1.0,
                   eval_every=0)
    # recomputed for 96 draws en would be held at 40/96; kept at 0.5, with the slots and so the order of every epoch
    assert longer["step"] == 12 and longer["mixture"]["sources"][1]["target"] == pytest.approx(0.5)
    assert [s["slots_per_epoch"] for s in longer["mixture"]["sources"]] == [68, 68]
    assert "the shares stay those capped for the run's first length (80 rows drawn)" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="more than 0.2 passes"):
        mixed(folders, tmp_path / "short", mixture=mix, max_steps=10, mixture_max_epochs=0.2, eval_every=0)
