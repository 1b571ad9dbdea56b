""""My loss is stuck at 7": the unigram plateau, named. A model that has learnt only which tokens are frequent guesses
the most frequent one at every [MASK]; its held-out [MASK] accuracy sits at that token's share. When a run is still
there a quarter of the way in, the log says so once, with what usually moves it."""
from collections import Counter
from dataclasses import dataclass

MARGIN = 0.02          # within two points of the baseline counts as on the plateau
FROM_PROGRESS = 0.25   # say nothing before a quarter of the run (every run starts on it)


@dataclass
class Plateau:
    baseline: float    # the accuracy of always guessing `token` at the held-out masked positions
    token: str
    said: bool = False

    @classmethod
    def measure(cls, holdout, rows: int = 512) -> "Plateau | None":
        """From the labels of the first held-out rows (what the evaluation predicts)."""
        labels = Counter()
        for i in range(min(rows, len(holdout))):
            labels.update(int(t) for t in holdout[(0, i)]["mlm_labels"] if t >= 0)
        if not labels:
            return None
        token_id, count = labels.most_common(1)[0]
        from bertkit.tokenization import TokenizerError, load_tokenizer, token_text

        try:   # as a person reads it (a byte-level BPE's bytes as text)
            token = token_text(load_tokenizer(holdout.dir), token_id)
        except TokenizerError:
            token = None
        return cls(count / sum(labels.values()), token or f"id {token_id}")

    def check(self, ev: dict, step: int, progress: float) -> str | None:
        """The message, once, when the held-out [MASK] accuracy is still within MARGIN of the baseline."""
        acc = ev.get("eval_mlm_mask_acc", ev.get("eval_mlm_acc"))
        if self.said or acc is None or progress < FROM_PROGRESS or acc > self.baseline + MARGIN:
            return None
        self.said = True
        return (f"note: held-out [MASK] accuracy {100 * acc:.1f} % at step {step} is not above the unigram baseline "
                f"({100 * self.baseline:.1f} %, always guessing '{self.token}'): the model has not left the plateau. "
                "What usually moves it: a learning rate and batch that fit the model size (tiny models take 1e-3), "
                "more steps, a corpus without repeated lines (prepare-corpus removes exact duplicates; see its "
                "manifest), sequences long enough for the objective; on a small budget `--recipe budget` (MLM only, "
                "no dropout, 64 tokens) leaves it within minutes (docs/studies/2026-11-24-budget.md)")
