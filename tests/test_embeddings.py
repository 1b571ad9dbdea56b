"""Sentence embeddings (issue 71): the loss and its gradient caching against the whole batch and against
sentence-transformers' own loss, the saved folder against SentenceTransformer, the scores against
sentence-transformers' evaluators, and `finetune embed` / `evaluate-embeddings` / `encode` end to end."""
import json
import random

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.embeddings.data import corpus_passages, corpus_sentences, read_pairs
from bertkit.embeddings.encoder import EncoderConfig, SentenceEncoder
from bertkit.embeddings.evaluate import (
    Retrieval,
    StsPair,
    evaluate_retrieval,
    evaluate_sts,
    exact_top,
    ranking_metrics,
    reciprocal_rank_fusion,
    tuned_hybrid,
    weighted_fusion,
)
from bertkit.embeddings.loss import cached_step, info_nce
from bertkit.embeddings.train import EmbedConfig, batches_without_duplicates, train_embeddings
from bertkit.errors import DataError
from tests.helpers import tiny_model_folder, write_corpus

st = pytest.importorskip("sentence_transformers")


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(27)}" for _ in range(rng.randrange(3, 12))) for _ in range(n)]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return tiny_model_folder(tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="module")
def modernbert_dir(tmp_path_factory):
    from bertkit.models import save_pretrained
    from bertkit.models.modernbert import ModernBertConfig, ModernBertForMaskedLM

    root = tmp_path_factory.mktemp("modernbert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(27)]
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(ModernBertConfig.from_spec("modernbert-tiny", len(vocab)))
    return save_pretrained(model, root / "model", tokenizer_dir=root)


def grads(module) -> dict:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def test_a_length_beyond_the_models_positions_is_refused_at_once_and_a_folders_record_is_checked(bert_dir, tmp_path):
    """Said when the command starts, not at the first long text hours later: the model's positions are the limit
    (the tiny BERT's: its config's max_position_embeddings). A folder recording more (a tokenizer's
    model_max_length of 8192 on a 512-position BERT) is read at the positions, as sentence-transformers reads it;
    a pooling record that is not what bertkit writes is named, not a TypeError."""
    import json
    import shutil

    positions = json.loads((bert_dir / "config.json").read_text())["max_position_embeddings"]
    (tmp_path / "t.txt").write_text("w1 w2\n")
    for command in (["encode", str(bert_dir), str(tmp_path / "t.txt"), "--out", str(tmp_path / "e.arrow")],
                    ["evaluate-embeddings", str(bert_dir), "--sts", "stsb-dev"]):
        r = CliRunner().invoke(main, command + ["--max-seq-length", str(positions + 1)])
        assert r.exit_code == 1 and f"give --max-seq-length of at most {positions}" in r.output, r.output
    assert not (tmp_path / "e.arrow").exists()
    with pytest.raises(DataError, match="leaves no room"):
        SentenceEncoder.from_folder(bert_dir, EncoderConfig(max_seq_length=2))
    folder = tmp_path / "recorded"
    shutil.copytree(bert_dir, folder)
    (folder / "bertkit_embedding.json").write_text(json.dumps({"pooling": "mean", "max_seq_length": 10 ** 6}))
    assert SentenceEncoder.from_folder(folder).cfg.max_seq_length == positions
    for bad in ('{"pooling": "mean", "layers": 3}', '[1, 2]', '{"pooling": "max"}', '{"max_seq_length": "64"}'):
        (folder / "bertkit_embedding.json").write_text(bad)
        with pytest.raises(DataError, match="bertkit_embedding.json: "):
            SentenceEncoder.from_folder(folder)


def test_gradient_caching_gives_the_whole_batch_gradient(bert_dir):
    """Without dropout any mini-batch gives the whole batch's loss and gradient; with dropout, the second pass
    replays the first's masks, so the gradient is that of the same masks taken with a graph (a wrong replay differs
    by the gradient's own size)."""
    enc = SentenceEncoder.from_folder(bert_dir, EncoderConfig(max_seq_length=16))
    cols = [enc.features(sentences(10, s)) for s in (1, 2, 3)]

    def plain(mini):
        embs = [torch.cat([enc(c[i:i + mini]) for i in range(0, len(c), mini)]) for c in cols]
        loss = info_nce(*embs, symmetric=True)
        loss.backward()
        return loss.item()

    for mode in ("eval", "train"):
        getattr(enc, mode)()
        runs = []
        for how in ("cached 3", "cached 64", "plain 3"):
            enc.zero_grad()
            torch.manual_seed(0)
            mini = int(how.split()[1])
            loss = cached_step(enc, cols, mini, 20.0, True) if how.startswith("cached") else plain(mini)
            runs.append((how, loss, grads(enc)))
        size = max(g.abs().max().item() for g in runs[2][2].values())
        assert size > 1e-3
        for how, loss, g in runs:
            if mode == "train" and how == "cached 64":
                continue  # other chunks draw other masks: not comparable
            assert loss == pytest.approx(runs[2][1], abs=1e-6), (mode, how)
            assert max((g[n] - runs[2][2][n]).abs().max().item() for n in g) < 1e-5 * max(1.0, size), (mode, how)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("negatives", [False, True])
def test_info_nce_equals_sentence_transformers_loss(bert_dir, symmetric, negatives):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    model = st.SentenceTransformer(str(bert_dir), device="cpu")
    directions = ("query_to_doc", "doc_to_query") if symmetric else ("query_to_doc",)
    loss = MultipleNegativesRankingLoss(model, scale=20.0, directions=directions,
                                        partition_mode="per_direction" if symmetric else "joint")
    g = torch.Generator().manual_seed(0)
    embs = [torch.randn(6, 8, generator=g) for _ in range(3 if negatives else 2)]
    theirs = loss.compute_loss_from_embeddings(embs, None).item()
    assert info_nce(*embs, scale=20.0, symmetric=symmetric) == pytest.approx(theirs, rel=1e-5)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
@pytest.mark.parametrize("pooling,normalize", [("mean", False), ("cls", True), ("last", False)])
def test_saved_folder_is_a_sentence_transformers_model_with_our_vectors(bert_dir, modernbert_dir, tmp_path, family,
                                                                        pooling, normalize):
    folder = bert_dir if family == "bert" else modernbert_dir
    enc = SentenceEncoder.from_folder(folder, EncoderConfig(pooling, 16, normalize))
    out = enc.save(tmp_path / "emb", folder)
    texts = sentences(9, 4) + ["w1 " * 30]   # one longer than max_seq_length: cut alike
    ours = SentenceEncoder.from_folder(out).encode(texts, batch_size=4)
    theirs = st.SentenceTransformer(str(out), device="cpu").encode(texts, batch_size=3, convert_to_numpy=True)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0) == normalize


def test_a_folder_sentence_transformers_saved_is_read_at_its_length(bert_dir, tmp_path):
    # sentence-transformers 6 keeps max_seq_length only in the tokenizer's config: read at 128 instead, its long
    # texts (KorQuAD's paragraphs) would be embedded from twice the tokens it trained on
    model = st.SentenceTransformer(str(bert_dir), device="cpu")
    model.max_seq_length = 16
    model.save(str(tmp_path / "st"))
    texts = sentences(5, 4) + ["w1 w2 " * 20, "w3 " * 40]
    ours = SentenceEncoder.from_folder(tmp_path / "st")
    assert ours.cfg.max_seq_length == 16
    theirs = st.SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(ours.encode(texts, batch_size=3), theirs, atol=1e-5)


def test_scores_equal_sentence_transformers_evaluators(bert_dir):
    from sentence_transformers.sentence_transformer.evaluation import (
        EmbeddingSimilarityEvaluator,
        InformationRetrievalEvaluator,
    )

    enc = SentenceEncoder.from_folder(bert_dir)
    model = st.SentenceTransformer(str(bert_dir), device="cpu")
    rng = random.Random(0)
    a, b = sentences(40, 5), sentences(40, 6)
    gold = [rng.uniform(0, 5) for _ in a]
    ours = evaluate_sts(enc, [StsPair(x, y, s) for x, y, s in zip(a, b, gold)])
    theirs = EmbeddingSimilarityEvaluator(a, b, gold)(model)
    assert ours["spearman"] == pytest.approx(theirs["spearman_cosine"], abs=1e-6)
    assert ours["pearson"] == pytest.approx(theirs["pearson_cosine"], abs=1e-6)

    corpus = sentences(30, 7)
    relevant = [rng.randrange(30) for _ in range(25)]
    queries = [" ".join(corpus[r].split()[:3]) for r in relevant]
    ours = evaluate_retrieval(enc, Retrieval(queries, corpus, relevant))
    ir = InformationRetrievalEvaluator({str(i): q for i, q in enumerate(queries)},
                                       {str(i): c for i, c in enumerate(corpus)},
                                       {str(i): {str(r)} for i, r in enumerate(relevant)},
                                       accuracy_at_k=[1, 5, 10], precision_recall_at_k=[1, 5, 10], mrr_at_k=[10],
                                       ndcg_at_k=[10], map_at_k=[10])(model)
    for k in ("recall@1", "recall@5", "recall@10", "mrr@10", "ndcg@10"):
        assert ours[k] == pytest.approx(ir[f"cosine_{k}"], abs=1e-6), k


def test_ranking_metrics_by_hand():
    top = np.array([[3, 1, 2, 0, 4, 5, 6, 7, 8, 9], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]])
    m = ranking_metrics(top, [3, 4, 10])   # ranks 1, 5, none
    assert m["recall@1"] == pytest.approx(1 / 3) and m["recall@5"] == pytest.approx(2 / 3)
    assert m["mrr@10"] == pytest.approx((1 + 1 / 5) / 3)
    assert m["ndcg@10"] == pytest.approx((1 + 1 / np.log2(6)) / 3)
    q = np.eye(3, 4, dtype=np.float32)
    assert exact_top(q, np.eye(4, dtype=np.float32), k=2, block=2)[:, 0].tolist() == [0, 1, 2]


def test_reciprocal_rank_fusion_by_hand():
    dense, bm25 = np.array([[4, 1, 2]]), np.array([[2, 3, 4]])
    # 4: 1/61 + 1/63, 2: 1/63 + 1/61 (a tie: the lower index first), 1: 1/62, 3: 1/62
    assert reciprocal_rank_fusion(dense, bm25, k=60).tolist() == [[2, 4, 1, 3]]


def test_weighted_fusion_and_its_weight_chosen_on_other_queries():
    dense = np.array([[0.9, 0.1, 0.5], [0.2, 0.3, 0.1]])
    bm25 = np.array([[0.0, 10.0, 5.0], [4.0, 0.0, 2.0]])
    # scaled per query: dense [1, 0, .5] / [.5, 1, 0], bm25 [0, 1, .5] / [1, 0, .5]
    # at 0.5: [.5, .5, .5] (a tie: by index) / [.75, .5, .25]
    assert weighted_fusion(dense, bm25, 0.5, k=3).tolist() == [[0, 1, 2], [0, 1, 2]]
    assert weighted_fusion(dense, bm25, 1.0, k=1).tolist() == [[0], [1]]
    rng = np.random.default_rng(0)
    relevant = list(rng.integers(0, 50, 40))
    perfect = np.eye(50)[relevant] + 0.01 * rng.random((40, 50))
    noise = rng.random((40, 50))
    assert tuned_hybrid(noise, perfect, relevant)["weight"] == 0.0   # BM25 perfect, dense noise: BM25 alone
    got = tuned_hybrid(perfect, noise, relevant)
    assert got["weight"] >= 0.5 and got["fused"]["recall@1"] == 1.0 and got["queries"] == 20   # ties: the first


def test_pooling_read_from_either_sentence_transformers_format(tmp_path):
    from bertkit.embeddings.encoder import saved_config

    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text('{"embedding_dimension": 8, "pooling_mode": "lasttoken"}')
    (tmp_path / "modules.json").write_text(json.dumps([
        {"path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {"path": "1_Pooling", "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"},
        {"path": "2_Normalize", "type": "sentence_transformers.base.modules.normalize.Normalize"}]))
    assert (saved_config(tmp_path).pooling, saved_config(tmp_path).normalize) == ("last", True)
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    assert saved_config(tmp_path).pooling == "cls"
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode": "max"}')
    with pytest.raises(DataError, match="1_Pooling/config.json: bertkit pools by mean, cls or lasttoken"):
        saved_config(tmp_path)


def test_batches_hold_no_text_twice_and_use_every_row():
    rng = random.Random(1)
    rows = [(f"q{rng.randrange(40)}", f"d{rng.randrange(60)}") for _ in range(300)]
    batches = batches_without_duplicates(rows, 16, np.random.default_rng(0))
    for b in batches:
        texts = [t for i in b for t in rows[i]]
        assert len(texts) == len(set(texts)) and 2 <= len(b) <= 16
    used = sorted(i for b in batches for i in b)
    assert len(used) == len(set(used)) and len(used) >= 290   # only lone rows that fit nowhere are dropped
    assert batches == batches_without_duplicates(rows, 16, np.random.default_rng(0))


def test_pairs_files_and_their_errors(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"q": "w1 w2", "d": "w3", "n": "w4"}\n{"q": "w5", "d": "w6", "n": "w7"}\n')
    assert read_pairs(tmp_path / "p.jsonl", "q", "d", "n") == [("w1 w2", "w3", "w4"), ("w5", "w6", "w7")]
    (tmp_path / "p.csv").write_text('anchor,positive\n"w1, w2",w3\nw5,w6\n')
    assert read_pairs(tmp_path / "p.csv") == [("w1, w2", "w3"), ("w5", "w6")]
    (tmp_path / "p.tsv").write_text("anchor\tpositive\nw1\tw3\nw5\t \n")
    with pytest.raises(DataError, match=r"p.tsv:3: an empty text"):
        read_pairs(tmp_path / "p.tsv")
    with pytest.raises(DataError, match=r"p.jsonl:1: no column 'anchor'.*--anchor"):
        read_pairs(tmp_path / "p.jsonl")


def test_nli_files_give_premise_entailment_contradiction(tmp_path):
    from bertkit.embeddings.data import nli_triplets

    (tmp_path / "nli.tsv").write_text("sentence1\tsentence2\tgold_label\n" "p1\te1\tentailment\n" "p1\tn1\tneutral\n"
                                      "p1\tc1\tcontradiction\n" "p2\te2\tentailment\n" "p3\tc3\tcontradiction\n"
                                      "p3\te3\tentailment\n" "p3\te3b\tentailment\n")
    assert nli_triplets(tmp_path / "nli.tsv") == [("p1", "e1", "c1"), ("p3", "e3", "c3")]   # p2 has no contradiction
    (tmp_path / "one.tsv").write_text("sentence1\tsentence2\tgold_label\np1\te1\tentailment\n")
    with pytest.raises(DataError, match="one.tsv: 0 premise"):
        nli_triplets(tmp_path / "one.tsv")


def test_simcse_sentences_are_a_seeded_sample_of_the_corpus(tmp_path):
    docs = [[f"sentence number {i} of document {d}" for i in range(5)] for d in range(40)]
    one = write_corpus(tmp_path / "one", [docs])
    two = write_corpus(tmp_path / "two", [docs[:13], docs[13:]])   # the same text in two shards
    picked = corpus_sentences(one, 50, seed=3)
    assert len(picked) == 50 and all(a == b for a, b in picked) and len({a for a, _ in picked}) == 50
    assert picked == corpus_sentences(two, 50, seed=3)
    assert picked != corpus_sentences(one, 50, seed=4)
    assert len(corpus_sentences(one, 10_000, seed=3)) == 200


def test_ict_pairs_are_a_sentence_against_the_rest_of_its_passage(tmp_path):
    # 30 documents of 7 sentences, passages of 3: sentences 0-2 and 3-5 of each; the seventh alone is no passage
    docs = [[f"document {d} sentence {i} words" for i in range(7)] for d in range(30)]
    passages = {tuple(doc[i:i + 3]) for doc in docs for i in (0, 3)}
    one = write_corpus(tmp_path / "one", [docs])
    rows = corpus_passages(one, 1000, seed=5, sentences=3, keep_query=0.5)
    assert len(rows) == len(passages) == 60
    kept = 0
    for query, positive in rows:
        source = next(p for p in passages if query in p)
        rest = " ".join(s for s in source if s != query)
        assert positive in (rest, " ".join(source))
        kept += positive == " ".join(source)
    assert 15 <= kept <= 45   # about half, as asked
    assert not any("sentence 6" in q + p for q, p in rows)
    two = write_corpus(tmp_path / "two", [docs[:11], docs[11:]])
    assert corpus_passages(two, 20, seed=5, sentences=3) == corpus_passages(one, 20, seed=5, sentences=3)
    assert corpus_passages(one, 20, seed=5, sentences=3) != corpus_passages(one, 20, seed=6, sentences=3)
    assert all(q not in p for q, p in corpus_passages(one, 60, seed=5, sentences=3, keep_query=0.0))
    with pytest.raises(DataError, match="0 passage"):
        corpus_passages(write_corpus(tmp_path / "short", [[["one sentence only here"]]]), 10, seed=0)


def pairs_file(path, n=96):
    """Pairs a tiny model can learn: a positive shares its anchor's first two words."""
    rows = []
    for s in sentences(n, 9):
        w = s.split()
        rows.append({"anchor": " ".join(w[:2] + w[::-1][:3]), "positive": " ".join(w[:2] + w[2:5])})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_finetune_embed_end_to_end_and_resumes_to_the_same_weights(bert_dir, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    import bertkit.embeddings.train as train_module

    pairs = pairs_file(tmp_path / "pairs.jsonl")
    sts = tmp_path / "sts.tsv"
    sts.write_text("sentence1\tsentence2\tscore\n" + "".join(
        f"{a}\t{b}\t{s}\n" for a, b, s in zip(sentences(20, 1), sentences(20, 2), range(20))))
    args = ["finetune", "embed", "--model", str(bert_dir), "--pairs", str(pairs), "--batch-size", "16",
            "--mini-batch", "5", "--epochs", "3", "--lr", "1e-3", "--save-every", "4", "--sts", str(sts)]
    result = CliRunner().invoke(main, args + ["--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    out = tmp_path / "a"
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0] * 0.7, losses
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 18 and set(summary["scores"]["sts"][str(sts)]) == {"pairs", "model",
                                                                                    "character_overlap"}
    assert not (out / "checkpoint").exists()
    from bertkit.verify import verify_folder

    verdict = verify_folder(out)
    assert verdict.checked >= 5 and not verdict.damaged and not verdict.notes
    with open(out / "model" / "model.safetensors", "r+b") as f:   # one byte changed: verify names the file
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 1]))
    assert any("model.safetensors" in d for d in verify_folder(out).damaged)
    with open(out / "model" / "model.safetensors", "r+b") as f:
        f.seek(200)
        f.write(byte)
    for f in (out / "model").rglob("*"):   # the model is ready to publish: no place on this machine named in it
        assert not f.is_file() or str(tmp_path) not in f.read_bytes().decode("utf-8", "replace"), f
    assert json.loads((out / "model" / "config.json").read_text())["bertkit_embedding"]["model"] == bert_dir.name
    saved = st.SentenceTransformer(str(out / "model"), device="cpu").encode(["w1 w2 w3"])
    np.testing.assert_allclose(SentenceEncoder.from_folder(out / "model").encode(["w1 w2 w3"]), saved, atol=1e-5)

    real_step = train_module.cached_step
    calls = {"n": 0}

    class Killed(Exception):
        pass

    def dies_at_step_7(*a, **k):
        calls["n"] += 1
        if calls["n"] == 7:
            raise Killed
        return real_step(*a, **k)

    monkeypatch.setattr(train_module, "cached_step", dies_at_step_7)
    with pytest.raises(Killed):
        CliRunner().invoke(main, args + ["--out", str(tmp_path / "b")], catch_exceptions=False)
    assert json.loads((tmp_path / "b" / "checkpoint" / "progress.json").read_text())["step"] == 4
    monkeypatch.setattr(train_module, "cached_step", real_step)
    result = CliRunner().invoke(main, args + ["--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    a, b = (load_file(tmp_path / x / "model" / "model.safetensors") for x in ("a", "b"))
    assert all(torch.equal(a[k], b[k]) for k in a)

    changed = CliRunner().invoke(main, args[:-2] + ["--out", str(tmp_path / "b"), "--temperature", "0.1"])
    assert changed.exit_code == 0  # a finished run's folder: a new run starts (no checkpoint left to mismatch)


def test_a_checkpoint_of_other_settings_is_refused(bert_dir, tmp_path, monkeypatch):
    import bertkit.embeddings.train as train_module

    rows = [(s, s) for s in sentences(24, 2)]
    real_step, calls = train_module.cached_step, []

    def dies_at_step_3(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("killed")
        return real_step(*a, **k)

    monkeypatch.setattr(train_module, "cached_step", dies_at_step_3)
    with pytest.raises(RuntimeError, match="killed"):
        train_embeddings(bert_dir, rows, EmbedConfig(out_dir=str(tmp_path / "o"), batch_size=4, save_every=2,
                                                     progress=False))
    monkeypatch.setattr(train_module, "cached_step", real_step)
    with pytest.raises(DataError, match=r"checkpoint: a run with other settings \(scale\)"):
        train_embeddings(bert_dir, rows, EmbedConfig(out_dir=str(tmp_path / "o"), batch_size=4, save_every=2,
                                                     scale=10.0, progress=False))


def test_only_the_checkpoint_files_it_wrote_are_removed(tmp_path):
    from bertkit.embeddings.train import CHECKPOINT_FILES, _drop_checkpoint

    folder = tmp_path / "checkpoint"
    folder.mkdir()
    for name in CHECKPOINT_FILES[:-1]:   # a user's files of our names, no progress.json of ours: all stay
        (folder / name).write_text("x")
    _drop_checkpoint(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == sorted(CHECKPOINT_FILES[:-1])
    (folder / "progress.json").write_text('{"my": "notes"}')
    _drop_checkpoint(tmp_path)
    assert len(list(folder.iterdir())) == 3
    (folder / "progress.json").write_text('{"step": 3, "settings": {}}')
    (folder / "yours.txt").write_text("keep")
    _drop_checkpoint(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == ["yours.txt"]
    (folder / "yours.txt").unlink()
    _drop_checkpoint(tmp_path)
    assert not folder.exists()


def test_embed_refuses_a_folder_of_the_users_files(bert_dir, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    cfg = EmbedConfig(out_dir=str(mine), batch_size=4, max_steps=1)
    with pytest.raises(Exception, match="notes.txt"):
        train_embeddings(bert_dir, [(s, s) for s in sentences(8, 1)], cfg)
    assert (mine / "notes.txt").read_text() == "keep me" and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_encode_and_evaluate_embeddings_commands(bert_dir, tmp_path):
    import pyarrow as pa

    texts = sentences(7, 3) + [""]
    (tmp_path / "t.txt").write_text("\n".join(texts) + "\n")
    result = CliRunner().invoke(main, ["encode", str(bert_dir), str(tmp_path / "t.txt"), "--out",
                                       str(tmp_path / "e.arrow"), "--batch-size", "3"])
    assert result.exit_code == 0, result.output
    table = pa.ipc.open_file(pa.memory_map(str(tmp_path / "e.arrow"))).read_all()
    assert table.column("text").to_pylist() == texts
    vectors = np.array(table.column("embedding").to_pylist(), dtype=np.float32)
    np.testing.assert_allclose(vectors, SentenceEncoder.from_folder(bert_dir).encode(texts), atol=1e-6)
    cut = CliRunner().invoke(main, ["encode", str(bert_dir), str(tmp_path / "t.txt"), "--out",
                                    str(tmp_path / "cut.arrow"), "--max-seq-length", "8"])
    assert cut.exit_code == 0, cut.output
    cut = np.array(pa.ipc.open_file(pa.memory_map(str(tmp_path / "cut.arrow"))).read_all()
                   .column("embedding").to_pylist(), dtype=np.float32)
    np.testing.assert_allclose(cut, SentenceEncoder.from_folder(bert_dir, EncoderConfig("mean", 8)).encode(texts),
                               atol=1e-6)
    assert not np.allclose(cut, vectors, atol=1e-3)   # texts of more than 8 tokens: other vectors

    squad = {"data": [{"title": "t", "paragraphs": [
        {"context": c, "qas": [{"id": f"{i}", "question": " ".join(c.split()[:2]), "answers": []}]}
        for i, c in enumerate(sentences(6, 8))]}]}
    (tmp_path / "squad.json").write_text(json.dumps(squad))
    result = CliRunner().invoke(main, ["evaluate-embeddings", str(bert_dir), "--retrieval",
                                       str(tmp_path / "squad.json"), "--out", str(tmp_path / "scores.json")])
    assert result.exit_code == 0, result.output
    row = json.loads((tmp_path / "scores.json").read_text())["retrieval"][str(tmp_path / "squad.json")]
    assert row["queries"] == 6 and row["documents"] == 6
    assert set(row) == {"queries", "documents", "model", "bm25_words", "bm25_character_bigrams", "hybrid_rrf",
                        "hybrid_weighted"}
    assert row["bm25_words"]["recall@10"] == 1.0   # 6 documents: every one is in the top 10
    result = CliRunner().invoke(main, ["evaluate-embeddings", "--sts", "korsts-dev"])
    assert result.exit_code != 0 and "--floors-only" in result.output

    # an --out that names a file of the user's is refused, and the file kept; the command's own output is replaced
    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "notes"}')
    for args in (["encode", str(bert_dir), str(tmp_path / "t.txt"), "--out", str(mine)],
                 ["evaluate-embeddings", str(bert_dir), "--retrieval", str(tmp_path / "squad.json"), "--out",
                  str(mine)]):
        refused = CliRunner().invoke(main, args)
        assert refused.exit_code != 0 and "is not an output of this command" in refused.output
        assert mine.read_text() == '{"my": "notes"}'
    again = CliRunner().invoke(main, ["encode", str(bert_dir), str(tmp_path / "t.txt"), "--out",
                                      str(tmp_path / "e.arrow")])
    assert again.exit_code == 0, again.output
    same = CliRunner().invoke(main, ["encode", str(bert_dir), str(tmp_path / "t.txt"), "--out",
                                     str(tmp_path / "t.txt")])
    assert same.exit_code != 0 and "TEXT_FILE itself" in same.output


def test_embed_takes_one_source_and_an_nli_file(bert_dir, tmp_path):
    nli = tmp_path / "nli.tsv"
    nli.write_text("sentence1\tsentence2\tgold_label\n" + "".join(
        f"{p}\t{e}\tentailment\n{p}\t{c}\tcontradiction\n"
        for p, e, c in zip(sentences(6, 1), sentences(6, 2), sentences(6, 3))))
    both = CliRunner().invoke(main, ["finetune", "embed", "--model", str(bert_dir), "--nli", str(nli), "--corpus",
                                     str(tmp_path), "--out", str(tmp_path / "o")])
    assert both.exit_code != 0 and "give one of --pairs" in both.output
    named = CliRunner().invoke(main, ["finetune", "embed", "--model", str(bert_dir), "--nli", "klue-nli", "--out",
                                      str(tmp_path / "o")])
    assert named.exit_code != 0 and "klue-nli: a published set's name needs --data-dir" in named.output
    ok = CliRunner().invoke(main, ["finetune", "embed", "--model", str(bert_dir), "--nli", str(nli), "--out",
                                   str(tmp_path / "o"), "--batch-size", "3", "--mini-batch", "2"])
    assert ok.exit_code == 0, ok.output
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["settings"]["rows"] == 6 and summary["steps"] == 2

    # SimCSE from a corpus folder, both directions of the loss: 12 of the corpus' sentences, each its own positive
    corpus = write_corpus(tmp_path / "corpus", [[[f"w{i} w{j} w{i + j} w1 w2" for j in range(3)] for i in range(9)]])
    simcse = CliRunner().invoke(main, ["finetune", "embed", "--model", str(bert_dir), "--corpus", str(corpus),
                                       "--sentences", "12", "--symmetric", "--batch-size", "6", "--out",
                                       str(tmp_path / "s")])
    assert simcse.exit_code == 0, simcse.output
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["settings"]["rows"] == 12 and summary["settings"]["symmetric"] and summary["steps"] == 2

    # the Inverse Cloze Task from the same folder: 9 passages of 2 sentences (the third of each document alone)
    alone = CliRunner().invoke(main, ["finetune", "embed", "--model", str(bert_dir), "--ict", "--pairs",
                                      str(pairs_file(tmp_path / "p.jsonl")), "--out", str(tmp_path / "i")])
    assert alone.exit_code != 0 and "--ict makes pairs from a corpus folder" in alone.output
    ict = CliRunner().invoke(main, ["finetune", "embed", "--model", str(bert_dir), "--corpus", str(corpus), "--ict",
                                    "--passage-sentences", "2", "--batch-size", "5", "--out", str(tmp_path / "i")])
    assert ict.exit_code == 0, ict.output
    assert json.loads((tmp_path / "i" / "summary.json").read_text())["settings"]["rows"] == 9
