"""A planted corpus: real documents with near-duplicates of known Jaccard planted among them, written as JSON lines
whose `title` names each document's part in the plan, and the truth beside it. The data-quality steps are measured
on it (benchmarks/studies/data_quality.py) and tested on a small one (tests/test_near_dedup.py).

The Jaccard recorded is computed here, independently of bertkit's MinHash: Python sets of word 5-gram tuples after
the same normalisation the near-duplicate step states (lower case, digits as 0, punctuation as spaces)."""
import json
import random
import re
from pathlib import Path

from bertkit.fileio import atomic_write_bytes, atomic_write_json

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


def planted_corpus(out: Path, sources: dict, per_language: int, share: float = 0.3, seed: int = 0,
                   personal: int = 0, benign: int = 0, passages: list[str] = (), junk_documents: int = 0) -> dict:
    """out/corpus.jsonl ({"title", "text"}: originals and planted variants in a seeded order) and out/truth.json
    ({title: {"kind", "of", "jaccard", "language"}}). sources: {language: WikiExtractor folder}. With `personal`,
    `benign` or `passages`, that many made-up personal data, benign numbers and the given evaluation passages are
    put into documents that have no variant, listed in out/plants.json ({"personal": [[title, kind, text]],
    "benign": [[title, text]], "passages": [[title, text]]})."""
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
    plants = _plant_extras(rows, truth, rng, personal, benign, list(passages))
    pool = [w for r in rows[:50] for w in r["text"].split(" ") if w.isalpha()] or ["word"]
    for i in range(junk_documents):   # documents of their own: truth kind "junk:KIND"
        kind, text = junk(rng, pool)
        rows.append({"title": f"junk-{i:05d}", "text": text})
        truth[f"junk-{i:05d}"] = {"kind": f"junk:{kind}", "of": None, "jaccard": None, "language": None}
    rng.shuffle(rows)   # a crawl's order: a variant may come before its original
    atomic_write_bytes(out / "corpus.jsonl", "".join(json.dumps(row, ensure_ascii=False) + "\n"
                                                     for row in rows).encode("utf-8"))
    atomic_write_json(out / "truth.json", truth)
    atomic_write_json(out / "plants.json", plants)
    return truth


def _plant_extras(rows: list, truth: dict, rng: random.Random, personal: int, benign: int, passages: list) -> dict:
    with_variant = {v["of"] for v in truth.values() if v["of"]}
    hosts = [r for r in rows if truth[r["title"]]["kind"] == "original" and r["title"] not in with_variant]
    plants = {"personal": [], "benign": [], "passages": []}
    if not hosts:
        return plants
    texts = [r["text"] for r in hosts]
    for name, pieces, template in (
            ("personal", [personal_data(rng) for _ in range(personal)], "연락처: {}."),
            ("benign", [(None, benign_number(rng)) for _ in range(benign)], "기준: {}."),
            ("passages", [(None, p) for p in passages], "{}")):
        for (kind, piece), i in zip(pieces, plant_in(texts, [piece for _, piece in pieces], rng, template)):
            plants[name].append([hosts[i]["title"], kind, piece] if kind else [hosts[i]["title"], piece])
    for r, text in zip(hosts, texts):
        r["text"] = text
    return plants


def plant_scores(plants: dict, kept: dict) -> dict:
    """kept: {title: text of the document as the corpus holds it}. Personal data left (its text still there),
    benign numbers kept (still there), evaluation passages left (a 13-word stretch of one still there)."""
    def has_stretch(text: str, passage: str) -> bool:
        w, words_of_text = words(passage), " ".join(words(text))
        return any(" ".join(w[i:i + 13]) in words_of_text for i in range(max(1, len(w) - 12)))

    left = [p for p in plants["personal"] if p[2] in kept.get(p[0], "")]
    return {"personal": len(plants["personal"]), "personal_left": len(left), "personal_left_examples": left[:5],
            "benign": len(plants["benign"]),
            "benign_kept": sum(1 for title, text in plants["benign"] if text in kept.get(title, "")),
            "passages": len(plants["passages"]),
            "passages_left": sum(1 for title, text in plants["passages"] if has_stretch(kept.get(title, ""), text))}


def junk_scores(truth: dict, kept_titles: set) -> dict:
    """Junk documents gone, and real documents kept: the originals without a planted variant (no deduplication
    may take them)."""
    junk_titles = [t for t, v in truth.items() if v["kind"].startswith("junk:")]
    with_variant = {v["of"] for v in truth.values() if v["of"]}
    real = [t for t, v in truth.items() if v["kind"] == "original" and t not in with_variant]
    return {"junk": len(junk_titles), "junk_gone": sum(1 for t in junk_titles if t not in kept_titles),
            "real": len(real), "real_kept": sum(1 for t in real if t in kept_titles)}


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


def personal_data(rng: random.Random) -> tuple[str, str]:
    """(kind, a made-up personal datum as people write them): Korean phones in their usual shapes, e-mails, IPs,
    resident registration numbers of real dates, Luhn-valid card numbers."""
    kind = rng.choice(("phone", "phone", "email", "ip", "rrn", "card"))
    d = lambda n: "".join(str(rng.randrange(10)) for _ in range(n))  # noqa: E731
    if kind == "phone":
        return kind, rng.choice((f"010-{d(4)}-{d(4)}", f"010 {d(4)} {d(4)}", f"010{d(8)}", f"02-{d(3)}-{d(4)}",
                                 f"031-{d(3)}-{d(4)}", f"+82 10 {d(4)} {d(4)}", f"+82-2-{d(3)}-{d(4)}"))
    if kind == "email":
        user = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(4, 9)))
        host = rng.choice(("naver.com", "gmail.com", "daum.net", "korea.ac.kr"))
        return kind, f"{user}{rng.choice(('', '.kim', '_lee', '91'))}@{host}"
    if kind == "ip":
        return kind, ".".join(str(rng.randrange(1, 255)) for _ in range(4))
    if kind == "rrn":
        return kind, f"{rng.randrange(60, 100):02d}{rng.randrange(1, 13):02d}{rng.randrange(1, 29):02d}-" \
                     f"{rng.choice('12')}{d(6)}"
    digits = [rng.randrange(10) for _ in range(14)]   # 4, 14 digits, a check digit: 16
    for check in range(10):
        number = "4" + "".join(map(str, digits)) + str(check)
        total = sum((int(c) * 2 - 9 if int(c) * 2 > 9 else int(c) * 2) if i % 2 else int(c)
                    for i, c in enumerate(reversed(number)))
        if total % 10 == 0:
            return kind, " ".join(number[i:i + 4] for i in range(0, 16, 4))
    raise AssertionError("a check digit always exists")


def benign_number(rng: random.Random) -> str:
    """Numbers that are not personal data: dates, ISBNs, prices, versions, years, percentages."""
    return rng.choice((f"{rng.randrange(1950, 2025)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}",
                       f"{rng.randrange(1950, 2025)}.{rng.randrange(1, 13):02d}.{rng.randrange(1, 29):02d}.",
                       "ISBN 978-89-7282-985-9", "ISBN 89-7282-985-3",
                       f"{rng.randrange(1, 999):,}{rng.choice((',000원', '달러'))}",
                       f"버전 {rng.randrange(1, 9)}.{rng.randrange(0, 20)}.{rng.randrange(0, 9)}",
                       f"{rng.randrange(1900, 2000)}–{rng.randrange(2000, 2025)}",
                       f"{rng.randrange(1, 100)}.{rng.randrange(10)}%",
                       f"인구 {rng.randrange(1000, 99999):,}명"))


def junk(rng: random.Random, pool: list[str]) -> tuple[str, str]:
    """(kind, a junk document of the kinds crawls hold): keyword lists, ㅋㅋㅋ-only comments, navigation menus,
    lorem ipsum, number tables, one line repeated."""
    kind = rng.choice(("keywords", "laughter", "menu", "lorem", "numbers", "repeated"))
    if kind == "keywords":
        words = rng.sample(pool, 6)
        return kind, " ".join(rng.choice(words) for _ in range(rng.randint(80, 200)))
    if kind == "laughter":
        return kind, "\n".join(" ".join("ㅋ" * rng.randint(2, 9) for _ in range(rng.randint(1, 4)))
                               for _ in range(rng.randint(5, 20)))
    if kind == "menu":
        items = ["홈", "뉴스", "스포츠", "연예", "로그인", "회원가입", "고객센터", "이용약관", "Home", "About",
                 "Contact"]
        return kind, "\n".join(rng.choice(items) for _ in range(rng.randint(30, 80)))
    if kind == "lorem":
        return kind, ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut "
                      "labore et dolore magna aliqua. ") * rng.randint(5, 15)
    if kind == "numbers":
        rows = rng.randint(20, 60)
        return kind, "\n".join(" ".join(str(rng.randrange(10_000)) for _ in range(8)) for _ in range(rows))
    line = " ".join(rng.sample(pool, 8)) + "."
    return kind, "\n".join([line] * rng.randint(10, 30))


def plant_in(documents: list[str], pieces: list[str], rng: random.Random, template: str) -> list[int]:
    """Each piece put into a seeded document, at a sentence end, inside `template` ("{}"); the documents' indices."""
    at = []
    for piece in pieces:
        i = rng.randrange(len(documents))
        cut = documents[i].find(". ", rng.randrange(max(1, len(documents[i]) // 2)))
        cut = cut + 2 if cut >= 0 else len(documents[i])
        documents[i] = documents[i][:cut] + template.format(piece) + " " + documents[i][cut:]
        at.append(i)
    return at
