"""Optimizers, schedules, DeepSpeed-config merging and the trainer's bad-input errors (one process, no launcher)."""
import json
import math

import numpy as np
import pytest
import torch

from bertkit.optim import Lamb, build_scheduler, lr_factor, param_groups
from bertkit.pretrain import ConfigError, PretrainConfig, TrainingError, pretrain
from bertkit.pretrain.config import resolve_deepspeed_config
from bertkit.runlog import scalar_tag
from tests.helpers import TINY, tiny_pretraining_inputs


def lamb_numpy(w, grads, lr, b1, b2, eps, wd):
    """LAMB written from the paper (Algorithm 2, with Adam's bias correction), one tensor."""
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        r = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps) + wd * w
        wn, rn = np.linalg.norm(w), np.linalg.norm(r)
        trust = wn / rn if wn > 0 and rn > 0 else 1.0
        w = w - lr * trust * r
    return w


def test_lamb_matches_the_paper():
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(5, 7))
    grads = [rng.normal(size=(5, 7)) for _ in range(4)]
    zero_bias_grads = [rng.normal(size=3) for _ in range(4)]
    q0, q_grads = rng.normal(size=(2, 3)), [100 * rng.normal(size=(2, 3)) for _ in range(4)]  # its own trust ratio
    p = torch.nn.Parameter(torch.tensor(w0, dtype=torch.float32))
    q = torch.nn.Parameter(torch.tensor(q0, dtype=torch.float32))
    b = torch.nn.Parameter(torch.zeros(3))
    opt = Lamb([{"params": [p, q], "weight_decay": 0.01}, {"params": [b], "weight_decay": 0.0}],
               lr=0.05, betas=(0.9, 0.99), eps=1e-6)
    for g, gq, gb in zip(grads, q_grads, zero_bias_grads):
        p.grad = torch.tensor(g, dtype=torch.float32)
        q.grad = torch.tensor(gq, dtype=torch.float32)
        b.grad = torch.tensor(gb, dtype=torch.float32)
        opt.step()
    np.testing.assert_allclose(p.detach().numpy(), lamb_numpy(w0, grads, 0.05, 0.9, 0.99, 1e-6, 0.01), rtol=2e-5,
                               atol=1e-6)
    np.testing.assert_allclose(q.detach().numpy(), lamb_numpy(q0, q_grads, 0.05, 0.9, 0.99, 1e-6, 0.01), rtol=2e-5,
                               atol=1e-6)
    # a zero-initialised bias: trust ratio 1 at the first step, then ||w|| / ||r||
    np.testing.assert_allclose(b.detach().numpy(), lamb_numpy(np.zeros(3), zero_bias_grads, 0.05, 0.9, 0.99, 1e-6,
                                                              0.0), rtol=2e-5, atol=1e-6)


def test_no_weight_decay_on_biases_and_layer_norm():
    from bertkit.models.bert import BertForPreTraining
    from bertkit.models.bert_config import BertConfig

    model = BertForPreTraining(BertConfig(**TINY))
    decay, no_decay = param_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert not any(n.endswith("bias") or "norm" in n.lower() for n in decayed)
    assert "bert.embeddings.word_embeddings.weight" in decayed
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_schedules():
    # linear: warmup 10 steps to the peak, then to 0 at step 100
    f = [lr_factor(s, 100, 10, "linear") for s in range(101)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0) and f[10] == pytest.approx(1.0)
    assert f[55] == pytest.approx(0.5) and f[100] == 0.0
    assert lr_factor(55, 100, 10, "poly") == pytest.approx(math.sqrt(0.5))
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = build_scheduler(opt, 100, 10, "poly")
    for _ in range(30):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(2.0 * math.sqrt(1 - 20 / 90))
    with pytest.raises(ValueError, match="unknown schedule"):
        build_scheduler(opt, 100, 10, "cosine-restarts")


def _cfg(**kw):
    return PretrainConfig(instances="i", out="o", **kw)


def test_deepspeed_config_from_flags_and_merging():
    ds, res = resolve_deepspeed_config(_cfg(micro_batch=8, global_batch=64), 2, None, False, False)
    assert ds["train_micro_batch_size_per_gpu"] == 8 and ds["gradient_accumulation_steps"] == 4
    assert ds["train_batch_size"] == 64 and ds["zero_optimization"]["stage"] == 0 and ds["gradient_clipping"] == 1.0
    assert resolve_deepspeed_config(_cfg(optimizer="adamw"), 1, None, False, False)[1].zero_stage == 2
    assert res.precision == "fp32" and "fp16" not in ds and "bf16" not in ds and "optimizer" not in ds
    # GPU: bf16 where supported, else fp16 with dynamic loss scaling
    ds, res = resolve_deepspeed_config(_cfg(), 1, None, True, True)
    assert ds["bf16"]["enabled"] and res.precision == "bf16"
    ds, res = resolve_deepspeed_config(_cfg(), 1, None, True, False)
    assert ds["fp16"]["enabled"] and ds["fp16"]["loss_scale"] == 0
    # the user's file wins where the flags are silent; its optimizer is read into the settings
    user = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3, "zero_optimization": {"stage": 3,
            "overlap_comm": True}, "optimizer": {"type": "AdamW", "params": {"lr": 5e-4}}}
    ds, res = resolve_deepspeed_config(_cfg(), 2, user, False, False)
    assert res.micro_batch == 4 and res.global_batch == 24 and res.zero_stage == 3
    assert res.optimizer == "adamw" and res.lr == 5e-4 and ds["zero_optimization"]["overlap_comm"]
    # agreeing values are fine, contradicting ones name both
    resolve_deepspeed_config(_cfg(micro_batch=4, lr=5e-4), 2, user, False, False)
    with pytest.raises(ConfigError, match=r"--micro-batch 16 contradicts ds.json's train_micro_batch_size_per_gpu = 4"):
        resolve_deepspeed_config(_cfg(micro_batch=16), 2, user, False, False, source="ds.json")
    with pytest.raises(ConfigError, match=r"--zero-stage 1 contradicts .*zero_optimization.stage = 3"):
        resolve_deepspeed_config(_cfg(zero_stage=1), 2, user, False, False)
    with pytest.raises(ConfigError, match=r"--precision fp32 contradicts .*bf16"):
        resolve_deepspeed_config(_cfg(precision="fp32"), 1, {"bf16": {"enabled": True}}, True, True)
    with pytest.raises(ConfigError, match="gradient_accumulation_steps = 3 contradicts --global-batch 16"):
        resolve_deepspeed_config(_cfg(global_batch=16), 2, user, False, False)
    with pytest.raises(ConfigError, match="not a multiple of micro batch 8"):
        resolve_deepspeed_config(_cfg(micro_batch=8, global_batch=20), 2, None, False, False)
    with pytest.raises(ConfigError, match="fp16 needs a GPU"):
        resolve_deepspeed_config(_cfg(precision="fp16"), 1, None, False, False)
    with pytest.raises(ConfigError, match="optimizer type 'sgd' is not supported"):
        resolve_deepspeed_config(_cfg(), 1, {"optimizer": {"type": "SGD"}}, False, False)


@pytest.fixture(scope="module")
def instances(tmp_path_factory):
    return tiny_pretraining_inputs(tmp_path_factory.mktemp("pretrain"), n=96)


def test_bad_inputs_give_clear_errors(instances, tmp_path, clean_dist_env):
    from bertkit.formats import InstancesError

    model = str(instances.parent / "model.json")
    with pytest.raises(InstancesError, match="no such instances folder"):
        pretrain(PretrainConfig(instances=str(tmp_path / "missing"), out=str(tmp_path / "r0"), model=model))
    other = dict(TINY, vocab_size=140)
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(ConfigError, match=r"vocabulary has 140 tokens .* made with 133"):
        pretrain(PretrainConfig(instances=str(instances), out=str(tmp_path / "r1"), model=str(tmp_path / "other.json"),
                                progress=False, num_workers=0))
    # a loss that blows up stops with the step and what to do, and saves nothing
    run = tmp_path / "nan"
    with pytest.raises(TrainingError, match=r"loss is (nan|inf) at step \d+; stopped without saving .*--lr"):
        pretrain(PretrainConfig(instances=str(instances), out=str(run), model=model, optimizer="adamw", lr=1e30,
                                warmup=0, max_steps=20, micro_batch=8, progress=False, num_workers=0, log_every=1))
    assert not (run / "checkpoints" / "latest").exists()
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        pretrain(PretrainConfig(instances=str(instances), out=str(run), model=model, resume=True, progress=False))


def test_out_of_memory_names_the_step_and_the_fix(instances, tmp_path, clean_dist_env, monkeypatch):
    """A micro batch that does not fit stops with where it happened and the flags that fix it."""
    from bertkit.models.bert import BertForPreTraining

    real_forward, calls = BertForPreTraining.forward, []

    def forward(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # step 2, second micro batch
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(BertForPreTraining, "forward", forward)
    with pytest.raises(TrainingError, match=r"out of memory at step 2, micro batch 2 of 2 on rank 0: 8 sequences x "
                                            r"32 tokens\. Try --micro-batch 4 with the same --global-batch 16"):
        pretrain(PretrainConfig(instances=str(instances), out=str(tmp_path / "oom"),
                                model=str(instances.parent / "model.json"), micro_batch=8, global_batch=16,
                                max_steps=4, progress=False, num_workers=0, log_every=1))


def test_tensorboard_gets_every_logged_scalar(instances, tmp_path, clean_dist_env):
    """Each numeric metric of metrics.jsonl (training and held-out) is a TensorBoard scalar at its step, read back
    with TensorBoard's own reader."""
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                            reason="the tensorboard extra is not installed")
    run = tmp_path / "tb"
    pretrain(PretrainConfig(instances=str(instances), out=str(run), model=str(instances.parent / "model.json"),
                            micro_batch=8, max_steps=4, progress=False, num_workers=0, log_every=1, eval_every=2,
                            eval_batches=1, report_to="tensorboard"))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    reader = event_accumulator.EventAccumulator(str(run / "tensorboard"))
    reader.Reload()
    got = {(tag, e.step): e.value for tag in reader.Tags()["scalars"] for e in reader.Scalars(tag)}
    expected = {(scalar_tag(k), r["step"]): v for r in records for k, v in r.items()
                if k != "step" and isinstance(v, (int, float))}
    assert got.keys() == expected.keys()
    assert all(got[k] == pytest.approx(v, rel=1e-6) for k, v in expected.items())
    tags = {tag for tag, _ in got}
    assert {"train/loss", "train/mlm_acc", "train/mlm_mask_acc", "train/nsp_acc", "train/lr", "train/grad_norm",
            "perf/seq_per_s", "perf/tokens_per_s", "perf/padding_efficiency", "eval/mlm_acc", "eval/mlm_mask_acc",
            "eval/nsp_acc", "eval/loss"} <= tags
    assert all(0 < got["perf/padding_efficiency", r["step"]] <= 1 for r in records if "loss" in r)


def test_a_run_evaluates_at_its_last_step(instances, tmp_path, clean_dist_env):
    """The held-out score at a run's end is logged even where --max-steps is no multiple of --eval-every, and an
    evaluation between steps leaves the training itself as it was (the same losses as a run that never evaluates)."""
    def logged(run, eval_every):
        pretrain(PretrainConfig(instances=str(instances), out=str(run), model=str(instances.parent / "model.json"),
                                micro_batch=8, max_steps=5, progress=False, num_workers=0, log_every=1,
                                eval_every=eval_every, eval_batches=1))
        return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]

    records = logged(tmp_path / "every3", 3)
    assert [r["step"] for r in records if "eval_loss" in r] == [3, 5]
    quiet = logged(tmp_path / "never", 0)
    assert [r["loss"] for r in records if "loss" in r] == [r["loss"] for r in quiet if "loss" in r]


def test_torch_kernels_log_the_same_losses_as_the_reference(instances, tmp_path, clean_dist_env):
    """--kernels torch (SDPA, F.layer_norm) trains step for step like the einsum reference in fp32, padded and
    packed; the backend that ran is in config.json and every training record."""
    from bertkit import kernels

    def losses(backend, unpadded):
        run = tmp_path / f"{backend}-{unpadded}"
        pretrain(PretrainConfig(instances=str(instances), out=str(run), model=str(instances.parent / "model.json"),
                                micro_batch=8, max_steps=6, dropout=0.0, optimizer="adamw", lr=3e-3, warmup=0,
                                progress=False, num_workers=0, log_every=1, eval_every=3, eval_batches=2,
                                kernels=backend, unpadded=unpadded))
        assert json.loads((run / "config.json").read_text())["kernels"] == backend
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert all(r["kernels"] == backend for r in records if "loss" in r)
        return [r.get("loss", r.get("eval_loss")) for r in records if "loss" in r or "eval_loss" in r]

    try:
        for unpadded in (False, True):
            ours, ref = losses("torch", unpadded), losses("reference", unpadded)
            assert len(ours) == len(ref) == 8
            assert ours == pytest.approx(ref, rel=1e-5)
    finally:
        kernels.use("auto")


@pytest.mark.parametrize("shape", [(3, 7), (21,)])
def test_top1_right_is_argmax_against_the_label(shape):
    """The accuracy's "right" without argmax (slow on the CPU) equals argmax's on padded and packed logits, ignored
    labels (-100) never right."""
    from bertkit.pretrain.metrics import top1_right

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(*shape, 50, generator=g)
    labels = torch.randint(0, 50, shape, generator=g)
    labels[..., ::3] = logits.argmax(-1)[..., ::3]  # some right, most wrong
    labels[..., 1::4] = -100
    has = labels != -100
    assert torch.equal(top1_right(logits, labels, has), (logits.argmax(-1) == labels) & has)
    assert top1_right(logits, labels, has).sum() > 0


def test_mask_accuracy_counts_only_the_positions_that_read_mask(tmp_path):
    """mlm_acc counts every chosen position (a kept token is right by copying); mlm_mask_acc only those whose input
    is [MASK], the same for a padded and a packed batch."""
    import torch.distributed as dist

    from bertkit.models.bert import PreTrainingOutput
    from bertkit.pretrain.metrics import Meter

    made_group = not dist.is_initialized()
    if made_group:  # Meter.reduce sums over ranks: a group of one, gone again after the test
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    M = 4
    ids = torch.tensor([[2, M, 7, M, 3, 0], [2, 9, M, 8, 3, 0]])
    pos = torch.tensor([[1, 2, 3, 0], [1, 2, 3, 0]])             # the last slot is padding
    labels = torch.tensor([[5, 7, 6, -100], [9, 5, 11, -100]])   # [MASK] kept [MASK] | kept [MASK] random
    guess = torch.tensor([[5, 7, 1, 0], [9, 1, 11, 0]])          # right: 5 (mask), 7 (copied), 9 (copied), 11
    zero = torch.zeros(())

    def out(g):
        return PreTrainingOutput(zero, zero, zero, torch.nn.functional.one_hot(g, 12).float(), torch.zeros(2, 2))

    padded = {"input_ids": ids, "attention_mask": (ids > 0).long(), "mlm_positions": pos, "mlm_labels": labels,
              "next_sentence_label": torch.zeros(2, dtype=torch.long)}
    keep = labels.flatten() != -100
    packed = {"input_ids": ids[:, :5].reshape(-1), "cu_seqlens": torch.tensor([0, 5, 10], dtype=torch.int32),
              "mlm_positions": (pos + torch.tensor([[0], [5]])).flatten()[keep], "mlm_labels": labels.flatten()[keep],
              "next_sentence_label": torch.zeros(2, dtype=torch.long)}
    try:
        for batch, g in ((padded, guess), (packed, guess.flatten()[keep])):
            meter = Meter("cpu", mask_id=M)
            meter.add(out(g), batch)
            r = meter.reduce()
            assert r["mlm_acc"] == pytest.approx(4 / 6) and r["mlm_mask_acc"] == pytest.approx(1 / 3)
        meter = Meter("cpu")  # no [MASK] id: no such number
        meter.add(out(guess), padded)
        assert "mlm_mask_acc" not in meter.reduce()
    finally:
        if made_group:
            dist.destroy_process_group()
