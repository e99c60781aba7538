"""Records into shards: the Example, TFRecord framing, parts of shards, the converter processes."""
