"""pretrain --plan: phases in one file, each a run of its own started from the one before; a plan stopped inside a
phase resumes there with the same losses as one never stopped; a finished plan run again trains nothing; a plan
that cannot be run says which phase and setting."""
import json
import signal

import pytest
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.data import InstanceDataset
from bertkit.pretrain import ConfigError
from bertkit.pretrain.plan import read_plan, run_plan
from bertkit.testing import make_instances_dir
from tests.helpers import TINY

# what every test plan sets for all its phases: tiny steps, a log line and a record each step
EVERY_PHASE = """micro_batch = 8
optimizer = "adamw"
num_workers = 0
log_every = 1
eval_batches = 1
report_to = "none"
"""


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    root = tmp_path_factory.mktemp("plan")
    make_instances_dir(root / "ko", n=96, holdout=8, max_len=32, seed=0)
    make_instances_dir(root / "en", n=40, holdout=8, max_len=32, seed=1)
    (root / "model.json").write_text(json.dumps(TINY))
    (root / "plan.toml").write_text(f"""
model = "{root / 'model.json'}"
{EVERY_PHASE}eval_every = 2
save_every = 2

[[phase]]
name = "stable"
mixture = ["{root / 'ko'}=0.7", "{root / 'en'}=0.3"]
max_steps = 4
masked_lm_prob = 0.3
schedule = "wsd"
decay = 0.0

[[phase]]
name = "decay"
instances = "{root / 'ko'}"
max_steps = 4
lr = 5e-4
schedule = "wsd"
warmup = 0
decay = 1.0
""")
    return root


def records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def losses(run):
    return [r["loss"] for r in records(run) if "loss" in r]


def test_a_plan_runs_its_phases_in_order_and_resumes_inside_one(plan, tmp_path, clean_dist_env, monkeypatch):
    whole = run_plan(plan / "plan.toml", tmp_path / "whole", progress=False)
    assert [(p["name"], p["folder"], p["step"], p["done"]) for p in whole["phases"]] == \
        [("stable", "01-stable", 4, True), ("decay", "02-decay", 4, True)]
    stable, decay = (json.loads((tmp_path / "whole" / f / "config.json").read_text())["pretrain"]
                     for f in ("01-stable", "02-decay"))
    assert stable["masked_lm_prob"] == 0.3 and len(stable["mixture"]) == 2 and stable["seed"] == 42
    assert decay["init_from"] == str(tmp_path / "whole" / "01-stable") and decay["seed"] == 43
    assert decay["masked_lm_prob"] is None and decay["lr"] == 5e-4
    lrs = [r["lr"] for r in records(tmp_path / "whole" / "02-decay") if "lr" in r]
    # its own clock: 1 - sqrt of its own progress from the peak it sets, down to 0 at its own end
    assert lrs == pytest.approx([5e-4 * (1 - (step / 4) ** 0.5) for step in (1, 2, 3, 4)])
    assert (tmp_path / "whole" / "01-stable" / "mixture.json").is_file()

    from bertkit.pretrain import train as loop

    real_step = loop.train_step

    def stopped_in_the_decay(run):   # a SIGTERM two steps into the second phase: it saves and stops
        if run.cfg.out.endswith("02-decay") and run.step == 1:
            run.stop.signal = signal.SIGTERM
        return real_step(run)

    monkeypatch.setattr(loop, "train_step", stopped_in_the_decay)
    stopped = run_plan(plan / "plan.toml", tmp_path / "halves", progress=False)
    assert stopped["stopped_by_signal"] == signal.SIGTERM and stopped["phases"][-1]["step"] == 2
    monkeypatch.setattr(loop, "train_step", real_step)
    resumed = run_plan(plan / "plan.toml", tmp_path / "halves", progress=False)
    assert [p["done"] for p in resumed["phases"]] == [True, True]
    for folder in ("01-stable", "02-decay"):
        assert losses(tmp_path / "halves" / folder) == losses(tmp_path / "whole" / folder)
    before = (tmp_path / "halves" / "02-decay" / "metrics.jsonl").read_text()
    run_plan(plan / "plan.toml", tmp_path / "halves", progress=False)   # finished: nothing trains
    assert (tmp_path / "halves" / "02-decay" / "metrics.jsonl").read_text() == before


def test_plans_that_cannot_run_say_which_phase_and_setting(plan, tmp_path):
    def refused(text, message):
        (tmp_path / "p.toml").write_text(text)
        with pytest.raises(ConfigError, match=message):
            read_plan(tmp_path / "p.toml")

    refused('max_steps = 3\n', "no \\[\\[phase\\]\\] tables")
    refused('[[phase]]\nmax_step = 3\n', "phase 1 sets 'max_step', not a pretrain setting")
    refused('lr_peak = 1\n[[phase]]\nmax_steps = 3\n', "the top level sets 'lr_peak'")
    refused('[[phase]]\nname = "a"\n[[phase]]\nname = "a"\n', "phase 2's name 'a'")
    refused('[[phase]]\n[[phase]]\ninit_from = "x"\n', "phase 2 sets init_from")
    refused('[[phase]]\nout = "x"\n', "phase 1 sets 'out'")
    refused('[[phase]]\nmax_steps = "3"\n', "phase 1 sets max_steps = '3'; give a whole number")
    refused('[[phase]]\nmax_steps = 2.5\n', "max_steps = 2.5; give a whole number")
    refused('unpadded = "yes"\n[[phase]]\n', "the top level sets unpadded = 'yes'; give true or false")
    refused('[[phase]]\nlr = "1e-3"\n', "give a number")
    refused('[[phase]]\ntokens = "2e9"\n', "tokens = '2e9'; give a number")
    refused('batch_tokens = 100.5\n[[phase]]\n', "batch_tokens = 100.5; give a whole number")
    refused('[[phase]]\ntime_budget = "soon"\n', "phase 1: time_budget 'soon' is not a duration")
    (tmp_path / "p.toml").write_text('[[phase]]\ntime_budget = "1h30m"\n[[phase]]\nmax_steps = 1e3\n')
    _, phases = read_plan(tmp_path / "p.toml")   # as on the command line; a whole number written 1e3 as an int
    assert phases[0]["time_budget"] == 5400.0 and phases[1]["max_steps"] == 1000 and type(phases[1]["max_steps"]) is int
    r = CliRunner().invoke(main, ["pretrain", "--plan", str(plan / "plan.toml"), "--out", str(tmp_path / "r"),
                                  "--lr", "1e-3"])
    assert r.exit_code == 2 and "--lr with --plan: put the setting in the plan" in r.output
    (tmp_path / "gone.toml").write_text(f'batch_tokens = 64\n[[phase]]\ninstances = "{tmp_path / "gone"}"\n')
    r = CliRunner().invoke(main, ["pretrain", "--plan", str(tmp_path / "gone.toml"), "--out", str(tmp_path / "r")])
    assert r.exit_code == 1 and "no such instances folder" in r.output and r.exception.__class__ is SystemExit


def test_a_phase_given_in_tokens_runs_the_steps_they_make(plan, tmp_path):
    """tokens / (micro batch x the mean row length, a mixture's weighted by its targets), rounded up."""
    import math

    import pyarrow as pa

    from bertkit.pretrain.plan import phase_config

    def mean_length(folder):
        shards = sorted(folder.glob("train-*.arrow")) or sorted(p for p in folder.glob("*.arrow") if "holdout" not in
                                                                 p.name)
        lengths = [len(x) for s in shards for x in pa.ipc.open_file(str(s)).read_all().column("input_ids").to_pylist()]
        return sum(lengths) / len(lengths)

    defaults, phases = read_plan(plan / "plan.toml")
    one = {"name": "long", "instances": str(plan / "ko"), "tokens": 5000}
    assert phase_config(defaults, one, 0, tmp_path, None, False).max_steps == math.ceil(5000 / (8 * mean_length(
        plan / "ko")))
    mixed = {"name": "mixed", "mixture": [f"{plan / 'ko'}=0.7", f"{plan / 'en'}=0.3"], "tokens": 5000}
    per_row = 0.7 * mean_length(plan / "ko") + 0.3 * mean_length(plan / "en")
    assert phase_config(defaults, mixed, 0, tmp_path, None, False).max_steps == math.ceil(5000 / (8 * per_row))
    in_tokens = {"name": "t", "instances": str(plan / "ko"), "max_steps": 9, "warmup_tokens": 600,
                 "save_every_tokens": 1000, "eval_every_tokens": 2000, "batch_warmup_tokens": 300}
    cfg = phase_config(defaults, in_tokens, 0, tmp_path, None, False)
    per_step = 8 * mean_length(plan / "ko")
    assert (cfg.warmup, cfg.save_every, cfg.eval_every, cfg.batch_warmup_steps) == tuple(
        math.ceil(t / per_step) for t in (600, 1000, 2000, 300))
    (tmp_path / "both.toml").write_text('[[phase]]\ntokens = 5\nmax_steps = 3\n')
    with pytest.raises(ConfigError, match="both tokens and max_steps"):
        read_plan(tmp_path / "both.toml")


def test_a_run_s_lengths_given_in_tokens_on_the_command_line(plan, tmp_path, clean_dist_env):
    """pretrain --max-tokens (and --warmup-tokens, --save-every-tokens, --eval-every-tokens) without a plan: the
    steps recorded in config.json are the tokens over micro batch x the mean row length, rounded up."""
    import math

    per_step = 8 * InstanceDataset(plan / "ko", "train").lengths().mean()
    args = ["pretrain", "--instances", str(plan / "ko"), "--model", str(plan / "model.json"), "--micro-batch", "8",
            "--optimizer", "adamw", "--num-workers", "0", "--report-to", "none", "--no-progress"]
    r = CliRunner().invoke(main, args + ["--out", str(tmp_path / "run"), "--max-tokens", "1500", "--warmup-tokens",
                                         "300", "--save-every-tokens", "600", "--eval-every-tokens", "900"])
    assert r.exit_code == 0, r.output
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())["pretrain"]
    assert [recorded[k] for k in ("max_steps", "warmup", "save_every", "eval_every")] == [
        math.ceil(t / per_step) for t in (1500, 300, 600, 900)]
    r = CliRunner().invoke(main, args + ["--out", str(tmp_path / "x"), "--max-tokens", "1500", "--max-steps", "3"])
    assert r.exit_code == 2 and "--max-tokens and --max-steps: give one" in r.output


def test_three_phases_of_a_tiny_modernbert_as_the_issue_measures_them(tmp_path, clean_dist_env, monkeypatch):
    """A ModernBERT plan on CPU: a mixture of a Korean and an English folder at 0.7 / 0.3 with 30 % masking and RoPE
    theta 10k for one epoch (the realised shares within 1 %), then a longer length with theta 160k at the same tokens
    a step (its data's reach said, the local layers' theta 20k), then a decay at 15 %; each boundary's checkpoint
    written; the export has the last phase's thetas; a stop in phase 2 resumes to the same losses."""
    from bertkit.pretrain import export

    root = tmp_path
    make_instances_dir(root / "ko64", n=96, holdout=8, max_len=32, seed=0)
    make_instances_dir(root / "en64", n=40, holdout=8, max_len=32, seed=1)
    make_instances_dir(root / "ko128", n=48, holdout=8, max_len=64, seed=2)
    (root / "plan.toml").write_text(f"""
model = "modernbert-tiny"
objective = "mlm"
{EVERY_PHASE}eval_every = 100
save_every = 100
schedule = "wsd"
batch_tokens = 256

[[phase]]
name = "stable"
mixture = ["{root / 'ko64'}=0.7", "{root / 'en64'}=0.3"]
max_steps = 17
masked_lm_prob = 0.3
rope_theta = 10000.0
decay = 0.0

[[phase]]
name = "extend"
instances = "{root / 'ko128'}"
max_steps = 3
masked_lm_prob = 0.3
rope_theta = 160000.0
rope_theta_local = 20000.0
decay = 0.0
warmup = 0

[[phase]]
name = "decay"
instances = "{root / 'ko128'}"
max_steps = 3
masked_lm_prob = 0.15
warmup = 0
decay = 1.0
""")
    whole = run_plan(root / "plan.toml", root / "whole", progress=False)
    assert [p["step"] for p in whole["phases"]] == [17, 3, 3]
    assert [p["global_batch"] for p in whole["phases"]] == [8, 4, 4]   # 256 tokens a step at 32 and at 64
    reach = whole["phases"][1]["reach"]   # the extension says how much of its data is longer than 32
    assert [(r["length"], r["previous_length"]) for r in reach] == [(64, 32)] and "reach" not in whole["phases"][2]
    shares = json.loads((root / "whole" / "01-stable" / "mixture.json").read_text())["sources"]
    assert [abs(s["share_of_rows"] - s["target"]) <= 0.01 for s in shares] == [True, True]   # one whole epoch
    for folder, theta, rate in (("01-stable", 10000.0, 0.3), ("02-extend", 160000.0, 0.3), ("03-decay", None, 0.15)):
        config = json.loads((root / "whole" / folder / "config.json").read_text())
        assert config["pretrain"]["rope_theta"] == theta and config["pretrain"]["masked_lm_prob"] == rate
        assert (root / "whole" / folder / "checkpoints" / "latest").is_file()   # the boundary's checkpoint
    assert json.loads((root / "whole" / "02-extend" / "config.json").read_text())["max_seq_length"] == 64
    exported = json.loads((export(root / "whole" / "03-decay", root / "model") / "config.json").read_text())
    assert exported["global_rope_theta"] == 160000.0 and exported["model_type"] == "modernbert"
    assert exported["local_rope_theta"] == 20000.0   # set in the extension, carried by the decay's model

    from bertkit.pretrain import train as loop

    real_step = loop.train_step

    def stopped_in_the_extension(run):
        if run.cfg.out.endswith("02-extend") and run.step == 1:
            run.stop.signal = signal.SIGTERM
        return real_step(run)

    monkeypatch.setattr(loop, "train_step", stopped_in_the_extension)
    assert run_plan(root / "plan.toml", root / "halves", progress=False)["stopped_by_signal"] == signal.SIGTERM
    monkeypatch.setattr(loop, "train_step", real_step)
    run_plan(root / "plan.toml", root / "halves", progress=False)
    for folder in ("01-stable", "02-extend", "03-decay"):
        assert losses(root / "halves" / folder) == losses(root / "whole" / folder)


def adam_state(engine):
    """(each tensor's Adam step count, every first moment as one vector): the torch optimizer under DeepSpeed's."""
    import torch

    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    states = [inner.state[p] for group in inner.param_groups for p in group["params"] if p in inner.state]
    if not states:
        return [], None
    return [float(s["step"]) for s in states], torch.cat([s["exp_avg"].flatten().clone() for s in states])


def test_a_later_phase_carries_the_optimizer_state_unless_the_plan_drops_it(plan, tmp_path, clean_dist_env,
                                                                           monkeypatch):
    """ModernBERT's handoff: phase 2 begins with phase 1's Adam moments and step counts (exactly), at its own
    learning rate; init_optimizer = false starts them anew."""
    import torch

    from bertkit.pretrain import train as loop

    real_step, seen, tokens = loop.train_step, {}, {}

    def watched(run):
        name = run.cfg.out.rsplit("/", 1)[-1]
        if run.step == 0:
            seen[(name, 0)] = adam_state(run.engine)
        result = real_step(run)
        seen[(name, run.step)] = adam_state(run.engine)
        tokens[name] = tokens.get(name, 0) + int(run.batch["attention_mask"].sum())   # one micro batch a step
        return result

    monkeypatch.setattr(loop, "train_step", watched)
    run_plan(plan / "plan.toml", tmp_path / "kept", progress=False)
    steps, moments = seen[("01-stable", 4)]
    assert set(steps) == {4.0}
    carried_steps, carried = seen[("02-decay", 0)]
    assert set(carried_steps) == {4.0} and torch.equal(carried, moments)
    assert set(seen[("02-decay", 1)][0]) == {5.0}
    lrs = [r["lr"] for r in records(tmp_path / "kept" / "02-decay") if "lr" in r]
    assert lrs[0] == pytest.approx(5e-4 * (1 - 0.25 ** 0.5))   # its own peak, not phase 1's loaded groups'

    # plan.json: the tokens each phase's batches held (counted here from the batches), the mixture's per source
    phases = json.loads((tmp_path / "kept" / "plan.json").read_text())["phases"]
    assert [p["tokens"] for p in phases] == [tokens["01-stable"], tokens["02-decay"]]
    assert sum(s["tokens"] for s in phases[0]["sources"]) == tokens["01-stable"] and "sources" not in phases[1]
    from bertkit.report import report

    page = report(tmp_path / "kept").read_text()
    assert "bertkit plan: kept" in page and page.count("<img") >= 2 and "carried" in page
    assert f"<td>{tokens['02-decay']}</td>" in page

    text = (plan / "plan.toml").read_text().replace('name = "decay"', 'name = "decay"\ninit_optimizer = false')
    (tmp_path / "fresh.toml").write_text(text)
    seen.clear()
    run_plan(tmp_path / "fresh.toml", tmp_path / "fresh", progress=False)
    assert seen[("02-decay", 0)] == ([], None) and set(seen[("02-decay", 1)][0]) == {1.0}


def test_init_optimizer_needs_a_run_folder(tmp_path):
    from bertkit.pretrain import PretrainConfig

    make_instances_dir(tmp_path / "inst", n=16, holdout=0, max_len=16, seed=0)
    (tmp_path / "export").mkdir()
    cfg = PretrainConfig(instances=str(tmp_path / "inst"), out=str(tmp_path / "r"), init_from=str(tmp_path / "export"),
                         init_optimizer=True)
    with pytest.raises(ConfigError, match="holds no optimizer state"):
        cfg.check()


def test_a_longer_phase_says_how_much_of_its_data_reaches_the_new_length(tmp_path):
    """long_reach against a count by hand over the Arrow rows (split at [SEP]): long documents give tokens beyond the
    earlier length, a corpus of short ones none."""
    import pyarrow as pa

    from bertkit.pretrain.plan import long_reach
    from tests.helpers import write_corpus

    tok = make_instances_dir(tmp_path / "tok", n=8, holdout=2, max_len=16)   # the toy vocab.txt
    short = [[f"w{i} w{i + 1} w{i + 2}."] for i in range(60)]
    long = [[" ".join(f"w{(5 * i + j) % 100}" for j in range(12)) + "." for i in range(k, k + 12)] for k in range(8)]
    for name, docs in (("short", short), ("mixed", short + long)):
        write_corpus(tmp_path / f"{name}-corpus", [docs])
        r = CliRunner().invoke(main, ["make-instances", str(tmp_path / f"{name}-corpus"), "--tokenizer", str(tok),
                                      "--out", str(tmp_path / name), "--max-seq-length", "128", "--objective", "none",
                                      "--mode", "dynamic", "--no-progress"])
        assert r.exit_code == 0, r.output

    sep = (tok / "vocab.txt").read_text().splitlines().index("[SEP]")
    rows = [row for shard in sorted((tmp_path / "mixed").glob("*.arrow")) if "holdout" not in shard.name
            for row in pa.ipc.open_file(str(shard)).read_all().column("input_ids").to_pylist()]
    spans, span = [], 0
    for row in rows:
        for token in row:
            span += 1
            if token == sep:
                spans.append(span)
                span = 0
    beyond = sum(s for s in spans if s > 32) / sum(spans)
    full = sum(s for s in spans if s >= 0.9 * 128) / sum(spans)
    found = long_reach(tmp_path / "mixed", 32)
    assert found["rows_measured"] == len(rows) and found["length"] == 128
    assert found["share_beyond_previous"] == pytest.approx(beyond, abs=1e-4) and beyond > 0.5
    assert found["share_reaching_length"] == pytest.approx(full, abs=1e-4) and full > 0
    assert long_reach(tmp_path / "short", 32)["share_beyond_previous"] == 0.0


def test_batch_tokens_keeps_a_step_s_tokens_at_any_length(plan, tmp_path):
    from bertkit.pretrain.plan import phase_config

    make_instances_dir(tmp_path / "long", n=16, holdout=0, max_len=64, seed=3)
    defaults, _ = read_plan(plan / "plan.toml")
    at32 = phase_config(defaults, {"name": "a", "instances": str(plan / "ko"), "batch_tokens": 512}, 0, tmp_path,
                        None, False)
    at64 = phase_config(defaults, {"name": "b", "instances": str(tmp_path / "long"), "batch_tokens": 512}, 1,
                        tmp_path, None, False)
    assert (at32.global_batch, at32.micro_batch) == (16, 8) and (at64.global_batch, at64.micro_batch) == (8, 8)
    with pytest.raises(ConfigError, match="batch_tokens 100 is not a whole number of sequences of 64"):
        phase_config(defaults, {"name": "c", "instances": str(tmp_path / "long"), "batch_tokens": 100}, 0, tmp_path,
                     None, False)


def test_the_readme_s_plan_and_the_reference_s_read(tmp_path):
    """The plans README.md and plans.md show are plans read_plan takes (their three phases, in order)."""
    import re

    from tests.helpers import REPO

    for doc in (REPO / "README.md", REPO / "bertkit" / "pretrain" / "plans.md"):
        block = re.search(r"```toml\n(.*?)```", doc.read_text(encoding="utf-8"), re.S).group(1)
        (tmp_path / "plan.toml").write_text(block)
        _, phases = read_plan(tmp_path / "plan.toml")
        assert [p["name"] for p in phases] == ["stable", "extend", "decay"], doc


def test_shipped_plans_read_and_scale(tmp_path):
    from bertkit.pretrain.plan import SHIPPED

    assert sorted(p.stem for p in SHIPPED.glob("*.toml")) == ["bert", "budget", "modernbert"]
    _, phases = read_plan("modernbert", 1e-3, {"model": "modernbert-tiny"})
    assert [(p["name"], p["tokens"]) for p in phases] == [("stable", 1.7e9), ("extend", 2.5e8), ("decay", 5e7)]
    defaults, phases = read_plan("bert", 0.01)
    assert [p["max_steps"] for p in phases] == [71, 16] and defaults["optimizer"] == "lamb"
    assert read_plan("budget", 4)[1][0]["time_budget"] == 7200
    with pytest.raises(ConfigError, match="nor a shipped plan \\(bert, budget, modernbert\\)"):
        read_plan("modernbert-large")
    with pytest.raises(ConfigError, match="the top level sets 'modell'"):
        read_plan("modernbert", 1.0, {"modell": "x"})


def test_the_shipped_modernbert_plan_scaled_down_runs_on_a_cpu(tmp_path, clean_dist_env, monkeypatch):
    """`pretrain --plan modernbert --plan-scale 2e-9 --plan-set ...`: its three phases on tiny instances named as it
    expects, each with the plan's settings (theta, masking, StableAdamW, tokens a step)."""
    make_instances_dir(tmp_path / "instances-1024", n=96, holdout=8, max_len=32, seed=0)
    make_instances_dir(tmp_path / "instances-8192", n=48, holdout=8, max_len=64, seed=2)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["pretrain", "--plan", "modernbert", "--plan-scale", "2e-9", "--out", "run",
                                  "--plan-set", 'model="modernbert-tiny"', "--plan-set", "batch_tokens=256",
                                  "--plan-set", "micro_batch=8", "--plan-set", "num_workers=0",
                                  "--plan-set", "report_to=none", "--no-progress"])
    assert r.exit_code == 0, r.output
    record = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert [(p["name"], p["done"], p["global_batch"]) for p in record["phases"]] == \
        [("stable", True, 8), ("extend", True, 4), ("decay", True, 4)]
    assert record["phases_planned"][0]["tokens"] == pytest.approx(3400)
    configs = [json.loads((tmp_path / "run" / p["folder"] / "config.json").read_text()) for p in record["phases"]]
    assert [c["pretrain"]["rope_theta"] for c in configs] == [10000.0, 160000.0, 160000.0]
    assert {c["pretrain"]["masked_lm_prob"] for c in configs} == {0.3}
    assert {c["resolved"]["optimizer"] for c in configs} == {"stableadamw"}
    assert configs[0]["model"]["hidden_size"] == 128 and [c["pretrain"]["lr"] for c in configs] == [8e-4, 3e-4, 3e-4]


def test_a_batch_size_warmup_grows_each_step_s_micro_batches_and_resumes_exactly(plan, tmp_path, clean_dist_env,
                                                                                  monkeypatch):
    """--batch-warmup-from 0.25 --batch-warmup-steps 4 at 4 micro batches a step: 1, 2, 2, 3, then 4 micro batches
    (counted from the loader), one optimizer step each (DeepSpeed's own count), the data drawn in order; a run stopped
    inside the warmup resumes to the same losses."""
    from bertkit.pretrain import PretrainConfig, pretrain, train as loop

    class Counted:
        def __init__(self, loader):
            self.loader, self.count = loader, 0

        def __next__(self):
            self.count += 1
            return next(self.loader)

    real_step, seen = loop.train_step, {}

    def watched(run, stop_at=None):
        if not isinstance(run.loader, Counted):
            run.loader = Counted(run.loader)
        before = run.loader.count
        if stop_at is not None and run.step == stop_at:
            run.stop.signal = signal.SIGTERM
        result = real_step(run)
        seen.setdefault(run.cfg.out, []).append((run.step, run.loader.count - before, run.engine.global_steps,
                                                 run.consumed()))
        return result

    args = dict(instances=str(plan / "ko"), model=str(plan / "model.json"), micro_batch=4, global_batch=16,
                batch_warmup_from=0.25, batch_warmup_steps=4, max_steps=6, optimizer="adamw", num_workers=0,
                eval_every=0, save_every=2, log_every=1, progress=False, report_to="none", schedule="wsd",
                decay=0.0, warmup=0)
    monkeypatch.setattr(loop, "train_step", watched)
    pretrain(PretrainConfig(out=str(tmp_path / "whole"), **args))
    whole = seen[str(tmp_path / "whole")]
    assert [n for _, n, _, _ in whole] == [1, 2, 2, 3, 4, 4]
    assert [g for _, _, g, _ in whole] == [1, 2, 3, 4, 5, 6]   # one optimizer step a step
    assert [c for _, _, _, c in whole] == [1, 3, 5, 8, 12, 16]

    monkeypatch.setattr(loop, "train_step", lambda run: watched(run, stop_at=2))
    pretrain(PretrainConfig(out=str(tmp_path / "halves"), **args))   # stops and saves at step 3
    monkeypatch.setattr(loop, "train_step", watched)
    pretrain(PretrainConfig(out=str(tmp_path / "halves"), resume=True, **args))
    assert losses(tmp_path / "halves") == losses(tmp_path / "whole")
    with pytest.raises(ConfigError, match="go together"):
        PretrainConfig(instances="x", out="y", batch_warmup_from=0.5).check()


def test_the_shipped_bert_and_budget_plans_scaled_down_run_on_a_cpu(tmp_path, clean_dist_env, monkeypatch):
    """`--plan bert` (NVIDIA's two phases: LAMB, a polynomial decay each, 128 then 512 tokens, LAMB started anew)
    and `--plan budget` (the budget recipe for a time) on tiny instances named as each expects."""
    make_instances_dir(tmp_path / "instances-128", n=64, holdout=8, max_len=32, seed=0)
    make_instances_dir(tmp_path / "instances-512", n=32, holdout=8, max_len=64, seed=1)
    make_instances_dir(tmp_path / "instances", n=64, holdout=8, max_len=32, seed=2)
    (tmp_path / "model.json").write_text(json.dumps(TINY))
    monkeypatch.chdir(tmp_path)
    common = ["--plan-set", "micro_batch=4", "--plan-set", "num_workers=0", "--plan-set", "report_to=none",
              "--no-progress"]
    r = CliRunner().invoke(main, ["pretrain", "--plan", "bert", "--plan-scale", "0.0005", "--out", "bert",
                                  "--plan-set", 'model="model.json"', "--plan-set", "global_batch=8", *common])
    assert r.exit_code == 0, r.output
    record = json.loads((tmp_path / "bert" / "plan.json").read_text())
    assert [(p["name"], p["done"]) for p in record["phases"]] == [("seq128", True), ("seq512", True)]
    configs = [json.loads((tmp_path / "bert" / p["folder"] / "config.json").read_text()) for p in record["phases"]]
    assert [c["pretrain"]["max_steps"] for c in configs] == [round(7038 * 0.0005), round(1563 * 0.0005)]
    assert {(c["resolved"]["optimizer"], c["pretrain"]["schedule"]) for c in configs} == {("lamb", "poly")}
    assert [c["pretrain"]["lr"] for c in configs] == [6e-3, 4e-3]
    assert {(c["pretrain"]["global_batch"], c["pretrain"]["micro_batch"]) for c in configs} == {(8, 4)}  # --plan-set
    assert configs[1]["pretrain"]["init_optimizer"] is False   # the plan's: NVIDIA's second phase starts LAMB anew
    r = CliRunner().invoke(main, ["pretrain", "--plan", "budget", "--plan-scale", "0.002", "--out", "budget",
                                  *common])
    assert r.exit_code == 0, r.output
    [phase] = json.loads((tmp_path / "budget" / "plan.json").read_text())["phases"]
    config = json.loads((tmp_path / "budget" / phase["folder"] / "config.json").read_text())
    assert phase["done"] and config["pretrain"]["time_budget"] == pytest.approx(3.6)
    assert config["pretrain"]["recipe"] == "budget" and config["model"]["family"] == "modernbert"
