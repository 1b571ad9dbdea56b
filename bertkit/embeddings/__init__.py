"""Sentence embeddings: a model folder trained as a bi-encoder on pairs (in-batch negatives, gradient caching) or on
plain text (unsupervised SimCSE), scored on STS and retrieval, saved as a sentence-transformers folder."""
