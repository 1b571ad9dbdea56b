"""Every Arrow schema bertkit writes, in one place. README.md "File formats" documents them for users.

All files are Arrow IPC *files* (not streams) so they can be memory-mapped; each folder has a manifest.json.
"""
import pyarrow as pa

# prepare-corpus: DIR/shard-00000.arrow (training) and DIR/holdout-00000.arrow (held-out split).
CORPUS_SCHEMA = pa.schema([
    pa.field("id", pa.string(), nullable=False),        # stable document id: sha1 of the cleaned text, 16 hex chars
    pa.field("source", pa.string(), nullable=False),    # input file, relative to the input root it was found under
    pa.field("title", pa.string(), nullable=True),      # WikiExtractor title, else null
    pa.field("sentences", pa.list_(pa.string()), nullable=False),
])


def id_type(vocab_size: int) -> pa.DataType:
    """Token ids are stored as uint16 when the vocabulary fits, else int32."""
    return pa.uint16() if vocab_size <= 65536 else pa.int32()


def instance_schema(vocab_size: int, masked: bool) -> pa.Schema:
    """make-instances: DIR/instances-00000.arrow (and holdout-00000.arrow); unpadded rows.

    input_ids            [CLS] A [SEP] B [SEP], with masking applied when masked (static mode)
    b_start              index of B's first token: token_type_ids = 1 from there on, 0 before
    next_sentence_label  0 = B follows A (IsNext), 1 = B is random (NotNext): HF's next_sentence_label convention
    masked_positions     (static only) positions that were selected, ascending
    masked_ids           (static only) the original ids at those positions: the MLM labels
    """
    ids = id_type(vocab_size)
    fields = [
        pa.field("input_ids", pa.list_(ids), nullable=False),
        pa.field("b_start", pa.uint16(), nullable=False),
        pa.field("next_sentence_label", pa.int8(), nullable=False),
    ]
    if masked:
        fields += [
            pa.field("masked_positions", pa.list_(pa.uint16()), nullable=False),
            pa.field("masked_ids", pa.list_(ids), nullable=False),
        ]
    return pa.schema(fields)
