"""The README.md an export carries: the Hub's metadata header, then what a reader deciding whether to use the model
needs (data, vocabulary, training, held-out score, how to load it, its limits), from the run's own records. No path
of the machine that trained it appears."""
import unicodedata
from pathlib import Path

from bertkit.formats import FormatError, read_corpus_manifest, read_instances_manifest, read_tokenizer_manifest
from bertkit.runlog import read_metrics

SCRIPTS = {"HANGUL": "ko", "LATIN": "en", "HIRAGANA": "ja", "KATAKANA": "ja", "CJK": "zh", "CYRILLIC": "ru",
           "ARABIC": "ar", "DEVANAGARI": "hi", "THAI": "th", "GREEK": "el", "HEBREW": "he"}


def languages(vocab: list[str], at_least: float = 0.1) -> list[str]:
    """Languages guessed from the scripts of the vocabulary's pieces: each script holding at least `at_least` of
    the pieces' letters (Latin read as English, the common case; Han beside kana as Japanese)."""
    counts: dict[str, int] = {}
    for piece in vocab:
        if piece.startswith("[") and piece.endswith("]"):
            continue
        for ch in piece.removeprefix("##"):
            if ch.isalpha():
                script = unicodedata.name(ch, "").split(" ")[0]
                counts[script] = counts.get(script, 0) + 1
    total = sum(counts.values()) or 1
    common = sorted(counts.items(), key=lambda kv: -kv[1])
    found = [SCRIPTS[s] for s, n in common if s in SCRIPTS and n / total >= at_least]
    if "ja" in found and "zh" in found:
        found.remove("zh")
    return list(dict.fromkeys(found))


def training_facts(run, records: list[dict]) -> dict:
    """Steps, time, tokens seen (the log's rates over its records: an estimate) and the last held-out scores."""
    train = [r for r in records if "loss" in r and "tokens_per_s" in r]
    held = [r for r in records if "eval_loss" in r]
    facts = {"steps": train[-1]["step"] if train else 0, "hours": train[-1]["elapsed_s"] / 3600 if train else 0.0}
    if train:
        per_sequence = sum(r["tokens_per_s"] / r["seq_per_s"] for r in train) / len(train)
        resolved = run.resolved
        if run.pretrain.get("token_budget"):
            efficiency = sum(r.get("padding_efficiency", 1.0) for r in train) / len(train)
            per_step = run.pretrain["token_budget"] * run.world_size * resolved.get("grad_accum", 1) * efficiency
        else:
            per_step = resolved["global_batch"] * per_sequence
        facts["tokens"] = int(per_step * facts["steps"])
    if held:
        last = held[-1]
        facts["held_out"] = {"step": last["step"], "loss": last["eval_loss"],
                             "accuracy": last.get("eval_mlm_mask_acc", last.get("eval_mlm_acc"))}
    facts["plateau"] = next((r["plateau"] for r in records if "plateau" in r), None)
    return facts


def data_facts(run) -> dict:
    """What the instances and (when still there) the corpus and tokenizer manifests say; absent parts are None."""
    facts = {"max_seq_length": run.max_seq_length, "vocab_size": run.vocab_size, "corpus": None, "tokenizer": None}
    try:
        instances = read_instances_manifest(run.instances)
        facts["masked_lm_prob"] = instances.masking.masked_lm_prob
        if instances.corpus:
            facts["corpus"] = read_corpus_manifest(instances.corpus).totals
        if instances.tokenizer:
            manifest = read_tokenizer_manifest(instances.tokenizer)
            facts["tokenizer"] = {"pretokenize": manifest.settings.get("pretokenize"), "stats": manifest.stats}
    except (FormatError, OSError, TypeError, AttributeError):
        pass   # a run whose inputs were moved or removed: the card says less
    return facts


def model_card(run_dir, run, config: dict, tag: str, random_seed: int | None) -> str:
    """README.md for an export of run_dir at checkpoint `tag` (or its random start): config is the exported
    config.json; the vocabulary is the run's."""
    vocab_file = Path(run_dir) / "tokenizer" / "vocab.txt"
    vocab = vocab_file.read_text(encoding="utf-8").splitlines() if vocab_file.is_file() else []
    langs = languages(vocab)
    train, data = training_facts(run, read_metrics(run_dir)), data_facts(run)
    family = {"bert": "BERT", "modernbert": "ModernBERT", "electra": "ELECTRA", "megatron-bert": "BERT (pre-LN)",
              "roberta": "RoBERTa"}.get(config.get("model_type"), config.get("model_type", "BERT"))
    tags = ["bertkit", config.get("model_type", "bert")] + (["random-weights"] if random_seed is not None else [])
    header = ["---", f"language: [{', '.join(langs)}]", "library_name: transformers", "pipeline_tag: fill-mask",
              f"tags: [{', '.join(tags)}]", "---", ""]
    name = "random start" if random_seed is not None else "pretrained"
    lines = [f"# A {family} encoder {name} with bertkit", ""]
    if random_seed is not None:
        lines += [f"**Untrained**: the run's architecture and tokenizer with the weights it began from (seed "
                  f"{random_seed}). It exists to be fine-tuned beside the pretrained export, so that what "
                  "pretraining bought can be measured; it knows nothing of any language.", ""]
    lines += _model_section(config, data, langs) + _training_section(run, train, data, tag, random_seed)
    lines += _use_section(family, run.objective) + _limits_section(train, data, random_seed)
    return "\n".join(header + lines) + "\n"


def _model_section(config: dict, data: dict, langs: list[str]) -> list[str]:
    size = (f"{config.get('num_hidden_layers')} layers, hidden size {config.get('hidden_size')}, "
            f"{config.get('num_attention_heads')} attention heads")
    out = ["## Model", "", f"- {config.get('architectures', ['?'])[0]} ({size})",
           f"- vocabulary: {data['vocab_size']:,} WordPiece tokens" + (
               f", morpheme-aware ({data['tokenizer']['pretokenize']})"
               if data["tokenizer"] and data["tokenizer"]["pretokenize"] not in (None, "none") else ""),
           f"- languages (from the vocabulary's scripts): {', '.join(langs) or 'not known'}"]
    stats = (data["tokenizer"] or {}).get("stats") or {}
    if "unk_word_rate" in stats:
        out.append(f"- held-out text: {100 * stats['unk_word_rate']:.2f} % of words [UNK]"
                   + (f", {stats['pieces_per_word']:.2f} pieces per word" if "pieces_per_word" in stats else ""))
    return out + [""]


def _training_section(run, train: dict, data: dict, tag: str, random_seed: int | None) -> list[str]:
    corpus = data["corpus"]
    out = ["## Training", ""]
    if corpus:
        out.append(f"- corpus: {corpus.get('documents', 0):,} documents, {corpus.get('sentences', 0):,} sentences, "
                   f"{corpus.get('text_bytes', 0) / 1e6:,.1f} MB of text")
    out.append("- objective: masked language modelling" + (
        f" at {100 * data['masked_lm_prob']:g} %" if data.get("masked_lm_prob") else "") + (
        "" if run.objective == "none" else f" and {run.objective.upper()}"))
    out.append(f"- sequence length: {data['max_seq_length']} tokens (the longest seen in training)")
    if random_seed is None:
        tokens = f", about {_count(train['tokens'])} tokens seen" if train.get("tokens") else ""
        out.append(f"- {train['steps']:,} steps ({tag}){tokens} in {train['hours']:.2f} h on {_hardware(run)}, "
                   f"optimizer {run.resolved.get('optimizer')}, peak learning rate {run.resolved.get('lr')}")
        held = train.get("held_out")
        out.append(f"- held-out masked-token accuracy {100 * held['accuracy']:.1f} % (loss {held['loss']:.3f}) at "
                   f"step {held['step']}" if held and held["accuracy"] is not None else
                   "- no held-out score was measured")
    out.append("- fine-tuning results: none recorded with this export; `bertkit finetune` scores it")
    return out + [""]


def _count(n: float) -> str:
    return f"{n / 1e9:,.2f} B" if n >= 1e9 else f"{n / 1e6:,.1f} M" if n >= 1e6 else f"{int(n):,}"


def _hardware(run) -> str:
    """CPU runs record their threads and cores (bertkit.threads); the others ran on one GPU per process."""
    world, kernels = run.world_size, run.kernels or "torch"
    if run.threads:
        return (f"{world} CPU process{'es' if world > 1 else ''} ({run.threads.get('cores')} cores, "
                f"{kernels} kernels)")
    return f"{world} GPU{'s' if world > 1 else ''} ({kernels} kernels)"


def _use_section(family: str, objective: str) -> list[str]:
    out = ["## How to use it", "", "```python", "from transformers import AutoModelForMaskedLM, AutoTokenizer", "",
           'tokenizer = AutoTokenizer.from_pretrained("THIS_FOLDER")',
           'model = AutoModelForMaskedLM.from_pretrained("THIS_FOLDER")', "```", ""]
    if objective == "none":
        out += ["As a sentence encoder (mean of the last layer; fine-tune it first, e.g. `bertkit finetune embed`):",
                "", "```python", "from sentence_transformers import SentenceTransformer", "",
                'encoder = SentenceTransformer("THIS_FOLDER")', "```", ""]
    return out


def _limits_section(train: dict, data: dict, random_seed: int | None) -> list[str]:
    out = ["## Limits", "",
           f"- It reads at most {data['max_seq_length']} tokens as trained; longer inputs are cut or need fine-tuning "
           "at that length.", "- Its text was not checked for bias, personal data or overlap with evaluation sets "
           "unless the corpus's own record says so."]
    if random_seed is None and train.get("plateau"):
        out.append(f"- Its masked-token accuracy stayed near always guessing {train['plateau']['token']!r} for a "
                   "long part of the run: it may have learnt little beyond word frequency.")
    if random_seed is None and (train.get("tokens") or 0) < 1e9:
        out.append("- It saw under a billion tokens: far less than published encoders (BERT: 128 B). Fine-tune it "
                   "beside its random start (`export --random-weights`) before trusting what pretraining bought.")
    return out + [""]
