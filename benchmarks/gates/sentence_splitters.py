"""Compare sentence splitters (sentencex, blingfire) on the Wikipedia samples: speed and error proxies.

Quality has no gold standard on these samples, so we count two kinds of likely errors over every paragraph:
  missed splits  a produced sentence still holds a boundary the splitter should have seen (also counted only in
                 sentences without quotation marks: sentencex keeps quoted speech whole on purpose):
                 en  '[a-z0-9)"]{2}[.!?] [A-Z][a-z]'  (lower-case word, end mark, capitalised next word)
                 ko  '(다|요)[.!?] \\S'                 (Korean declarative/polite ending, end mark, more text)
  false splits   a produced sentence ends on a known abbreviation or an initial ('Dr.', 'U.S.', 'J.', 'e.g.')
                 or is shorter than 3 characters.
plus a small hand-written gold set with exact boundaries (accuracy = passages segmented exactly right).
Usage: python benchmarks/gates/sentence_splitters.py [SHARED_DATA]   (writes benchmarks/results/sentence_splitters.json)
"""
import glob
import re
import sys
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from benchlib import SHARED
from record import run_info, write_result
from sentencex import segment

try:  # only this comparison needs it: pip install blingfire
    import blingfire
except ImportError:
    blingfire = None

DATA = Path(sys.argv[1]) if len(sys.argv) > 1 else SHARED

MISSED = {"en": re.compile(r"[a-z0-9)\"]{2}[.!?] [A-Z][a-z]"), "ko": re.compile(r"(다|요)[.!?] \S")}
QUOTES = re.compile("[\"“”‘’「」『』]")
ABBREV = re.compile(r"(\b(Dr|Mr|Mrs|Ms|St|Jr|Sr|Prof|Gen|Col|Lt|Mt|vs|etc|e\.g|i\.e|U\.S|U\.K|No|Vol|pp|ca|c)\."
                    r"|\b[A-Z]\.)$")

GOLD = {
    "en": [
        ["Dr. Smith went to Washington.", "He arrived at 3 p.m. on Monday."],
        ["The U.S. Army was founded in 1775.", "It is the oldest branch."],
        ["J. R. R. Tolkien wrote The Hobbit.", "It was published in 1937."],
        ["Prices rose 3.5% in 2008.", "Analysts were surprised!"],
        ["Was it Mt. Everest?", "No, it was K2."],
        ["He said \"Stop.\"", "Then he left."],
        ["The ship sailed at approx. noon.", "Nobody noticed."],
        ["See e.g. the work of Smith et al. on this topic.", "It is thorough."],
        ["Albert Einstein (1879–1955) was a physicist.", "He developed relativity."],
        ["Version 2.0 was released.", "Users upgraded quickly."],
        ["St. Louis is in Missouri.", "Kansas City is too."],
        ["The population was 1,234 at the 2010 census.", "The town is small."],
    ],
    "ko": [
        ["지미 카터는 조지아주에서 태어났다.", "그 후 해군에 들어갔다."],
        ["1953년 미국 해군 대위로 예편하였다.", "1962년 조지아주 상원 의원 선거에 출마했다."],
        ["서울은 대한민국의 수도이다.", "인구는 약 950만 명이다."],
        ["그는 \"안녕하세요.\"라고 말했다.", "모두 웃었다."],
        ["이 책은 2.5판이다.", "내용이 많이 바뀌었다."],
        ["정말 그럴까요?", "아무도 모른다."],
        ["U.S. 스틸은 미국 기업이다.", "본사는 피츠버그에 있다."],
        ["한글은 1443년에 창제되었다.", "세종대왕이 만들었다!"],
        ["그는 Dr. Kim을 만났다.", "둘은 오래 이야기했다."],
        ["가격은 3.14달러였다.", "싸지 않았다."],
    ],
}


def split_sentencex(lang):
    return lambda text: [s.strip() for s in segment(lang, text) if s.strip()]


def split_blingfire(lang):
    return lambda text: [s for s in blingfire.text_to_sentences(text).split("\n") if s.strip()]


def paragraphs(lang):
    out = []
    for path in sorted(glob.glob(str(DATA / f"wikipedia_{lang}_wikiextractor/text/AA/wiki_*"))):
        for line in open(path, encoding="utf-8"):
            line = line.strip()
            if line and not line.startswith("<") and len(line) > 40:
                out.append(line)
    return out


def evaluate(lang, name, split, paras):
    t = time.perf_counter()
    results = [split(p) for p in paras]
    seconds = time.perf_counter() - t
    mb = sum(len(p.encode()) for p in paras) / 1e6
    sents = [s for r in results for s in r]
    missed = sum(len(MISSED[lang].findall(s)) for s in sents)
    # sentencex deliberately keeps quoted speech whole; count misses outside quotes separately
    unquoted = sum(len(MISSED[lang].findall(s)) for s in sents if not QUOTES.search(s))
    false = sum(1 for s in sents if ABBREV.search(s) or len(s) < 3)
    gold_ok = sum(split(" ".join(g)) == g for g in GOLD[lang])
    return {"language": lang, "splitter": name, "paragraphs": len(paras), "mb": round(mb, 2),
            "seconds": round(seconds, 2), "mb_per_s": round(mb / seconds, 2), "sentences": len(sents),
            "missed_splits": missed, "false_splits": false,
            "missed_per_1k": round(1000 * missed / len(sents), 2),
            "missed_unquoted_per_1k": round(1000 * unquoted / len(sents), 2),
            "false_per_1k": round(1000 * false / len(sents), 2),
            "gold_exact": f"{gold_ok}/{len(GOLD[lang])}"}


def main():
    if blingfire is None:
        print("blingfire is not installed (pip install blingfire): measuring sentencex alone")
    rows = []
    for lang in ("en", "ko"):
        paras = paragraphs(lang)
        splitters = [("sentencex", split_sentencex)] + ([("blingfire", split_blingfire)] if blingfire else [])
        for name, make in splitters:
            rows.append(evaluate(lang, name, make(lang), paras))
            r = rows[-1]
            print(f"{lang} {name:10s} {r['mb_per_s']:7.2f} MB/s  sentences {r['sentences']:7d}  "
                  f"missed/1k {r['missed_per_1k']:6.2f} (unquoted {r['missed_unquoted_per_1k']:6.2f})  "
                  f"false/1k {r['false_per_1k']:6.2f}  gold {r['gold_exact']}")
    write_result("sentence_splitters", {**run_info("sentence_splitters"), "results": rows})


if __name__ == "__main__":
    main()
