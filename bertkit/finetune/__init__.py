"""Fine-tuning: SQuAD (squad.py), GLUE (glue.py), any classification file (classify.py), CoNLL tagging (ner.py),
the shared loop (train.py) and the official metrics (metrics.py)."""
