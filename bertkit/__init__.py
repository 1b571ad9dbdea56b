"""bertkit: pretrain and fine-tune BERT-family encoders on your own corpus."""
__version__ = "0.1.0"
