"""Beyond BERT's 2018 recipe, each a switch with BERT's recipe the default: --objective sop|none, masking rate and
80/10/10 shares, --pad-vocab-to, packed fine-tuning; and the named recipes (pretrain --recipe budget)."""
import json
import math
import random

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.formats import MaskingOptions
from bertkit.pipelines.make_instances import InstancesConfig, build_pairs, full_sentences, make_instances
from tests.helpers import TINY, doc_of, layout, toy_vocab, write_corpus

CLS, SEP = 10_000, 10_001  # ids outside the layout's tokens


def test_sop_pairs_are_one_documents_segments_in_or_out_of_order():
    docs = [[5, 7, 3, 9, 4], [6, 6], [12], [3, 3, 3, 3, 3, 3, 3], [40]]
    tokens, seg_start, doc_seg = layout(docs)
    pairs, skipped = build_pairs(seg_start, doc_seg, np.random.default_rng(0),
                                 InstancesConfig(max_seq_length=20, objective="sop", short_seq_prob=0.3))
    assert skipped == 0 and len(pairs["a_lo"]) > 5
    for a_lo, a_hi, b_lo, b_hi, swapped in zip(*(pairs[k] for k in ("a_lo", "a_hi", "b_lo", "b_hi", "not_next"))):
        assert doc_of(a_lo, seg_start, doc_seg) == doc_of(b_hi - 1, seg_start, doc_seg)  # one document
        assert (a_lo == b_hi) if swapped else (b_lo == a_hi)  # B right after A, or right before it
    many, _ = build_pairs(*layout([[4] * 6] * 400)[1:], np.random.default_rng(1),
                          InstancesConfig(max_seq_length=20, objective="sop"))
    assert abs(many["not_next"].mean() - 0.5) < 0.05


def test_full_sentences_pack_documents_with_a_sep_between_them():
    docs = [[5, 7, 3], [6, 6], [30], [2, 2, 2, 2]]
    tokens, seg_start, doc_seg = layout(docs)
    ids, offsets = full_sentences(tokens, seg_start, doc_seg, np.random.default_rng(0), 24, CLS, SEP, np.int64)
    rows = [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]
    assert all(len(r) <= 24 and r[0] == CLS and r[-1] == SEP and r[-2] != SEP for r in rows)
    # every token exactly once, but the 30-token segment cut to the 22 a row holds
    inner = [t for r in rows for t in r[1:-1] if t != SEP]
    assert sorted(inner) == [t for t in range(len(tokens)) if not 27 + 22 <= t < 57]
    # between [SEP]s a row holds one document's tokens in order
    for r in rows:
        runs = " ".join(map(str, r[1:-1])).split(str(SEP))
        for run in (list(map(int, x.split())) for x in runs if x.strip()):
            assert len({doc_of(t, seg_start, doc_seg) for t in run}) == 1 and run == sorted(run)
    # and a row boundary never falls without one inside a document unless the row is full
    assert any(SEP in r[1:-1] for r in rows)


@pytest.fixture(scope="module")
def toy_corpus(tmp_path_factory):
    rng = random.Random(0)
    words = [f"w{i}" for i in range(120)]
    docs = [[" ".join(rng.choices(words, k=rng.randint(4, 12))) for _ in range(rng.randint(2, 9))] for _ in range(90)]
    root = tmp_path_factory.mktemp("recipes")
    write_corpus(root / "corpus", [docs[:80]], [docs[80:]])
    (root / "vocab.txt").write_text("\n".join(toy_vocab()) + "\n")
    (root / "model.json").write_text(json.dumps(TINY))
    return root


def test_masking_rate_and_shares_are_switches(toy_corpus):
    from bertkit.fileio import read_arrow

    cfg = InstancesConfig(max_seq_length=64, masking=MaskingOptions(masked_lm_prob=0.3, mask_replace=(0.5, 0.3, 0.2)),
                          dupe=4)
    assert cfg.masking.max_predictions == math.ceil(64 * 0.3) and InstancesConfig().masking.max_predictions == 20
    m = make_instances(toy_corpus / "corpus", toy_corpus / "vocab.txt", toy_corpus / "m30", cfg, progress=False)
    s = m.stats
    assert abs(s["selected_fraction"] - s["expected_selected_fraction"]) < 1e-12
    counts = s["train_counts"]
    assert 0.28 < counts["selected"] / counts["tokens"] < 0.32  # 30% of each row's tokens, rounded per row
    assert abs(s["mask_share"] - 0.5) < 0.03 and abs(s["kept_share"] - 0.3) < 0.03
    assert abs(s["random_share"] - 0.2) < 0.03
    assert m.masking == cfg.masking and m.masking.mask_replace == (0.5, 0.3, 0.2)
    mask_id = toy_vocab().index("[MASK]")
    only = make_instances(toy_corpus / "corpus", toy_corpus / "vocab.txt", toy_corpus / "all-mask",
                          InstancesConfig(max_seq_length=64, masking=MaskingOptions(mask_replace=(1, 0, 0)), dupe=1),
                          progress=False)
    rows = read_arrow(toy_corpus / "all-mask" / only.shards[0].file).to_pydict()
    assert all(ids[p] == mask_id for ids, pos in zip(rows["input_ids"], rows["masked_positions"]) for p in pos)
    r = CliRunner().invoke(main, ["make-instances", str(toy_corpus / "corpus"), "--tokenizer",
                                  str(toy_corpus / "vocab.txt"), "--out", str(toy_corpus / "bad"), "--mask-replace",
                                  "0.8,0.1"])
    assert r.exit_code != 0 and "three shares" in r.output


def run_config(toy_corpus, instances, out, **kw):
    from bertkit.pretrain import PretrainConfig

    args = dict(instances=str(instances), out=str(out), model=str(toy_corpus / "model.json"), micro_batch=8,
                max_steps=4, log_every=1, eval_every=2, eval_batches=1, progress=False, num_workers=0,
                report_to="none")
    return PretrainConfig(**{**args, **kw})


@pytest.mark.parametrize("objective", ["sop", "none"])
def test_objectives_train_evaluate_and_export(toy_corpus, objective, clean_dist_env):
    import transformers

    from bertkit.pretrain import export, pretrain

    inst = toy_corpus / f"inst-{objective}"
    m = make_instances(toy_corpus / "corpus", toy_corpus / "vocab.txt", inst,
                       InstancesConfig(max_seq_length=32, objective=objective, mode="dynamic"), progress=False)
    assert m.objective == objective
    run = toy_corpus / f"run-{objective}"
    pretrain(run_config(toy_corpus, inst, run))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    keys = set().union(*records)
    if objective == "sop":
        assert {"sop_loss", "sop_acc", "eval_sop_acc"} <= keys and not any(k.startswith("nsp") for k in keys)
    else:
        assert not any("nsp" in k or "sop" in k for k in keys) and "eval_mlm_acc" in keys
        ref = [r["loss"] for r in records if "loss" in r]
        assert ref == pytest.approx([r["mlm_loss"] for r in records if "loss" in r])  # MLM alone
    out = export(run, toy_corpus / f"export-{objective}")
    config = json.loads((out / "config.json").read_text())
    assert config["bertkit"]["objective"] == objective
    expected = "BertForMaskedLM" if objective == "none" else "BertForPreTraining"
    assert config["architectures"] == [expected]
    # nothing trained [CLS] without a sentence task: bertkit's classifiers then read the mean over the tokens
    assert config.get("classifier_pooling") == ("mean" if objective == "none" else None)
    _, info = getattr(transformers, expected).from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    r = CliRunner().invoke(main, ["fill-mask", "--model", str(out), "w1 w2 [MASK] w3"])
    assert r.exit_code == 0, r.output
    card = (out / "README.md").read_text(encoding="utf-8")
    held = [r for r in records if "eval_loss" in r][-1]
    assert f"held-out masked-token accuracy {100 * held['eval_mlm_mask_acc']:.1f} %" in card
    assert "- sequence length: 32 tokens" in card and f"{records[-1]['step']} steps" in card
    if objective == "none":   # a sentence encoder says the length it was trained at, not its positions' count
        assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 32
        assert config["max_position_embeddings"] > 32 and "SentenceTransformer" in card


def test_pad_vocab_to_64(toy_corpus, clean_dist_env):
    import transformers

    from bertkit.pretrain import export, load_run_state_dict, pretrain

    inst = toy_corpus / "inst-pad"
    make_instances(toy_corpus / "corpus", toy_corpus / "vocab.txt", inst, InstancesConfig(max_seq_length=32, dupe=1),
                   progress=False)
    run = toy_corpus / "run-pad"
    pretrain(run_config(toy_corpus, inst, run, pad_vocab_to=64))
    state, _, _ = load_run_state_dict(run)
    vocab = len(toy_vocab())
    rows = state["bert.embeddings.word_embeddings.weight"].shape[0]
    assert rows % 64 == 0 and rows >= vocab and torch.all(state["bert.embeddings.word_embeddings.weight"][vocab:] == 0)
    out = export(run, toy_corpus / "export-pad")
    model = transformers.BertForPreTraining.from_pretrained(str(out))
    assert model.bert.embeddings.word_embeddings.weight.shape[0] == vocab  # export trims the padding


@pytest.mark.parametrize("task", ["classify", "ner", "squad"])
def test_packed_finetuning_matches_padded(tmp_path, task):
    from bertkit.finetune.classify import finetune_classify
    from bertkit.finetune.ner import finetune_ner
    from bertkit.finetune.squad import finetune_squad
    from bertkit.finetune.train import TrainConfig
    from bertkit.models import save_pretrained
    from bertkit.models.bert import BertForPreTraining
    from bertkit.models.bert_config import BertConfig

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(27)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    cfg = BertConfig.preset("tiny", vocab_size=len(vocab), hidden_dropout=0.0, attention_dropout=0.0)
    save_pretrained(BertForPreTraining(cfg), tmp_path / "model", tokenizer_dir=tmp_path)
    rng = random.Random(0)
    if task == "classify":
        rows = ["text\tlabel"] + [" ".join(f"w{rng.randrange(27)}" for _ in range(rng.randint(2, 12))) + f"\t{i % 2}"
                                  for i in range(48)]
        (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    elif task == "squad":  # contexts of 4-30 words, some longer than a window, so windows differ in length
        paragraphs = []
        for i in range(16):
            words = [f"w{rng.randrange(27)}" for _ in range(rng.randint(4, 30))]
            a = rng.randrange(len(words) - 1)
            answer = " ".join(words[a:a + 2])
            paragraphs.append({"context": " ".join(words), "qas": [{"id": str(i), "question": f"w{i} w{i + 1}",
                               "answers": [{"text": answer, "answer_start": len(" ".join(words[:a] + [""]))}]}]})
        (tmp_path / "train.json").write_text(json.dumps({"version": "1.1", "data": [{"title": "t",
                                                                                      "paragraphs": paragraphs}]}))
    else:
        sents = [[(f"w{rng.randrange(27)}", rng.choice(["O", "B-PER", "I-PER"])) for _ in range(rng.randint(2, 10))]
                 for _ in range(48)]
        (tmp_path / "train.txt").write_text("\n\n".join("\n".join(f"{w} X X {t}" for w, t in s) for s in sents) + "\n")

    def losses(unpadded):
        out = tmp_path / f"out-{unpadded}"
        tc = TrainConfig(out_dir=str(out), epochs=2, batch_size=8, learning_rate=1e-3, save_model=False, log_every=1,
                         report_to="none", unpadded=unpadded, precision="fp32")  # bf16 rounds each layout apart
        if task == "classify":
            finetune_classify(tmp_path / "model", tmp_path / "train.tsv", tmp_path / "train.tsv", tc, text_a="text",
                              max_seq_length=16)
        elif task == "squad":
            finetune_squad(tmp_path / "model", tmp_path / "train.json", tmp_path / "train.json", tc, max_seq_length=24,
                           window_step=8, max_query_length=4)
        else:
            finetune_ner(tmp_path / "model", tmp_path / "train.txt", tmp_path / "train.txt", tc, max_seq_length=16)
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in records if "loss" in r], [r["padding_efficiency"] for r in records if "loss" in r]

    padded, eff_padded = losses(False)
    packed, eff_packed = losses(True)
    assert packed == pytest.approx(padded, rel=1e-5, abs=1e-6)
    # packed: only the tail that rounds each batch's size (at most a sixteenth) is not a real token
    assert all(15 / 16 <= e <= 1.0 for e in eff_packed) and min(eff_padded) < 0.9


def test_a_recipe_fills_only_what_the_flags_and_the_deepspeed_config_leave():
    from bertkit.pretrain.config import ConfigError, PretrainConfig
    from bertkit.recipes import RECIPES

    plain = PretrainConfig(instances="i", out="o").with_recipe()
    assert plain.warmup == 0.01 and plain.objective is plain.optimizer is plain.lr is plain.dropout is None
    budget = PretrainConfig(instances="i", out="o", recipe="budget").with_recipe()
    assert {k: getattr(budget, k) for k in RECIPES["budget"]["pretrain"]} == RECIPES["budget"]["pretrain"]
    assert RECIPES["budget"]["pretrain"]["objective"] == "mlm" and RECIPES["budget"]["pretrain"]["dropout"] == 0.0
    mine = PretrainConfig(instances="i", out="o", recipe="budget", lr=3e-3, warmup=0.0, dropout=0.1).with_recipe(
        {"optimizer": {"type": "Lamb"}})
    # the flags win; the DeepSpeed file's optimizer wins over the recipe's (no contradiction to report)
    assert (mine.lr, mine.warmup, mine.dropout, mine.optimizer, mine.objective) == (3e-3, 0.0, 0.1, None, "mlm")
    with pytest.raises(ConfigError, match="--recipe 'fast': choose one of budget"):
        PretrainConfig(instances="i", out="o", recipe="fast").with_recipe()


def test_the_budget_recipe_builds_modernbert_tiny_and_gives_each_family_its_rate(tmp_path):
    """No --model: modernbert-tiny at its measured 3e-3; a BERT model (a preset or a BERT config file) at BERT tiny's
    1e-3; a ModernBERT preset at 3e-3; a rate given wins over both."""
    from bertkit.pretrain.config import PretrainConfig
    from bertkit.pretrain.start import spec_family

    def planned(**given):
        cfg = PretrainConfig(instances="i", out="o", recipe="budget", **given)
        cfg = cfg.with_recipe(None, lambda model: spec_family(model, cfg.init_from))
        return cfg.model, cfg.lr

    (tmp_path / "bert.json").write_text(json.dumps(TINY))
    assert planned() == ("modernbert-tiny", 3e-3)
    assert planned(model="tiny") == ("tiny", 1e-3)
    assert planned(model=str(tmp_path / "bert.json")) == (str(tmp_path / "bert.json"), 1e-3)
    assert planned(model="modernbert-mini") == ("modernbert-mini", 3e-3)
    assert planned(model="tiny", lr=5e-4) == ("tiny", 5e-4)


def test_pretrain_recipe_budget_end_to_end(toy_corpus, clean_dist_env):
    inst = toy_corpus / "inst-recipe"
    r = CliRunner().invoke(main, ["make-instances", str(toy_corpus / "corpus"), "--tokenizer",
                                  str(toy_corpus / "vocab.txt"), "--out", str(inst), "--recipe", "budget",
                                  "--max-seq-length", "32", "--no-progress"])  # the flag wins over the recipe's 64
    assert r.exit_code == 0 and "recipe budget: --max-seq-length 64 --objective none --mode dynamic" in r.output
    manifest = json.loads((inst / "manifest.json").read_text())
    assert (manifest["max_seq_length"], manifest["objective"], manifest["mode"]) == (32, "none", "dynamic")
    run = toy_corpus / "run-recipe"
    r = CliRunner().invoke(main, ["pretrain", "--instances", str(inst), "--out", str(run), "--model",
                                  str(toy_corpus / "model.json"), "--recipe", "budget", "--lr", "2e-3",
                                  "--max-steps", "3", "--micro-batch", "8", "--eval-every", "3", "--eval-batches", "1",
                                  "--num-workers", "0", "--report-to", "none", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "recipe budget: --model modernbert-tiny --objective mlm --dropout 0 --optimizer adamw --lr 0.001 " \
           f"--warmup 0.05 --micro-batch 64; yours win: --model {toy_corpus / 'model.json'} --lr 0.002 " \
           "--micro-batch 8" in r.output  # a BERT model: the recipe's BERT rate
    assert "was measured on instances made with `make-instances --recipe budget`" in r.output  # 32, not 64 tokens
    config = json.loads((run / "config.json").read_text())
    assert config["objective"] == "none" and config["pretrain"]["recipe"] == "budget"
    assert config["resolved"]["micro_batch"] == 8
    assert config["resolved"]["optimizer"] == "adamw" and config["resolved"]["lr"] == 2e-3
    assert config["pretrain"]["warmup"] == 0.05
    assert config["model"]["hidden_dropout"] == config["model"]["attention_dropout"] == 0.0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert records and not any("nsp" in k for r in records for k in r)  # the NSP labels are not trained on
    # dropout 0 was a pretraining choice: the export keeps the model's own (0.1) for fine-tuning, as cramming does
    assert config["model"]["export_dropout"] == {"hidden": 0.1, "attention": 0.1}
    r = CliRunner().invoke(main, ["export", str(run), "--out", str(toy_corpus / "export-recipe")])
    assert r.exit_code == 0 and "export: dropout 0.1 (attention 0.1) in config.json" in r.output, r.output
    hf = json.loads((toy_corpus / "export-recipe" / "config.json").read_text())
    assert hf["hidden_dropout_prob"] == hf["attention_probs_dropout_prob"] == 0.1
    r = CliRunner().invoke(main, ["pretrain", "--instances", str(inst), "--out", str(run), "--model",
                                  str(toy_corpus / "model.json"), "--recipe", "budget", "--lr", "2e-3",
                                  "--max-steps", "4", "--micro-batch", "8", "--eval-every", "0", "--num-workers", "0",
                                  "--report-to", "none", "--no-progress", "--resume"])
    assert r.exit_code == 0, r.output
    config = json.loads((run / "config.json").read_text())  # the resumed run trains on without dropout
    assert config["model"]["hidden_dropout"] == 0.0 and config["model"]["export_dropout"]["hidden"] == 0.1
    bad = CliRunner().invoke(main, ["pretrain", "--instances", str(inst), "--recipe", "fast"])
    assert bad.exit_code == 2 and "Invalid value for '--recipe': 'fast'" in bad.output


def test_make_instances_applies_every_key_of_a_recipe(toy_corpus, monkeypatch):
    """Any InstancesConfig field a recipe names is applied (not only the three the budget recipe has), and a key no
    flag has fails loudly instead of being dropped."""
    from bertkit.recipes import RECIPES

    monkeypatch.setitem(RECIPES["budget"], "make-instances", {"max_seq_length": 48, "masked_lm_prob": 0.3})
    args = ["make-instances", str(toy_corpus / "corpus"), "--tokenizer", str(toy_corpus / "vocab.txt"), "--recipe",
            "budget", "--no-progress", "--dupe", "1"]
    r = CliRunner().invoke(main, [*args, "--out", str(toy_corpus / "inst-keys")])
    assert r.exit_code == 0, r.output
    manifest = json.loads((toy_corpus / "inst-keys" / "manifest.json").read_text())
    assert manifest["max_seq_length"] == 48 and manifest["masking"]["masked_lm_prob"] == 0.3
    monkeypatch.setitem(RECIPES["budget"], "make-instances", {"max_seq_lenght": 48})
    r = CliRunner().invoke(main, [*args, "--out", str(toy_corpus / "inst-typo")])
    assert r.exit_code != 0 and "max_seq_lenght" in str(r.exception)


def test_a_budget_run_from_before_the_recipe_named_a_model_resumes_as_itself(toy_corpus, clean_dist_env):
    """A `--recipe budget` run started without --model recorded no model (the recipe named none then): resumed, it
    keeps its own shape and rate rather than taking the recipe's modernbert-tiny (a change --resume refuses)."""
    inst, run = toy_corpus / "inst-old", toy_corpus / "run-old"
    r = CliRunner().invoke(main, ["make-instances", str(toy_corpus / "corpus"), "--tokenizer",
                                  str(toy_corpus / "vocab.txt"), "--out", str(inst), "--recipe", "budget",
                                  "--max-seq-length", "32", "--no-progress"])
    assert r.exit_code == 0, r.output
    args = ["pretrain", "--instances", str(inst), "--out", str(run), "--recipe", "budget", "--micro-batch", "8",
            "--eval-every", "0", "--num-workers", "0", "--report-to", "none", "--no-progress"]
    r = CliRunner().invoke(main, args + ["--model", str(toy_corpus / "model.json"), "--max-steps", "2"])
    assert r.exit_code == 0, r.output
    config = json.loads((run / "config.json").read_text())
    shape = config["model"]
    config["pretrain"]["model"] = None  # as such a run recorded it
    (run / "config.json").write_text(json.dumps(config))
    r = CliRunner().invoke(main, args + ["--max-steps", "3", "--resume"])
    assert r.exit_code == 0, r.output
    resumed = json.loads((run / "config.json").read_text())
    assert resumed["model"] == shape and resumed["resolved"]["lr"] == 1e-3
