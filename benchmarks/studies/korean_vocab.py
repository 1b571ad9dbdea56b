"""Korean vocabularies: plain WordPiece against morpheme-aware WordPiece (KLUE's recipe, `train-tokenizer
--pretokenize mecab|kiwi`), on the Korean WikiExtractor sample's held-out split.

For each vocabulary: [UNK] rate and pieces per word (train-tokenizer's own statistics), the share of pieces of
Korean words that straddle a morpheme boundary (against MeCab-ko and against Kiwi), and held-out MLM accuracy after
the same small pretraining budget (the transfer benchmark's pretraining code, benchmarks/lib/transfer.py), also on
[MASK] positions only against each vocabulary's unigram baseline (the targets differ between vocabularies).

    python benchmarks/studies/korean_vocab.py [--steps 800] [--vocab-size 12000]

Resumable (every stage's output is kept under --work). Prints a table, writes benchmarks/results/korean_vocab.json.
"""
import argparse
import os
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from benchlib import SHARED, done, masked_only_accuracy, say
from record import run_info, write_result
from transfer import BUDGETS, KO_FILL_MASK, curves, fill_mask, pretrain_run

MODES = ("none", "mecab", "kiwi")


def main(argv=None):
    from bertkit.fileio import read_arrow
    from bertkit.formats import corpus_shards, read_tokenizer_manifest
    from bertkit.pipelines.korean import crossing_share
    from bertkit.pipelines.make_instances import InstancesConfig, make_instances
    from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus
    from bertkit.pipelines.train_tokenizer import TokenizerConfig, train_tokenizer
    from bertkit.tokenization import load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "bertkit-korean-vocab")
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--vocab-size", type=int, default=12000)
    args = ap.parse_args(argv)
    budget = BUDGETS["cpu"]
    budget.eval_every = max(100, args.steps // 8)
    corpus = args.work / "corpus"
    if not done(corpus):
        prepare_corpus([SHARED / "wikipedia_ko_wikiextractor"], corpus,
                       CorpusConfig(workers=2, holdout=0.05, progress=False))
    held_out = [s for p in corpus_shards(corpus, "holdout") for doc in read_arrow(p).column("sentences").to_pylist()
                for s in doc]
    rows = []
    for mode in MODES:
        tok_dir, inst = args.work / f"tok-{mode}", args.work / f"inst-{mode}"
        if not done(tok_dir):
            say(f"train-tokenizer --pretokenize {mode}")
            train_tokenizer(corpus, tok_dir, TokenizerConfig(vocab_size=args.vocab_size, pretokenize=mode,
                                                            progress=False))
        if not done(inst):
            make_instances(corpus, tok_dir, inst, InstancesConfig(max_seq_length=128, mode="dynamic", dupe=1,
                                                                  workers=2), progress=False)
        run = args.work / f"run-{mode}"
        export_dir = pretrain_run(inst, run, budget, args.steps, "cpu")
        masked = masked_only_accuracy(export_dir, inst)
        stats = read_tokenizer_manifest(tok_dir).stats
        tok = load_tokenizer(tok_dir)
        c = curves(run)
        rows.append({"pretokenize": mode, "unk_word_rate": stats["unk_word_rate"],
                     "pieces_per_word": stats["pieces_per_word"],
                     "crossing_share_mecab": crossing_share(tok, held_out, "mecab")["crossing_share"],
                     "crossing_share_kiwi": crossing_share(tok, held_out, "kiwi")["crossing_share"],
                     "eval_mlm_acc": c["eval_mlm_acc"][-1], "eval_nsp_acc": c["eval_nsp_acc"][-1], **masked,
                     "fill_mask": fill_mask(export_dir, KO_FILL_MASK),
                     "curve": c, "held_out_sentences": stats["sentences"]})
    print(f"\n{'pretokenize':12} {'[UNK]/word':>10} {'pieces/word':>11} {'cross (mecab)':>13} {'cross (kiwi)':>12} "
          f"{'MLM acc':>8} {'[MASK] acc':>10} {'unigram':>8} {'NSP acc':>8}")
    for r in rows:
        print(f"{r['pretokenize']:12} {100 * r['unk_word_rate']:9.3f}% {r['pieces_per_word']:11.3f} "
              f"{100 * r['crossing_share_mecab']:12.1f}% {100 * r['crossing_share_kiwi']:11.1f}% "
              f"{100 * r['eval_mlm_acc']:7.1f}% {100 * r['masked_only_acc']:9.1f}% {100 * r['unigram_acc']:7.1f}% "
              f"{100 * r['eval_nsp_acc']:7.1f}%")
    for r in rows:
        for ex in r["fill_mask"]:
            print(f"{r['pretokenize']:6} {ex['text']}  ->  {ex['top5'][0]}")
    write_result("korean_vocab", {**run_info("korean_vocab"), "steps": args.steps, "vocab_size": args.vocab_size,
                                  "preset": budget.preset, "rows": rows})


if __name__ == "__main__":
    main()
