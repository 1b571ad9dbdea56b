"""ELECTRA (bertkit.models.electra): the replaced-token labels on hand-made batches, the loss, and the export against
transformers: the discriminator as ElectraForPreTraining, the generator as ElectraForMaskedLM, both loading with no
missing or unexpected keys and agreeing with bertkit within 1e-5 (fp32); bertkit reads both back."""
import pytest
import torch

from bertkit.models import load_pretrained
from bertkit.models.electra import ElectraForPreTraining, corrupt, flat_positions, generator_config, write_hf
from tests.test_model import LENGTHS, assert_close, batch, tiny_config

transformers = pytest.importorskip("transformers")


def test_generator_shape():
    cfg = tiny_config(hidden_size=128, num_heads=2, intermediate_size=512)
    g = generator_config(cfg, 0.25)
    assert (g.hidden_size, g.num_heads, g.intermediate_size, g.num_layers, g.embedding_size) == (32, 1, 128, 2, 128)
    g = generator_config(tiny_config(hidden_size=768, num_heads=12, intermediate_size=3072), 1 / 3)
    assert (g.hidden_size, g.num_heads) == (256, 4)  # ELECTRA-Base's generator
    with pytest.raises(ValueError, match="generator size"):
        generator_config(cfg, 0.0)


def test_replaced_token_labels_by_hand():
    """Padded: row 0 masks positions 1 and 3, row 1 masks position 2 (its second slot is padding, label -100).
    The sample at row 0 position 3 equals the original token: it is labelled original, as in the paper."""
    input_ids = torch.tensor([[2, 4, 11, 4, 3], [2, 12, 4, 3, 0]])
    positions = torch.tensor([[1, 3], [2, 0]])
    labels = torch.tensor([[20, 21], [22, -100]])
    sampled = torch.tensor([[30, 21], [22, 99]])  # row 0 slot 1 and row 1: samples equal to the original
    flat = flat_positions(positions, input_ids)
    assert flat.tolist() == [[1, 3], [7, 5]]
    real = labels != -100  # what the model passes: the real slots only (padding slots get no sample)
    ids, replaced = corrupt(input_ids, flat[real], labels[real], sampled[real])
    assert ids.tolist() == [[2, 30, 11, 21, 3], [2, 12, 22, 3, 0]]
    assert replaced.tolist() == [[False, True, False, False, False], [False, False, False, False, False]]

    # packed: the same two rows end to end, positions into the flat tokens
    packed_ids = torch.tensor([2, 4, 11, 4, 3, 2, 12, 4, 3])
    packed_pos = torch.tensor([1, 3, 7])
    ids, replaced = corrupt(packed_ids, flat_positions(packed_pos, packed_ids), torch.tensor([20, 21, 22]),
                            torch.tensor([30, 21, 25]))
    assert ids.tolist() == [2, 30, 11, 21, 3, 2, 12, 25, 3]
    assert torch.nonzero(replaced).flatten().tolist() == [1, 7]


def masked_batch(cfg):
    ids, types, mask = batch(cfg)
    positions = torch.tensor([[1, 4, 6], [2, 3, 0], [1, 0, 0]])
    labels = torch.stack([ids[i, positions[i]] for i in range(3)])
    labels[1, 2] = labels[2, 1] = labels[2, 2] = -100
    masked = ids.clone()
    for i in range(3):
        for j, p in enumerate(positions[i]):
            if labels[i, j] != -100:
                masked[i, p] = 4  # [MASK] in this vocabulary's spirit: any fixed id
    return masked, types, mask, positions, labels


def test_loss_is_generator_mlm_plus_lambda_times_discriminator():
    torch.manual_seed(0)
    model = ElectraForPreTraining(tiny_config(), generator_size=0.25, disc_weight=50.0)
    ids, types, mask, positions, labels = masked_batch(model.cfg)
    out = model(ids, types, mask, mlm_positions=positions, mlm_labels=labels)
    assert torch.allclose(out.loss, out.mlm_loss + 50.0 * out.disc_loss)
    correct, tokens, tp, fp, fn = out.rtd.tolist()
    assert tokens == sum(LENGTHS) and 0 <= correct <= tokens and tp + fn <= 6  # replaced: at most the 6 masked
    out.loss.backward()
    shared = model.embeddings.word_embeddings.weight.grad
    assert shared is not None and shared.abs().sum() > 0  # both models train the shared embeddings
    assert model.generator.embeddings is None and model.discriminator.embeddings is None


@pytest.mark.parametrize("pad_vocab_to", [8, 64])  # --pad-vocab-to: padded rows never predicted, trimmed on export
def test_export_loads_in_transformers_and_agrees(tmp_path, pad_vocab_to):
    torch.manual_seed(0)
    cfg = tiny_config(hidden_dropout=0.0, attention_dropout=0.0, vocab_pad_multiple=pad_vocab_to)
    model = ElectraForPreTraining(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
            if p.shape[0] == cfg.padded_vocab_size:
                p[cfg.vocab_size:] = 0
    write_hf(model, tmp_path)
    disc, info = transformers.ElectraForPreTraining.from_pretrained(tmp_path, output_loading_info=True,
                                                                    attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    gen, info = transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "generator", output_loading_info=True,
                                                                attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"], info

    ids, types, mask = batch(cfg)
    valid = mask.bool()
    emb = model.embeddings(ids, types)
    with torch.no_grad():
        d_hidden = model.discriminator(ids, types, mask, inputs_embeds=emb).last_hidden_state
        d_logits = model.disc_out(torch.nn.functional.gelu(model.disc_dense(d_hidden))).squeeze(-1)
        g_logits = model.generator_logits(model.generator(ids, types, mask, inputs_embeds=emb).last_hidden_state)
        theirs_d = disc.eval()(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True)
        theirs_g = gen.eval()(input_ids=ids, token_type_ids=types, attention_mask=mask)
    assert_close(d_hidden[valid], theirs_d.hidden_states[-1][valid], "discriminator hidden states")
    assert_close(d_logits[valid], theirs_d.logits[valid], "discriminator logits")
    assert_close(g_logits[valid], theirs_g.logits[valid], "generator logits")

    # bertkit reads both back: the generator with its MLM head (fill-mask), the discriminator as an encoder
    g_back = load_pretrained(tmp_path / "generator", head="pretraining")
    assert g_back.cfg.embedding_size == cfg.hidden_size and g_back.cfg.hidden_size == 8
    with torch.no_grad():
        assert_close(g_back(ids, types, mask).mlm_logits[valid], theirs_g.logits[valid], "generator read back")
    d_back = load_pretrained(tmp_path, head="sequence_classification", num_labels=2)
    with torch.no_grad():
        assert_close(d_back.bert(ids, types, mask).last_hidden_state[valid], d_hidden[valid], "discriminator back")


@pytest.mark.slow
def test_electra_on_two_ranks_trains_resumes_exports_fine_tunes_and_fills_masks(tmp_path):
    """`deepspeed --num_gpus 2 cli.py pretrain --objective electra` (ZeRO-2): generator and discriminator losses fall,
    the metrics carry the generator's MLM and the replaced-token detection numbers (training and held-out), a kill
    and --resume logs the uninterrupted run's losses step for step (the generator's samples included), the export
    loads in transformers, fine-tuning starts from the discriminator and fill-mask from the generator. ZeRO-3 trains
    it too."""
    import json
    import os
    import signal
    import time

    from bertkit.fill_mask import fill_mask_predictions
    from bertkit.pretrain import export
    from bertkit.tokenization import load_tokenizer
    from tests.helpers import TINY, finish, launch, make_instances_dir, quick_finetune
    from tests.test_pretrain_dist import common

    def records(run):
        by_step = {}
        for line in (run / "metrics.jsonl").read_text().splitlines():
            r = json.loads(line)
            by_step.setdefault(r["step"], {}).update(r)
        return by_step

    inst = make_instances_dir(tmp_path / "inst", n=512, holdout=48, max_len=48)
    (tmp_path / "model.json").write_text(json.dumps(TINY))
    flags = ["--objective", "electra", "--generator-size", "0.5"]
    finish(launch(common(inst, tmp_path, tmp_path / "ref", max_steps=16, save_every=4, eval_every=8,
                         eval_batches=2) + flags))
    killed = launch(common(inst, tmp_path, tmp_path / "cut", max_steps=16, save_every=4, eval_every=8,
                           eval_batches=2) + flags)
    latest = tmp_path / "cut" / "checkpoints" / "latest"
    deadline = time.time() + 150
    while not latest.exists() and killed.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    resumed_from = int(latest.read_text()[len("global_step"):])
    finish(launch(common(inst, tmp_path, tmp_path / "cut", max_steps=16, save_every=4, eval_every=8,
                         eval_batches=2) + ["--resume"]))  # the run's objective and generator are its own
    ref, cut = records(tmp_path / "ref"), records(tmp_path / "cut")
    for key in ("loss", "mlm_loss", "mlm_acc", "disc_loss", "rtd_acc", "rtd_f1", "eval_disc_loss", "eval_rtd_f1",
                "eval_mlm_loss"):
        assert key in ref[16] or key in ref[8], key
    assert "nsp_loss" not in ref[16]
    assert ref[16]["mlm_loss"] < ref[1]["mlm_loss"] and ref[16]["disc_loss"] < ref[1]["disc_loss"]
    for s in range(resumed_from + 1, 17):
        for key in ("loss", "mlm_loss", "disc_loss", "rtd_acc"):
            assert cut[s][key] == pytest.approx(ref[s][key], rel=1e-6), (s, key)
    assert json.loads((tmp_path / "ref" / "config.json").read_text())["objective"] == "electra"

    out = export(tmp_path / "cut", tmp_path / "export")
    for folder, cls in ((out, transformers.ElectraForPreTraining),
                        (out / "generator", transformers.ElectraForMaskedLM)):
        _, info = cls.from_pretrained(folder, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], (folder, info)
        assert (folder / "vocab.txt").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert "generator/model.safetensors" in manifest["files"]

    generator = load_pretrained(out / "generator", head="pretraining")
    guesses = fill_mask_predictions(generator, load_tokenizer(out / "generator"), ["w3 [MASK] w5"], top_k=3)
    assert len(guesses[0][0]) == 3
    assert quick_finetune(out, tmp_path / "ft")["epochs"][0]["train_loss"] > 0

    # ZeRO-3 partitions both models' weights, the shared embeddings included; pretrained without dropout, both
    # exported models say the model's own dropout for fine-tuning
    finish(launch(common(inst, tmp_path, tmp_path / "z3", max_steps=4, save_every=4, zero_stage=3) + flags
                  + ["--dropout", "0"]))
    assert len(records(tmp_path / "z3")) >= 4
    z3 = export(tmp_path / "z3", tmp_path / "z3-export")
    for folder in (z3, z3 / "generator"):
        hf = json.loads((folder / "config.json").read_text())
        assert hf["hidden_dropout_prob"] == hf["attention_probs_dropout_prob"] == 0.1, folder  # BertConfig's


def test_packed_batches_give_the_padded_losses(monkeypatch):
    """--unpadded: the same rows end to end give the same generator and discriminator losses (sampling made
    deterministic here: the two layouts draw their samples in different orders)."""
    import bertkit.models.electra as electra

    monkeypatch.setattr(electra, "sample", lambda logits: logits.argmax(-1))
    torch.manual_seed(0)
    model = ElectraForPreTraining(tiny_config(hidden_dropout=0.0, attention_dropout=0.0)).eval()
    ids, types, mask, positions, labels = masked_batch(model.cfg)
    padded = model(ids, types, mask, mlm_positions=positions, mlm_labels=labels)
    lengths = mask.sum(1).tolist()
    starts = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    valid = labels != -100
    flat_pos = torch.cat([positions[i][valid[i]] + starts[i] for i in range(len(lengths))])
    packed = model(torch.cat([ids[i, :n] for i, n in enumerate(lengths)]),
                   torch.cat([types[i, :n] for i, n in enumerate(lengths)]),
                   mlm_positions=flat_pos, mlm_labels=labels[valid],
                   cu_seqlens=torch.tensor(starts, dtype=torch.int32), max_seqlen=max(lengths))
    assert torch.allclose(packed.mlm_loss, padded.mlm_loss, atol=1e-5)
    assert torch.allclose(packed.disc_loss, padded.disc_loss, atol=1e-5)
    assert packed.rtd.tolist() == padded.rtd.tolist()
