"""End to end under the real launcher: `deepspeed --num_gpus 2 cli.py pretrain` on two CPU ranks (gloo).

One uninterrupted ZeRO-2 run is the reference for the kill -> resume run; ZeRO-3 trains and exports, and the
export is checked in transformers against the held-out loss the trainer logged.
"""
import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.safe_load import safe_load
from tests.helpers import BIN, TINY, env_without_dist as _env, finish, launch, make_instances_dir

pytestmark = pytest.mark.slow  # launches DeepSpeed ranks

STEPS = 30


def metrics(run: Path) -> dict[int, dict]:
    """Training records by step; a resumed run appends, so later lines win."""
    by_step = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "loss" in r:
            by_step[r["step"]] = r
    return by_step


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    inst = make_instances_dir(root / "inst", n=512, holdout=48, max_len=48)
    (root / "model.json").write_text(json.dumps(TINY))
    return root, inst


def common(inst, root, out, **kw):
    args = {"--instances": inst, "--out": out, "--model": root / "model.json", "--max-steps": STEPS,
            "--micro-batch": 8, "--global-batch": 32, "--optimizer": "adamw", "--lr": 3e-3, "--warmup": 3,
            "--log-every": 1,
            "--save-every": 10, "--keep-last": 2, "--eval-every": 0, "--num-workers": 0, "--seed": 7,
            "--zero-stage": 2}
    args.update({f"--{k.replace('_', '-')}": v for k, v in kw.items()})
    flat = [x for k, v in args.items() for x in (k, v)]
    return [str(x) for x in flat] + ["--no-progress"]


def test_zero2_trains_and_kill_resume_matches(setup):
    root, inst = setup
    ref, killed = root / "ref", root / "killed"
    # the uninterrupted reference and the run to be killed start together (2 ranks each on 2 cores)
    p_ref = launch(common(inst, root, ref))
    p_kill = launch(common(inst, root, killed))
    latest = killed / "checkpoints" / "latest"
    deadline = time.time() + 150
    while not latest.exists() and p_kill.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    if p_kill.poll() is not None:  # it ended before its first checkpoint: say why
        finish(p_ref)
        pytest.fail(f"the run to be killed exited ({p_kill.returncode}) before a checkpoint:\n"
                    f"{p_kill.stdout.read()[-4000:]}")
    os.killpg(p_kill.pid, signal.SIGKILL)  # the launcher and both ranks, no chance to save
    p_kill.wait()
    finish(p_ref)
    assert latest.exists(), "the killed run never wrote a checkpoint"
    resumed_from = int(latest.read_text().strip()[len("global_step"):])
    assert resumed_from < STEPS

    ref_m = metrics(ref)
    assert sorted(ref_m) == list(range(1, STEPS + 1))
    losses = np.array([ref_m[s]["loss"] for s in range(1, STEPS + 1)])
    assert losses[-5:].mean() < losses[:5].mean() - 0.1, losses  # it learns
    assert ref_m[STEPS]["lr"] == 0.0 and ref_m[5]["lr"] > ref_m[20]["lr"]  # warmup then linear decay to 0
    assert all(np.isfinite(ref_m[s]["grad_norm"]) for s in ref_m)
    # keep-last 2: only the two newest checkpoints remain, none half-written
    ckpts = sorted(p.name for p in (ref / "checkpoints").glob("global_step*"))
    assert ckpts == ["global_step20", "global_step30"]

    out = finish(launch(common(inst, root, killed) + ["--resume"]))
    got = metrics(killed)
    for s in range(resumed_from + 1, STEPS + 1):
        for key in ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "lr"):
            assert got[s][key] == pytest.approx(ref_m[s][key], rel=1e-6, abs=1e-9), (s, key, out[-2000:])

    # export of a ZeRO-2 run equals the reference's final weights (fp32 everywhere)
    from bertkit.pretrain import export, load_run_state_dict

    exported = export(killed, root / "export2")
    a, _, _ = load_run_state_dict(ref)
    b, _, _ = load_run_state_dict(killed)
    assert all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7) for k in a)
    assert (exported / "model.safetensors").is_file() and (exported / "vocab.txt").is_file()


def test_zero3_trains_exports_and_loads_in_transformers(setup):
    from transformers import BertForPreTraining

    from bertkit.data import EpochBatches, InstanceDataset, collate

    root, inst = setup
    run = root / "z3"
    steps = 6
    # persistence threshold 0 partitions even the LayerNorm weights and biases, which the fused kernels and the tied
    # MLM decoder read from outside their own module: DeepSpeed must gather them there too
    ds = root / "z3.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}))
    finish(launch(common(inst, root, run, zero_stage=3, max_steps=steps, eval_every=steps, eval_batches=3,
                         save_every=100, deepspeed_config=ds)))
    used = json.loads((run / "deepspeed_config.json").read_text())["zero_optimization"]
    assert used["stage"] == 3 and used["stage3_param_persistence_threshold"] == 0
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["loss"]) for r in logged if "loss" in r)
    # stage 3 checkpoints hold only partitions; export gathers them
    assert list((run / "checkpoints" / f"global_step{steps}").glob("*zero_pp_rank_1*"))
    cli = subprocess.run([str(BIN / "bertkit"), "export", str(run), "--out", str(root / "hf")], env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr[-3000:]

    model, info = BertForPreTraining.from_pretrained(root / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    model.eval()
    # transformers reproduces the held-out MLM/NSP loss the trainer logged at the last step (same rows, same split
    # of rows over the 2 ranks, mean of the per-micro-batch means)
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ev = [r for r in logged if "eval_mlm_loss" in r][-1]
    holdout = InstanceDataset(inst, "holdout", seed=7)
    mlm, nsp = [], []
    with torch.no_grad():
        for rank in range(2):
            for i, keys in enumerate(EpochBatches(len(holdout), 8, 7, rank, 2, shuffle=False)):
                if i == 3:
                    break
                b = collate([holdout[k] for k in keys])
                out = model(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"],
                            attention_mask=b["attention_mask"])
                logits = torch.gather(out.prediction_logits, 1,
                                      b["mlm_positions"].unsqueeze(-1).expand(-1, -1, out.prediction_logits.shape[-1]))
                mlm.append(torch.nn.functional.cross_entropy(logits.flatten(0, 1), b["mlm_labels"].flatten(),
                                                             ignore_index=-100).item())
                nsp.append(torch.nn.functional.cross_entropy(out.seq_relationship_logits,
                                                             b["next_sentence_label"]).item())
    assert np.mean(mlm) == pytest.approx(ev["eval_mlm_loss"], rel=1e-4)
    assert np.mean(nsp) == pytest.approx(ev["eval_nsp_loss"], rel=1e-4)
    assert ev["eval_mlm_loss"] < np.log(TINY["vocab_size"])  # trained past chance


def test_one_process_sigterm_saves_then_exits(setup, clean_dist_env):
    """`bertkit pretrain` without the launcher: SIGTERM to its process group (loader worker included) mid-run
    saves a checkpoint at that step and exits 143 (128 + SIGTERM), so `pretrain && export` does not export it."""
    root, inst = setup
    run = root / "single"
    cmd = [str(BIN / "bertkit"), "pretrain"] + common(inst, root, run, micro_batch=16, global_batch=32,
                                                        max_steps=1000, save_every=1000, optimizer="lamb",
                                                        lr=0.02, zero_stage=0, num_workers=1)
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    log = run / "metrics.jsonl"
    deadline = time.time() + 90
    while (not log.exists() or len(log.read_text().splitlines()) < 3) and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "stopped by signal" in out
    last = max(metrics(run))
    assert 3 <= last < 1000
    assert (run / "checkpoints" / "latest").read_text() == f"global_step{last}"
    assert not list((run / "checkpoints").glob("*.partial"))

    # a resume that would change the data order is refused
    from bertkit.pretrain import ConfigError, PretrainConfig, pretrain

    with pytest.raises(ConfigError, match=r"--resume: seed 7 -> 8; the run's data order and schedule depend on these"):
        pretrain(PretrainConfig(instances=str(inst), out=str(run), model=str(root / "model.json"), resume=True,
                                seed=8, micro_batch=16, global_batch=32, optimizer="lamb", zero_stage=0,
                                progress=False, num_workers=0))

    # phase 2 starts from that run's latest weights (a run folder is accepted as well as an export)
    from dataclasses import replace

    from bertkit.formats import read_instances_manifest
    from bertkit.pretrain import load_run_state_dict
    from bertkit.pretrain.start import build_model

    state, _, _ = load_run_state_dict(run)
    model, _, source = build_model(PretrainConfig(instances=str(inst), out=str(root / "phase2"), init_from=str(run)),
                                   read_instances_manifest(inst), None)
    assert source.endswith(f"global_step{last})")
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    # ...but not onto instances made with another vocabulary
    other = replace(read_instances_manifest(inst), vocab_sha256="0" * 64)
    with pytest.raises(ConfigError, match="was trained with another vocabulary"):
        build_model(PretrainConfig(instances=str(inst), out=str(root / "p2"), init_from=str(run)), other, None)
    # ...nor with another LayerNorm order than its weights were trained in
    with pytest.raises(ConfigError, match=rf"--norm pre: the weights this run starts from \({run} \(global_step"
                                          r"\d+\)\) are post-LN; drop --norm"):
        build_model(PretrainConfig(instances=str(inst), out=str(root / "p2"), init_from=str(run), norm="pre"),
                    read_instances_manifest(inst), None)
    # --dropout changes the run's dropout, while the export keeps the model's own for fine-tuning
    model, cfg2, _ = build_model(PretrainConfig(instances=str(inst), out=str(root / "p2"), init_from=str(run),
                                                dropout=0.0), read_instances_manifest(inst), None)
    assert cfg2.hidden_dropout == 0.0 and model.export_dropout == {"hidden": 0.1, "attention": 0.1}


def test_a_plan_on_two_ranks_carries_its_optimizer_state_averages_and_warms_its_batch(setup):
    """`deepspeed --num_gpus 2 cli.py pretrain --plan`: two ZeRO-2 phases, the first warming its batch from a quarter,
    the second carrying the first's Adam state (each rank's partition: its step count goes on) and keeping a
    moving average that `export --ema` writes."""
    root, inst = setup
    (root / "plan.toml").write_text(f"""
model = "{root / 'model.json'}"
instances = "{inst}"
micro_batch = 8
global_batch = 32
optimizer = "adamw"
zero_stage = 2
num_workers = 0
eval_every = 0
log_every = 1
save_every = 100
report_to = "none"

[[phase]]
name = "first"
max_steps = 4
batch_warmup_from = 0.25
batch_warmup_steps = 2

[[phase]]
name = "second"
max_steps = 3
ema = 0.9
""")
    out = finish(launch(["--plan", root / "plan.toml", "--out", root / "planned", "--no-progress"]))
    record = json.loads((root / "planned" / "plan.json").read_text())
    assert [(p["name"], p["step"], p["done"]) for p in record["phases"]] == [("first", 4, True), ("second", 3, True)], \
        out[-3000:]
    # the first phase's micro batches a rank: 1, then 2 a step (the whole batch: 32 / (8 x 2 ranks)); 7 on each of
    # 2 ranks, 8 sequences of at most 48 tokens each; the second's 3 x 2 x 2
    first, second = (p["tokens"] for p in record["phases"])
    assert 0 < first <= 7 * 2 * 8 * 48 and 0 < second <= 6 * 2 * 8 * 48
    for rank in (0, 1):
        states = safe_load(next((root / "planned" / "02-second" / "checkpoints" / "global_step3").glob(
            f"*zero_pp_rank_{rank}_*optim_states.pt")))["optimizer_state_dict"]   # tensors only, never code
        steps = {float(s["step"]) for s in states["base_optimizer_state"]["state"].values()}
        assert steps == {7.0}, (rank, steps)   # 4 carried + 3
    assert (root / "planned" / "02-second" / "checkpoints" / "global_step3" / "ema.pt").is_file()
    from bertkit.pretrain import export

    assert (export(root / "planned" / "02-second", root / "ema-export", ema=True) / "model.safetensors").is_file()
