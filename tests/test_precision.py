"""--precision bf16 on the CPU: autocast over fp32 weights (bertkit.precision), in pretraining (fine-tuning:
test_finetune_precision.py); the torch backend attends in fp32 inside it. Checked against fp32 runs and float64
references, and against what would go wrong: DeepSpeed's own bf16 (weights in bf16) on the CPU, autocast left off,
or attention run in bf16."""
import json

import pytest
import torch

from bertkit.pretrain import PretrainConfig, pretrain
from bertkit.pretrain.config import resolve_deepspeed_config
from tests.helpers import tiny_pretraining_inputs


def test_bf16_on_the_cpu_keeps_deepspeed_in_fp32():
    """On the CPU the DeepSpeed config has no bf16 section (weights and optimizer stay fp32; the loop autocasts);
    on a GPU DeepSpeed's bf16 holds the weights, as before."""
    cfg = PretrainConfig(instances="i", out="o", precision="bf16")
    ds, settings = resolve_deepspeed_config(cfg, 1, None, False, False)
    assert settings.precision == "bf16" and "bf16" not in ds and "fp16" not in ds
    ds, _ = resolve_deepspeed_config(cfg, 1, {"bf16": {"enabled": True}}, False, False)  # the user's file too
    assert "bf16" not in ds
    ds, settings = resolve_deepspeed_config(cfg, 1, None, True, True)
    assert settings.precision == "bf16" and ds["bf16"]["enabled"]


def test_attention_in_a_bf16_step_on_the_cpu_runs_in_fp32():
    """bf16 q, k, v on the CPU (what autocast's projections give) attend in fp32: the output and the gradients equal
    the fp32 computation on the same bf16 inputs, rounded once to bf16 (not bf16 arithmetic throughout), for the
    padded path and the packed one with RoPE and a window."""
    from bertkit.kernels.torch_backend import attention_torch, attention_varlen_torch

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 24, 2, 16, generator=gen).to(torch.bfloat16) for _ in range(3))
    lengths = torch.tensor([24, 17])
    cu = torch.tensor([0, 24, 41], dtype=torch.int32)
    cases = [
        lambda q, k, v: attention_torch(q, k, v, lengths),
        lambda q, k, v: attention_varlen_torch(q.reshape(48, 2, 16)[:41], k.reshape(48, 2, 16)[:41],
                                               v.reshape(48, 2, 16)[:41], cu, 24, window=4, rope_theta=10_000.0),
    ]
    for fn in cases:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fn(*leaves)
        assert out.dtype == torch.bfloat16
        dout = torch.randn(out.shape, generator=gen).to(torch.bfloat16)
        grads = torch.autograd.grad(out, leaves, dout)
        wide = [t.float().requires_grad_() for t in (q, k, v)]
        ref = fn(*wide)
        ref_grads = torch.autograd.grad(ref, wide, dout.float())
        assert torch.equal(out, ref.to(torch.bfloat16))
        for g, r in zip(grads, ref_grads):
            assert g.dtype == torch.bfloat16 and torch.equal(g, r.to(torch.bfloat16))


@pytest.fixture(scope="module")
def instances(tmp_path_factory):
    return tiny_pretraining_inputs(tmp_path_factory.mktemp("bf16"), n=64)


def test_pretraining_in_bf16_on_the_cpu_tracks_fp32(instances, tmp_path, clean_dist_env):
    """The same run in bf16 autocast: its losses are fp32's to about bf16's rounding (1 %), not equal to them (the
    autocast really ran), every weight and the checkpoint stay fp32, and the run records bf16."""
    def run(precision):
        out = tmp_path / precision
        pretrain(PretrainConfig(instances=str(instances), out=str(out), model=str(instances.parent / "model.json"),
                                micro_batch=8, max_steps=4, dropout=0.0, optimizer="adamw", lr=1e-3, warmup=0,
                                precision=precision, progress=False, num_workers=0, log_every=1, eval_every=4,
                                eval_batches=2))
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return out, [r.get("loss", r.get("eval_loss")) for r in records if "loss" in r or "eval_loss" in r]

    _, fp32 = run("fp32")
    out, bf16 = run("bf16")
    assert len(bf16) == len(fp32) == 5
    assert bf16 == pytest.approx(fp32, rel=1e-2) and bf16 != fp32
    assert json.loads((out / "config.json").read_text())["resolved"]["precision"] == "bf16"
    from safetensors.torch import load_file

    from bertkit.pretrain import export
    export(out, tmp_path / "export")
    assert {t.dtype for t in load_file(tmp_path / "export" / "model.safetensors").values()} == {torch.float32}


def test_a_run_saved_in_deepspeeds_bf16_is_refused_on_resume_not_crashed(instances, tmp_path, clean_dist_env,
                                                                         monkeypatch):
    """bertkit before 2026-11-26 ran --precision bf16 on a CPU as DeepSpeed's bf16 (its own checkpoint format).
    Resuming such a run now is refused naming export and --init-from (DeepSpeed itself died on a KeyError), before
    anything in the run folder is rewritten; --init-from continues from its weights."""
    import bertkit.pretrain.run as run_module
    from bertkit.pretrain.config import ConfigError

    def old_settings(*args, **kwargs):  # the DeepSpeed config the old CPU bf16 path built
        ds_config, settings = resolve_settings(*args, **kwargs)
        return {**ds_config, "bf16": {"enabled": True}}, settings

    resolve_settings = run_module.resolve_settings
    out = tmp_path / "old"
    common = dict(instances=str(instances), model=str(instances.parent / "model.json"), micro_batch=8,
                  optimizer="adamw", precision="bf16", progress=False, num_workers=0, eval_every=10 ** 6)
    with monkeypatch.context() as patch:
        patch.setattr(run_module, "resolve_settings", old_settings)
        pretrain(PretrainConfig(out=str(out), max_steps=2, save_every=2, **common))
    before = (out / "config.json").read_bytes()
    with pytest.raises(ConfigError, match="DeepSpeed's bf16 weights.*bertkit export.*--init-from"):
        pretrain(PretrainConfig(out=str(out), max_steps=4, resume=True, **common))
    assert (out / "config.json").read_bytes() == before
    pretrain(PretrainConfig(out=str(tmp_path / "new"), init_from=str(out), max_steps=2, **common))
    assert (tmp_path / "new" / "checkpoints" / "global_step2").is_dir()


def test_pretraining_precision_auto_follows_the_cpus_bf16_units_and_a_resume_keeps_its_choice(
        instances, tmp_path, clean_dist_env, monkeypatch):
    """`--precision auto` on a CPU is bf16 where it has bf16 units (the losses an explicit bf16 run logs, exactly)
    and fp32 where it has none. A run begun under auto keeps what auto chose when it is resumed on a machine whose
    answer differs (its optimizer state is in that precision): no refusal, and the resumed steps' losses are those
    of the same resume on the machine the run began on."""
    import shutil

    def run(out, precision, units, steps, **extra):
        monkeypatch.setenv("BERTKIT_CPU_BF16_UNITS", units)
        pretrain(PretrainConfig(instances=str(instances), out=str(out), model=str(instances.parent / "model.json"),
                                micro_batch=8, max_steps=steps, dropout=0.0, optimizer="adamw", lr=1e-3, warmup=0,
                                precision=precision, progress=False, num_workers=0, log_every=1,
                                eval_every=10 ** 6, save_every=2, **extra))
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in records if "loss" in r]

    def resolved(out):
        return json.loads((out / "config.json").read_text())["resolved"]["precision"]

    assert run(tmp_path / "auto-units", "auto", "1", 2) == run(tmp_path / "bf16", "bf16", "1", 2)
    assert resolved(tmp_path / "auto-units") == "bf16"
    whole = run(tmp_path / "auto-none", "auto", "0", 4)
    assert resolved(tmp_path / "auto-none") == "fp32" and whole != run(tmp_path / "bf16-4", "bf16", "0", 4)

    stopped, same = tmp_path / "stopped", tmp_path / "same"
    run(stopped, "auto", "0", 2)
    shutil.copytree(stopped, same)
    moved = run(stopped, None, "1", 4, resume=True)  # now on a CPU with units: the run stays fp32
    assert resolved(stopped) == "fp32" and moved[2:] == run(same, None, "0", 4, resume=True)[2:]
