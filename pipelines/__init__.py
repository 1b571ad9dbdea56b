"""The data stages: corpus -> Arrow shards -> WordPiece -> MLM/NSP instances."""
