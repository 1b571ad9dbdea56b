"""A planted corpus: real documents with near-duplicates of known Jaccard planted among them, written as JSON lines
whose `title` names each document's part in the plan, and the truth beside it. The data-quality steps are measured
on it (benchmarks/data_quality.py) and tested on a small one (tests/test_near_dedup.py).

The Jaccard recorded is computed here, independently of bertkit's MinHash: Python sets of word 5-gram tuples after
the same normalisation the near-duplicate step states (lower case, digits as 0, punctuation as spaces)."""
import json
import random
import re
from pathlib import Path

DOC = re.compile(r"<doc [^>]*>\n(.*?)\n</doc>", re.S)
NOT_WORD = re.compile(r"[\W_]+")
HEADERS = {"ko": ["[서울=연합뉴스] 김민수 기자 = ", "ⓒ 한국일보, 무단 전재 및 재배포 금지", "▶ 네이버에서 구독하기",
                  "이 기사는 2024년 3월 5일 오후 2시 30분 처음 게시되었습니다."],
           "en": ["By Staff Reporter | Published March 5, 2024", "Copyright 2024. All rights reserved.",
                  "Subscribe to our newsletter for more stories like this", "Share this article: Facebook Twitter"]}


def words(text: str) -> list[str]:
    return NOT_WORD.sub(" ", re.sub(r"\d", "0", text.lower())).split()


def shingle_set(text: str, n: int = 5) -> set:
    w = words(text)
    if len(w) < n:
        return {tuple(w)} if w else set()
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def true_jaccard(first: str, second: str) -> float:
    a, b = shingle_set(first), shingle_set(second)
    return len(a & b) / len(a | b) if a or b else 1.0


def wiki_documents(folder: Path, count: int, min_words: int = 80) -> list[str]:
    """The first `count` WikiExtractor documents of at least min_words words under folder (files in name order),
    their title lines dropped."""
    out = []
    for path in sorted(p for p in Path(folder).rglob("wiki_*") if p.is_file()):
        for body in DOC.findall(path.read_text(encoding="utf-8")):
            text = body.split("\n", 1)[1].strip() if "\n" in body else ""
            if len(words(text)) >= min_words:
                out.append(text)
                if len(out) == count:
                    return out
    return out


def edited(text: str, share: float, rng: random.Random, pool: list[str]) -> str:
    """Words replaced, deleted or inserted at random places, `share` of the words in all."""
    tokens = text.split(" ")
    for _ in range(max(1, round(share * len(tokens)))):
        i, kind = rng.randrange(len(tokens)), rng.choice(("replace", "delete", "insert"))
        if kind == "replace":
            tokens[i] = rng.choice(pool)
        elif kind == "delete" and len(tokens) > 10:
            del tokens[i]
        else:
            tokens.insert(i, rng.choice(pool))
    return " ".join(tokens)


def variant(text: str, kind: str, language: str, rng: random.Random, pool: list[str]) -> str:
    """A near-duplicate as crawls hold them: `edit` (a share of words changed), `header` (boilerplate lines around
    it), `format` (punctuation, spacing and case changed: the same text to the near-duplicate step), `cut` (the
    last part gone, a repost that stops early)."""
    if kind == "edit":
        return edited(text, rng.choice((0.01, 0.02, 0.03, 0.05, 0.08, 0.12)), rng, pool)
    if kind == "header":
        head, tail = rng.sample(HEADERS[language], 2)
        return f"{head}\n{text}\n{tail}"
    if kind == "format":
        return re.sub(r"[.,]", lambda m: rng.choice(("!", ";", " ,", "...")), text.replace("\n", "\n\n")).upper()
    cut = text.split(" ")
    return " ".join(cut[: int(len(cut) * rng.choice((0.9, 0.8, 0.7)))])


def planted_corpus(out: Path, sources: dict, per_language: int, share: float = 0.3, seed: int = 0) -> dict:
    """out/corpus.jsonl ({"title", "text"}: originals first, then the planted variants in a seeded order) and
    out/truth.json ({title: {"kind", "of", "jaccard", "language"}}). sources: {language: WikiExtractor folder}."""
    rng, rows, truth = random.Random(seed), [], {}
    for language, folder in sources.items():
        documents = wiki_documents(folder, per_language)
        pool = [w for d in documents[:50] for w in d.split(" ")]
        for i, text in enumerate(documents):
            title = f"{language}-{i:05d}"
            rows.append({"title": title, "text": text})
            truth[title] = {"kind": "original", "of": None, "jaccard": None, "language": language}
        planted = []
        for i in rng.sample(range(len(documents)), int(share * len(documents))):
            kind = rng.choice(("edit", "edit", "header", "format", "cut"))
            text = variant(documents[i], kind, language, rng, pool)
            title = f"{language}-{i:05d}-{kind}"
            planted.append({"title": title, "text": text})
            truth[title] = {"kind": kind, "of": f"{language}-{i:05d}",
                            "jaccard": round(true_jaccard(documents[i], text), 4), "language": language}
        rows += planted
    rng.shuffle(rows)   # a crawl's order: a variant may come before its original
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    (out / "truth.json").write_text(json.dumps(truth, ensure_ascii=False, indent=0), encoding="utf-8")
    return truth


def near_dedup_scores(truth: dict, kept_titles: set, at_least: float = 0.8) -> dict:
    """recall: of the planted pairs at `at_least` Jaccard or more, the share left as one document (original or
    variant); lost: originals with no planted variant that were removed (distinct documents lost); and how the pairs
    below the threshold fared (kept both: what a threshold promises)."""
    pairs = [(t, v["of"], v["jaccard"]) for t, v in truth.items() if v["of"]]
    high = [(t, o) for t, o, j in pairs if j >= at_least]
    merged = sum(1 for t, o in high if not (t in kept_titles and o in kept_titles))
    low = [(t, o) for t, o, j in pairs if j < at_least]
    with_variant = {o for _, o, _ in pairs}
    distinct = [t for t, v in truth.items() if v["kind"] == "original" and t not in with_variant]
    lost = [t for t in distinct if t not in kept_titles]
    return {"pairs_at_or_above": len(high), "recall": merged / len(high) if high else None,
            "pairs_below": len(low), "below_both_kept": sum(1 for t, o in low if t in kept_titles and o in kept_titles),
            "distinct": len(distinct), "distinct_lost": len(lost), "lost_examples": lost[:5]}
