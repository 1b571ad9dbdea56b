"""Sentence embeddings: a model folder trained as a bi-encoder on pairs (in-batch negatives, gradient caching) or on
plain text (unsupervised SimCSE), scored on STS and retrieval, saved as a sentence-transformers folder."""

# the training flags' ranges, read by EmbedConfig.check and the CLI (here: no torch import for `bertkit --help`);
# beyond them training only makes NaN (the similarities times 1/temperature must stay finite in fp32 and bf16)
TEMPERATURE, WEIGHT_DECAY, LEARNING_RATE, SEED = (1e-3, 100.0), (0.0, 1.0), (1e-9, 1.0), (0, 2 ** 32 - 1)
