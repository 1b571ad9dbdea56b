"""--near-dedup and --decontaminate together: one pass over each part's kept sentences finds their words once and
writes both steps' task files (a part's band hashes and its evaluation matches, each with its record, the bytes each
step's own task writes), so that run_near_dedup and run_decontamination find them done. Alone, each step reads the
parts itself."""
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa

from bertkit.fileio import make_folder
from bertkit.formats import CorpusColumns as C
from bertkit.pipelines import decontaminate as decon, near_dedup as near
from bertkit.pipelines.engine import Engine
from bertkit.pipelines.words import batch_words


def both_task(part: str, settings: dict, evaluation: str, signatures_out: str, matches_out: str) -> dict:
    """Task: a part's band hashes and evaluation matches from one finding of its sentences' words."""
    s = near.NearDedupSettings(**settings)
    a, b = near.hash_functions(s)
    ngrams = decon.EvalLookup(evaluation)
    bands, matches, row0 = [], [], 0
    with pa.memory_map(part, "r") as source:
        for batch in pa.ipc.open_stream(source):
            docs = batch.column(C.SENTENCES).to_pylist()
            found = batch_words([s for d in docs for s in d])
            document = np.repeat(np.arange(len(docs)), [len(d) for d in docs])[found.text]   # each word's
            bands.append(near.word_band_hashes(found.hashes, document, len(docs), a, b, s))
            matches.append(decon.word_matches(found, docs, ngrams, row0))
            row0 += len(docs)
    near.write_signatures(signatures_out, bands, s)
    return decon.write_matches(matches_out, matches, row0)


def run_both(engine: Engine, parts: list[Path], settings: "near.NearDedupSettings", ev: "decon.EvalNgrams",
             work: Path) -> None:
    """The parts whose signatures or matches are not yet written (a killed run's finished ones kept), in one pass."""
    make_folder(work / "near-dedup")
    make_folder(work / "decontaminate")
    evaluation = work / "decontaminate" / "evaluation.npz"
    decon.save_evaluation(ev, evaluation)
    todo = [(str(p), asdict(settings), str(evaluation), str(s), str(m))
            for p, s, m in zip(parts, near.signature_files(work, len(parts)), decon.match_files(work, len(parts)))
            if not (near.signatures_done(s, settings) and decon.matches_done(m))]
    list(engine.map(both_task, todo))
