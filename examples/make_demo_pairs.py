"""Write a small classification set from a prepare-corpus folder, for the demo's fine-tune.

Every sentence appears twice: as it is ("original") and with its words in random order ("shuffled"); a small
word-order (CoLA-like acceptability) task that needs no download and that a short fine-tune learns. Dev
sentences are held out whole, so neither version of a dev sentence is seen in training.
Usage: python examples/make_demo_pairs.py CORPUS_DIR OUT_DIR [MAX_SENTENCES (default 2000)]
"""
import csv
import random
import sys
from pathlib import Path

from bertkit.fileio import read_arrow
from bertkit.formats import corpus_shards


def main(corpus_dir: str, out_dir: str, max_sentences: int = 2000, seed: int = 7, dev_fraction: float = 0.2) -> None:
    sentences = []
    for split in ("train", "holdout"):
        for shard in corpus_shards(corpus_dir, split):
            for doc in read_arrow(shard).column("sentences").to_pylist():
                sentences += [s for s in doc if 4 <= len(s.split()) <= 40]
    rng = random.Random(seed)
    rng.shuffle(sentences)
    sentences = sentences[: int(max_sentences)]
    n_dev = int(len(sentences) * dev_fraction)

    def labelled(part):
        rows = []
        for sentence in part:
            words = sentence.split()
            shuffled = words[:]
            while shuffled == words:
                rng.shuffle(shuffled)
            rows += [(sentence, "original"), (" ".join(shuffled), "shuffled")]
        rng.shuffle(rows)
        return rows

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("dev.tsv", labelled(sentences[:n_dev])), ("train.tsv", labelled(sentences[n_dev:]))):
        with open(out / name, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, delimiter="\t")
            writer.writerow(["sentence", "label"])
            writer.writerows(part)
    print(f"wrote {2 * (len(sentences) - n_dev)} training and {2 * n_dev} dev rows to {out}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
